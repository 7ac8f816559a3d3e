#!/usr/bin/env bash
# The custom-model example (examples/custom_model) with every technique, against the same run without each:
#   - it learns: the val loss after training is below the val loss before;
#   - optimizer state: exactly 8-bit GaLore's formula (docs/memory.md) over the parameters the example lists,
#     projected where a --galore-targets glob matches a 2-D parameter, 8-bit AdamW on the rest;
#   - checkpointing: the activation bytes at the peak, and the peak itself, are below the run with 'none';
#   - bf16: compute weights are present at the peak, and absent from the fp32 run.
#   custom_model.sh <memtrain_custom_model binary> <scratch dir>
set -euo pipefail
bin=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir"
targets='blocks.*.mixer.*.weight,blocks.*.ffn.*.weight'
rank=8
run() {  # name, extra flags...
  local name=$1; shift
  "$bin" --steps 6 --galore-rank $rank --galore-targets "$targets" --out-dir "$dir/$name" "$@" > "$dir/$name.log" 2>&1 ||
    { echo "run $name failed:"; cat "$dir/$name.log"; exit 1; }
}
run all --print-params
run no_ckpt --checkpointing none
run fp32 --precision fp32

# field <run> <perl expression over $s, the decoded summary.json>
field() { perl -MJSON::PP -e 'local $/; open my $f, "<", $ARGV[0] or die; my $s = decode_json(<$f>); my $v = eval $ARGV[1]; print defined $v ? $v : "null"' "$dir/$1/summary.json" "$2"; }

# Learning.
line=$(grep -E '^custom_model: val loss' "$dir/all.log") || { echo "no val loss line"; cat "$dir/all.log"; exit 1; }
perl -e '$ARGV[0] =~ /val loss ([0-9.eE+-]+) -> ([0-9.eE+-]+)/ or exit 1; exit !($2 < $1)' "$line" ||
  { echo "the val loss did not fall: $line"; exit 1; }

# Optimizer state by formula. 8-bit AdamW: 2n + 8 ceil(n/256) bytes, 8n under 4096 elements. GaLore (std
# projection) on an m x n weight: the base's bytes for r x max(m, n) elements plus a 4 * min(m, n) * r basis.
expected=$(grep '^param ' "$dir/all.log" | perl -e '
  my ($rank, @globs) = @ARGV;
  my @res = map { my $g = quotemeta $_; $g =~ s/\\\*/.*/g; qr/^$g$/ } @globs;
  sub adam8 { my $n = shift; return $n < 4096 ? 8 * $n : 2 * $n + 8 * int(($n + 255) / 256) }
  my $total = 0;
  while (<STDIN>) {
    my ($name, $shape) = /^param (\S+) (.*)$/ or next;
    $shape =~ tr/[] //d; my @d = split /,/, $shape;
    my $n = 1; $n *= $_ for @d;
    if (@d == 2 && grep { $name =~ $_ } @res) {
      my ($m, $k) = @d; my ($big, $small) = $m > $k ? ($m, $k) : ($k, $m);
      $total += adam8($rank * $big) + 4 * $small * $rank;
    } else { $total += adam8($n) }
  }
  print $total' "$rank" ${targets//,/ })
actual=$(field all '$s->{optimizer_state_bytes}')
[[ $actual == "$expected" ]] || { echo "optimizer state $actual bytes, the formula gives $expected"; exit 1; }

# Checkpointing lowers the activation bytes at the peak, and the peak.
act_all=$(field all '$s->{peak_bytes_by_category}{activations}') act_none=$(field no_ckpt '$s->{peak_bytes_by_category}{activations}')
peak_all=$(field all '$s->{peak_bytes_total}') peak_none=$(field no_ckpt '$s->{peak_bytes_total}')
(( act_all < act_none && peak_all < peak_none )) ||
  { echo "checkpointing did not lower memory: activations $act_all vs $act_none, peak $peak_all vs $peak_none"; exit 1; }

# bf16 keeps compute copies of the weights; fp32 has none.
cw_all=$(field all '$s->{peak_bytes_by_category}{compute_weights} // 0') cw_fp32=$(field fp32 '$s->{peak_bytes_by_category}{compute_weights} // 0')
(( cw_all > 0 && cw_fp32 == 0 )) || { echo "compute weights: bf16 $cw_all, fp32 $cw_fp32 bytes"; exit 1; }
grep -q "compute_weights" "$dir/all.log" || { echo "the memory report does not list compute_weights"; exit 1; }

echo "custom_model: optimizer state $actual B (formula $expected), activations at peak $act_all vs $act_none B (none)," \
     "peak $peak_all vs $peak_none B, compute weights $cw_all B; ok"

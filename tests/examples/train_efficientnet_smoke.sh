#!/usr/bin/env bash
# Smoke test of the train_efficientnet example on a small generated IDX dataset (64 train, 20 test images of
# 28x28, batch 4: 16 steps in three resizing phases 20, 24, 28): it trains, summary.json carries the example's
# own results (test_accuracy in [0, 1], a positive finite test_loss, images_per_second), --plan-only predicts
# without reading data, and a falling --progressive list is refused naming the flag.
#   train_efficientnet_smoke.sh <memtrain_train_efficientnet binary> <scratch dir>
set -euo pipefail
bin=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir/data"
# IDX: magic 0x0000 08 <dims>, big-endian uint32 sizes, then u8 data; image i is a gray level set by its label.
idx() {
  perl -e 'my ($kind, $n) = @ARGV;
    if ($kind eq "images") { print pack("N4", 0x803, $n, 28, 28), map { my $i = $_; pack("C*", map { (($i % 10) * 25 + $_ % 7) % 256 } 0 .. 783) } 0 .. $n - 1 }
    else { print pack("N2", 0x801, $n), pack("C*", map { $_ % 10 } 0 .. $n - 1) }' "$@"
}
idx images 64 > "$dir/data/train-images-idx3-ubyte"
idx labels 64 > "$dir/data/train-labels-idx1-ubyte"
idx images 20 > "$dir/data/t10k-images-idx3-ubyte"
idx labels 20 > "$dir/data/t10k-labels-idx1-ubyte"

"$bin" --data "$dir/data" --epochs 1 --batch 4 --checkpoint full --out-dir "$dir/run" > "$dir/run.log" 2>&1 ||
  { cat "$dir/run.log"; exit 1; }
grep -q "image sides 20 -> 24 -> 28" "$dir/run.log" || { echo "no resizing schedule line"; cat "$dir/run.log"; exit 1; }
summary=$dir/run/summary.json
[[ -s $summary ]] || { echo "missing summary.json"; cat "$dir/run.log"; exit 1; }
value() { perl -ne 'print $1 if /^  "\Q'"$1"'\E": ([-+0-9.eE]+),?$/' "$summary"; }
acc=$(value test_accuracy) loss=$(value test_loss) rate=$(value images_per_second)
[[ -n $acc && -n $loss && -n $rate ]] ||
  { echo "summary.json lacks test_accuracy ($acc), test_loss ($loss) or images_per_second ($rate):"; cat "$summary"; exit 1; }
awk -v a="$acc" -v l="$loss" -v r="$rate" 'BEGIN { exit !(a >= 0 && a <= 1 && l > 0 && l < 1e6 && r > 0) }' ||
  { echo "out of range: test_accuracy $acc, test_loss $loss, images_per_second $rate"; exit 1; }
grep -q "test accuracy" "$dir/run.log" || { echo "no test accuracy line"; cat "$dir/run.log"; exit 1; }

"$bin" --plan-only --batch 4 --summary-json "$dir/plan.json" > "$dir/plan.log" 2>&1 || { cat "$dir/plan.log"; exit 1; }
grep -q '"peak_bytes_total"' "$dir/plan.json" || { echo "plan.json has no prediction"; cat "$dir/plan.log"; exit 1; }

if "$bin" --data "$dir/data" --progressive 24,20 --out-dir "$dir/bad" > "$dir/bad.log" 2>&1; then
  echo "a falling --progressive list was accepted"; exit 1
fi
grep -q -- "--progressive: sizes must rise" "$dir/bad.log" || { echo "unclear refusal:"; cat "$dir/bad.log"; exit 1; }
echo "train_efficientnet smoke: ok"

#!/usr/bin/env bash
# The train_gpt example split over 2 tensor-parallel ranks under mpirun: it trains, its final train and val losses
# are the run alone's within 1e-5 relative (the sums over the ranks change the order of additions, nothing
# else; AdamW, whose state is per element: 8-bit blocks would be cut from each rank's part), the summary's `ranks`
# table has both ranks, and the report has a line for each.
#   train_gpt_tensor_parallel.sh <memtrain_train_gpt binary> <corpus.txt> <scratch dir> <mpiexec, its flags, its -np flag>
set -euo pipefail
bin=$1 corpus=$2 dir=$3
shift 3
rm -rf "$dir" && mkdir -p "$dir"
base=(--model tiny --vocab-size 300 --data "$corpus" --data-dir "$dir/data" --micro-batch 4 --grad-accum 2
      --steps 6 --sample-tokens 0 --checkpoint-interval 0 --optimizer adamw)
"$bin" "${base[@]}" --out-dir "$dir/alone" > "$dir/alone.log" 2>&1 || { cat "$dir/alone.log"; exit 1; }
"$@" 2 "$bin" "${base[@]}" --tensor-parallel 2 --out-dir "$dir/split" > "$dir/split.log" 2>&1 ||
  { cat "$dir/split.log"; exit 1; }
# The summary is indented JSON, one field a line.
field() { grep -o "\"$2\": [^,]*" "$1" | head -1 | sed 's/^[^:]*: //'; }
for f in final_train_loss final_val_loss; do
  alone=$(field "$dir/alone/summary.json" "$f") split=$(field "$dir/split/summary.json" "$f")
  awk -v a="$alone" -v b="$split" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-5 * (a < 0 ? -a : a)) }' ||
    { echo "$f: tensor-parallel $split, alone $alone"; cat "$dir/split.log"; exit 1; }
done
# Keys are sorted: nothing after the table is named "rank".
[[ $(sed -n '/"ranks": \[/,$p' "$dir/split/summary.json" | grep -c '"rank": ') == 2 ]] ||
  { echo "the summary has no table of the 2 ranks"; exit 1; }
grep -q "^rank 1 (data 0, tensor 1): peak" "$dir/split.log" ||
  { echo "the report has no line for rank 1"; cat "$dir/split.log"; exit 1; }
echo "tensor parallel over 2 ranks: final losses $(field "$dir/split/summary.json" final_train_loss)," \
     "alone $(field "$dir/alone/summary.json" final_train_loss)"

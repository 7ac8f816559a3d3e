#!/usr/bin/env bash
# The train_gpt example fitted into a budget under mpirun at 2 ranks: --fit predicts every rank of each
# candidate (the ZeRO stage among the knobs), rank 0 alone prints the choice, and the chosen run trains within
# the budget (the ranks would refuse each other's configs at start-up had they chosen differently).
#   train_gpt_fit_ranks.sh <memtrain_train_gpt binary> <corpus.txt> <scratch dir> <mpiexec, its flags, its -np flag>
set -euo pipefail
bin=$1 corpus=$2 dir=$3
shift 3
rm -rf "$dir" && mkdir -p "$dir"
base=(--model tiny --vocab-size 300 --data "$corpus" --data-dir "$dir/data" --micro-batch 4 --grad-accum 2
      --sample-tokens 8)
# The run's own peak: the first one written (keys are sorted, so it comes before the per-rank `ranks` table).
peak() { grep -o '"peak_bytes_total": [0-9]*' "$1" | head -1 | grep -o '[0-9]*$'; }

# The plain run's prediction (ZeRO 0, micro-batch 4 x 2) on rank 0; 3/4 of it is the budget.
"$@" 2 "$bin" "${base[@]}" --zero 0 --plan-only --summary-json "$dir/plan.json" > "$dir/plan.log" 2>&1 ||
  { cat "$dir/plan.log"; exit 1; }
budget=$(( $(peak "$dir/plan.json") * 3 / 4 ))
"$@" 2 "$bin" "${base[@]}" --steps 2 --fit "$budget" --out-dir "$dir/fit" > "$dir/fit.log" 2>&1 ||
  { cat "$dir/fit.log"; exit 1; }
[[ $(grep -c "^chosen: .*on rank [0-9] of 2" "$dir/fit.log") == 1 ]] ||
  { echo "--fit under mpirun: not one choice printed for the 2 ranks"; cat "$dir/fit.log"; exit 1; }
fit_peak=$(peak "$dir/fit/summary.json")
((fit_peak > 0 && fit_peak <= budget)) ||
  { echo "--fit $budget at 2 ranks: rank 0 peaked at $fit_peak"; cat "$dir/fit.log"; exit 1; }
echo "fit at 2 ranks: budget $budget, rank 0 peak $fit_peak; $(grep '^chosen: ' "$dir/fit.log")"

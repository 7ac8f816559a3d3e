#!/usr/bin/env bash
# Smoke test of the train_gpt example on the public API, end to end: prepare a text corpus, train a few
# steps, check that --plan-only predicted that run's peak and that --fit keeps a run within a budget, checkpoint,
# resume to more steps, evaluate only (with its summary); then short bf16 and fp8 runs.
# Fails on a non-zero exit or missing outputs.
#   train_gpt_smoke.sh <memtrain_train_gpt binary> <corpus.txt> <scratch dir>
set -euo pipefail
bin=$1 corpus=$2 dir=$3
rm -rf "$dir" && mkdir -p "$dir"
base=(--model tiny --vocab-size 300 --data "$corpus" --data-dir "$dir/data" --micro-batch 4 --sample-tokens 8)
common=("${base[@]}" --out-dir "$dir/run")

"$bin" "${common[@]}" --steps 4 > "$dir/first.log" 2>&1 || { cat "$dir/first.log"; exit 1; }
# --plan-only predicts that run on the meta device (reading no data): its peak_bytes_total must be within
# -0.5% / +1.5% of what the run measured.
"$bin" "${base[@]}" --steps 4 --plan-only --summary-json "$dir/plan.json" > "$dir/plan.log" 2>&1 ||
  { cat "$dir/plan.log"; exit 1; }
peak() { grep -o '"peak_bytes_total": [0-9]*' "$1" | grep -o '[0-9]*$'; }
predicted=$(peak "$dir/plan.json") measured=$(peak "$dir/run/summary.json")
awk -v p="$predicted" -v m="$measured" 'BEGIN { exit !(p != "" && m > 0 && p >= 0.995 * m && p <= 1.015 * m) }' ||
  { echo "predicted peak $predicted vs measured $measured: outside -0.5%/+1.5%"; cat "$dir/plan.log"; exit 1; }
grep -q "predicted memory on cpu" "$dir/plan.log" || { echo "--plan-only printed no prediction"; cat "$dir/plan.log"; exit 1; }
# --fit: a budget of 3/4 of that run's peak chooses a configuration that trains within it (the allocator holds
# the run to the budget too); a budget nothing fits is refused before any step, with the smallest breakdown; a
# mistyped unit and a contradictory flag are refused naming what is wrong.
budget=$((measured * 3 / 4))
"$bin" "${base[@]}" --out-dir "$dir/fit" --steps 2 --fit "$budget" > "$dir/fit.log" 2>&1 || { cat "$dir/fit.log"; exit 1; }
grep -q "^chosen: " "$dir/fit.log" || { echo "--fit printed no choice"; cat "$dir/fit.log"; exit 1; }
fit_peak=$(peak "$dir/fit/summary.json")
((fit_peak > 0 && fit_peak <= budget)) || { echo "--fit $budget: the run peaked at $fit_peak"; cat "$dir/fit.log"; exit 1; }
if "$bin" "${base[@]}" --fit 16KiB --plan-only > "$dir/nofit.log" 2>&1; then echo "--fit 16KiB was not refused"; exit 1; fi
grep -q "nothing fits" "$dir/nofit.log" && grep -q "parameters" "$dir/nofit.log" ||
  { echo "the refusal lacks the smallest breakdown"; cat "$dir/nofit.log"; exit 1; }
if "$bin" "${base[@]}" --fit 1.5Gib --plan-only > "$dir/typo.log" 2>&1; then echo "--fit 1.5Gib was accepted"; exit 1; fi
grep -q "KiB, MiB, GiB" "$dir/typo.log" || { echo "the unit typo's refusal names no units"; cat "$dir/typo.log"; exit 1; }
if "$bin" "${common[@]}" --fit 1GiB --resume > "$dir/contra.log" 2>&1; then echo "--fit with --resume ran"; exit 1; fi
grep -q "\-\-fit 1GiB and \-\-resume" "$dir/contra.log" || { echo "the contradiction is not named"; cat "$dir/contra.log"; exit 1; }
"$bin" "${common[@]}" --steps 6 --resume > "$dir/resumed.log" 2>&1 || { cat "$dir/resumed.log"; exit 1; }
grep -q "resumed at step 4" "$dir/resumed.log" || { echo "no resume"; cat "$dir/resumed.log"; exit 1; }
lines=$(wc -l < "$dir/run/metrics.jsonl")
[[ $lines -eq 6 ]] || { echo "metrics.jsonl has $lines lines, expected 6 (4 + 2 resumed)"; exit 1; }
for f in config.json summary.json; do [[ -s $dir/run/$f ]] || { echo "missing $f"; exit 1; }; done
grep -q '"peak_bytes_total"' "$dir/run/summary.json" || { echo "summary without peak bytes"; exit 1; }
tail -n 20 "$dir/resumed.log" | grep -q "total" || { echo "the run does not end with the memory report"; exit 1; }
"$bin" "${common[@]}" --eval-only --resume --summary-json "$dir/eval_summary.json" > "$dir/eval.log" 2>&1 ||
  { cat "$dir/eval.log"; exit 1; }
grep -q "val loss" "$dir/eval.log" || { echo "no val loss"; cat "$dir/eval.log"; exit 1; }
# --eval-only writes its summary too: the val loss and how many tokens it was measured over.
grep -Eq '"final_val_loss": [0-9]' "$dir/eval_summary.json" 2>/dev/null &&
  grep -Eq '"val_tokens": [1-9]' "$dir/eval_summary.json" || { echo "eval-only summary without val loss and tokens"; exit 1; }
# Mixed precision end to end: the run finishes and its config records the policy.
for p in "bf16" "fp8 --fp8-scaling delayed"; do
  out="$dir/run_${p%% *}"
  # shellcheck disable=SC2086  # $p carries the flag's value and, for fp8, one more flag
  "$bin" "${base[@]}" --out-dir "$out" --steps 2 --precision $p > "$out.log" 2>&1 || { cat "$out.log"; exit 1; }
  grep -q "\"precision\": \"${p%% *}\"" "$out/config.json" || { echo "config.json without precision ${p%% *}"; exit 1; }
done
# --memory-timeline: an SVG of step 2 with its phases and the predicted curve.
"$bin" "${base[@]}" --out-dir "$dir/timeline" --steps 2 --memory-timeline "$dir/timeline.svg" > "$dir/timeline.log" 2>&1 ||
  { cat "$dir/timeline.log"; exit 1; }
for want in '<svg ' '>forward<' '>backward<' '>optimizer step<' 'id="predicted"' '</svg>'; do
  grep -q "$want" "$dir/timeline.svg" || { echo "timeline.svg without $want"; exit 1; }
done
# memtrain_plot draws the run's metrics (the plot binary sits beside train_gpt).
plot=$(dirname "$bin")/memtrain_plot
"$plot" "$dir/run/metrics.jsonl" "$dir/metrics.svg" > "$dir/plot.log" 2>&1 || { cat "$dir/plot.log"; exit 1; }
grep -q 'data-key="loss"' "$dir/metrics.svg" && grep -q 'data-key="peak_bytes"' "$dir/metrics.svg" ||
  { echo "metrics.svg lacks the loss or peak memory panel"; exit 1; }
# A bad flag value is refused with the reason, not run.
if "$bin" "${common[@]}" --precision fp9 > "$dir/bad.log" 2>&1; then echo "--precision fp9 was accepted"; exit 1; fi
grep -q "precision" "$dir/bad.log" || { cat "$dir/bad.log"; exit 1; }
echo "train_gpt smoke: ok"

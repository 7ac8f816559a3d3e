#!/usr/bin/env bash
# --fit against an exhaustive measured search. For budgets at 30, 50 and 75% of the fp32 AdamW peak (no memory
# technique), every candidate of the knobs --fit searches with f32 weights and without GaLore (the tier it
# chooses from whenever any of them fits: precision fp32/bf16, 32- or 8-bit AdamW, checkpointing none /
# selective / every:2 / full, the micro-batch split of the same global batch, layer-wise updates) is predicted
# with --plan-only; each whose prediction fits the largest budget is trained for real. Then --fit chooses for
# each budget (a choice with a budget:X policy, which the grid does not hold, is trained too). Steps of one
# configuration differ by 10-20% between runs here, more than many candidates differ, so the choice and the
# grid's three fastest candidates whose measured peak fits are then trained again, in turns, REPEAT times for
# FINAL_STEPS steps. One row per budget: the choice, its measured peak against the budget, its step time, the
# fastest of the others and the ratio (the goal: the choice within 15% of the fastest, never over the budget).
# The grid's table follows.
#
# Usage: bench/fit_exhaustive.sh [preset:seq_len:micro_batch]   default: small:256:8
# Environment: MEMTRAIN_BUILD_DIR (build), SKIP_BUILD=1, STEPS (4 optimizer steps per grid run; the first is left
#   out of the median), FINAL_STEPS (8), REPEAT (3), VOCAB (4096), WORK (scratch dir, default a mktemp).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
cd "$MEMTRAIN_ROOT"

# shellcheck source=bench/train_gpt_common.sh
source bench/train_gpt_common.sh
steps=${STEPS:-4} vocab=${VOCAB:-4096}
IFS=: read -r preset seq global <<<"${1:-small:256:8}"
data=(--model "$preset" --seq-len "$seq" --vocab-size "$vocab" --data-dir "$work/data" --sample-tokens 0)
common=("${data[@]}" --steps "$steps")

# The data is prepared once, before anything is timed.
"$bin" "${data[@]}" --micro-batch 1 --steps 1 --out-dir "$work/prepare" > "$work/prepare.log" 2>&1 ||
  { cat "$work/prepare.log"; exit 1; }
"$bin" "${common[@]}" --micro-batch "$global" --optimizer adamw --precision fp32 --checkpoint none --plan-only \
  --summary-json "$work/plain.json" > "$work/plain.log" 2>&1 || { cat "$work/plain.log"; exit 1; }
plain=$(json "$work/plain.json" predicted peak_bytes_total)
largest=$((plain * 75 / 100))

# Every candidate: "flags<TAB>predicted peak"; those that fit the largest budget trained: flags -> peak, step.
declare -A measured_peak measured_step
candidates=()
for precision in fp32 bf16; do
  for optimizer in adamw adamw8bit; do
    for ckpt in none selective every:2 full; do
      for ((mb = global; mb >= 1; mb /= 2)); do
        for lw in "" "--layerwise"; do
          flags="--precision $precision --optimizer $optimizer --checkpoint $ckpt --micro-batch $mb --grad-accum $((global / mb))${lw:+ $lw}"
          candidates+=("$flags")
        done
      done
    done
  done
done
# What was measured is kept in $work/measured.tsv (flags, peak, step seconds): a second run with the same WORK
# trains only what is missing.
run=0
if [[ -f $work/measured.tsv ]]; then
  while IFS=$'\t' read -r flags peak step; do
    measured_peak[$flags]=$peak measured_step[$flags]=$step
  done < "$work/measured.tsv"
fi
measure() {  # measure FLAGS: trains the candidate unless it was trained already
  local flags=$1
  [[ -n ${measured_step[$flags]:-} ]] && return
  run=$((run + 1))
  while [[ -e $work/run$run ]]; do run=$((run + 1)); done
  # shellcheck disable=SC2086  # the flags are split on purpose
  "$bin" "${common[@]}" $flags --out-dir "$work/run$run" --summary-json "$work/run$run.json" > "$work/run$run.log" 2>&1 ||
    { cat "$work/run$run.log"; exit 1; }
  measured_peak[$flags]=$(json "$work/run$run.json" peak_bytes_total)
  measured_step[$flags]=$(median_step "$work/run$run/metrics.jsonl")
  printf '%s\t%s\t%s\n' "$flags" "${measured_peak[$flags]}" "${measured_step[$flags]}" >> "$work/measured.tsv"
}
for flags in "${candidates[@]}"; do
  # shellcheck disable=SC2086
  "$bin" "${common[@]}" $flags --plan-only --summary-json "$work/cand.json" > "$work/cand.log" 2>&1 ||
    { cat "$work/cand.log"; exit 1; }
  predicted=$(json "$work/cand.json" predicted peak_bytes_total)
  ((predicted <= largest)) && measure "$flags"
done


# Median step seconds of FLAGS over `repeat` runs of `final_steps` steps, the runs of all contenders in turns.
final_steps=${FINAL_STEPS:-8} repeat=${REPEAT:-3}
declare -A final_times
final_round() {  # final_round FLAGS...: one more run of each, in turn
  local flags
  for flags in "$@"; do
    run=$((run + 1))
    while [[ -e $work/run$run ]]; do run=$((run + 1)); done
    # shellcheck disable=SC2086
    "$bin" "${data[@]}" --steps "$final_steps" $flags --out-dir "$work/run$run" > "$work/run$run.log" 2>&1 ||
      { cat "$work/run$run.log"; exit 1; }
    final_times[$flags]+="$(median_step "$work/run$run/metrics.jsonl") "
  done
}
median_of() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) threads; $preset, windows of $seq, global batch $global;" \
  "${#measured_step[@]} of ${#candidates[@]} candidates trained for $steps steps; the choice and the three fastest" \
  "that fit then trained $repeat times for $final_steps steps each, in turns (median of steps 2-$final_steps, median of runs)"
echo
echo "| budget | chosen | measured peak | fits | step s | fastest other that fits | its step s | chosen / fastest |"
echo "|---|---|---:|---|---:|---|---:|---:|"
for pct in 30 50 75; do
  budget=$((plain * pct / 100))
  # No --optimizer: a flag given stays as given, and the default (8-bit AdamW) lets --fit choose 32- or 8-bit.
  "$bin" "${common[@]}" --micro-batch "$global" --fit "$budget" --plan-only > "$work/fit$pct.log" 2>&1 ||
    { echo "| $pct% | nothing fits | | | | | | |"; continue; }
  chosen=$(sed -n 's/^chosen: \(.*\) (predicted peak.*/\1/p' "$work/fit$pct.log")
  chosen_flags=$(fit_flags_of "$chosen")
  measure "$chosen_flags"
  # The grid's three fastest whose measured peak fits, by their single short run.
  mapfile -t fastest < <(for flags in "${!measured_step[@]}"; do
      ((measured_peak[$flags] <= budget)) && [[ $flags != "$chosen_flags" ]] && printf '%s\t%s\n' "${measured_step[$flags]}" "$flags"
    done | sort -g | head -n 3 | cut -f2)
  final_times=()
  for ((r = 0; r < repeat; r++)); do final_round "$chosen_flags" "${fastest[@]}"; done
  chosen_s=$(median_of "${final_times[$chosen_flags]}")
  best="" best_s=""
  for flags in "${fastest[@]}"; do
    s=$(median_of "${final_times[$flags]}")
    if [[ -z $best ]] || awk -v a="$s" -v b="$best_s" 'BEGIN { exit !(a < b) }'; then best=$flags best_s=$s; fi
  done
  awk -v p="$pct" -v b="$budget" -v ch="$chosen" -v pk="${measured_peak[$chosen_flags]}" \
    -v s="$chosen_s" -v best="$best" -v bs="$best_s" \
    'BEGIN { printf "| %d%% (%.1f MiB) | %s | %.1f MiB | %s | %.3f | %s | %s | %s |\n", p, b / 1048576, ch, pk / 1048576,
             (pk <= b ? "yes" : "NO"), s, (best == "" ? "-" : best), (bs == "" ? "-" : sprintf("%.3f", bs)),
             (bs == "" ? "-" : sprintf("%.2f", s / bs)) }'
done
echo
echo "| candidate | measured peak MiB | step s |"
echo "|---|---:|---:|"
for flags in "${!measured_step[@]}"; do
  awk -v f="$flags" -v pk="${measured_peak[$flags]}" -v s="${measured_step[$flags]}" \
    'BEGIN { printf "| %s | %.1f | %.3f |\n", f, pk / 1048576, s }'
done | sort -t'|' -k4 -g

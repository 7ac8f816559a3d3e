#!/usr/bin/env bash
# --fit against an exhaustive measured search. For budgets at 30, 50 and 75% of the fp32 AdamW peak (no memory
# technique), every candidate of the knobs --fit searches with f32 weights and without GaLore (the tier it
# chooses from whenever any of them fits: precision fp32/bf16, 32- or 8-bit AdamW, checkpointing none /
# selective / every:2 / full, the micro-batch split of the same global batch, layer-wise updates) is predicted
# with --plan-only; each whose prediction fits the largest budget is trained for real. Then --fit chooses for
# each budget (a choice with a budget:X policy, which the grid does not hold, is trained too). One row per
# budget: the choice, its measured peak against the budget, its measured median step time, the fastest measured
# candidate whose measured peak fits, and the ratio (the goal: the choice within 15% of that, never over the
# budget). The candidate table follows.
#
# Usage: bench/fit_exhaustive.sh [preset:seq_len:micro_batch]   default: small:256:8
# Environment: MEMTRAIN_BUILD_DIR (build), SKIP_BUILD=1, STEPS (4 optimizer steps per run; the first is left out
#   of the median), VOCAB (4096), WORK (scratch dir, default a mktemp).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
cd "$MEMTRAIN_ROOT"

# shellcheck source=bench/train_gpt_common.sh
source bench/train_gpt_common.sh
steps=${STEPS:-4} vocab=${VOCAB:-4096}
IFS=: read -r preset seq global <<<"${1:-small:256:8}"
common=(--model "$preset" --seq-len "$seq" --vocab-size "$vocab" --data-dir "$work/data" --sample-tokens 0
        --steps "$steps")

# Median step seconds of a metrics file, the first step left out.
median_step() { "$py" -c 'import json, statistics, sys
t = [json.loads(l)["step_seconds"] for l in open(sys.argv[1])][1:]
print(statistics.median(t))' "$1"; }

# The data is prepared once, before anything is timed.
"$bin" "${common[@]}" --micro-batch 1 --steps 1 --out-dir "$work/prepare" > "$work/prepare.log" 2>&1 ||
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
run=0
measure() {  # measure FLAGS: trains the candidate unless it was trained already
  local flags=$1
  [[ -n ${measured_step[$flags]:-} ]] && return
  run=$((run + 1))
  # shellcheck disable=SC2086  # the flags are split on purpose
  "$bin" "${common[@]}" $flags --out-dir "$work/run$run" --summary-json "$work/run$run.json" > "$work/run$run.log" 2>&1 ||
    { cat "$work/run$run.log"; exit 1; }
  measured_peak[$flags]=$(json "$work/run$run.json" peak_bytes_total)
  measured_step[$flags]=$(median_step "$work/run$run/metrics.jsonl")
}
for flags in "${candidates[@]}"; do
  # shellcheck disable=SC2086
  "$bin" "${common[@]}" $flags --plan-only --summary-json "$work/cand.json" > "$work/cand.log" 2>&1 ||
    { cat "$work/cand.log"; exit 1; }
  predicted=$(json "$work/cand.json" predicted peak_bytes_total)
  ((predicted <= largest)) && measure "$flags"
done


echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) threads; $preset, windows of $seq, global batch $global;" \
  "$steps steps per run; ${#measured_step[@]} of ${#candidates[@]} candidates trained"
echo
echo "| budget | chosen | measured peak | fits | step s | fastest measured that fits | its step s | chosen / fastest |"
echo "|---|---|---:|---|---:|---|---:|---:|"
for pct in 30 50 75; do
  budget=$((plain * pct / 100))
  "$bin" "${common[@]}" --micro-batch "$global" --optimizer adamw --fit "$budget" --plan-only > "$work/fit$pct.log" 2>&1 ||
    { echo "| $pct% | nothing fits | | | | | | |"; continue; }
  chosen=$(sed -n 's/^chosen: \(.*\) (predicted peak.*/\1/p' "$work/fit$pct.log")
  chosen_flags=$(fit_flags_of "$chosen")
  measure "$chosen_flags"
  best="" best_step=""
  for flags in "${!measured_step[@]}"; do
    ((measured_peak[$flags] <= budget)) || continue
    if [[ -z $best ]] || awk -v a="${measured_step[$flags]}" -v b="$best_step" 'BEGIN { exit !(a < b) }'; then
      best=$flags best_step=${measured_step[$flags]}
    fi
  done
  awk -v p="$pct" -v b="$budget" -v ch="$chosen" -v pk="${measured_peak[$chosen_flags]}" \
    -v s="${measured_step[$chosen_flags]}" -v best="$best" -v bs="$best_step" \
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

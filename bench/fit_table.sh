#!/usr/bin/env bash
# How well --fit chooses: for budgets at 30, 50 and 75% of the fp32 AdamW peak (no memory technique; predicted,
# which is exact on the CPU), memtrain_train_gpt --fit BUDGET picks a configuration; it is then trained for
# real, and so are the fastest other fitting candidates by the cost model (the peer set: without GaLore when the
# choice has none, since the fitter takes GaLore only when nothing without it fits). One row per budget:
# the chosen knobs, its measured peak against the budget, its measured median step time, and the best measured
# step time among the peers (ratio > 1: a peer was faster than the choice).
#
# Usage: bench/fit_table.sh [preset:seq_len:micro_batch ...]   default: small:256:8
# Environment: MEMTRAIN_BUILD_DIR (build), SKIP_BUILD=1, STEPS (6 optimizer steps per real run; the first is
#   left out of the median), PEERS (3), VOCAB (4096), WORK (scratch dir, default a mktemp).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
cd "$MEMTRAIN_ROOT"

# shellcheck source=bench/train_gpt_common.sh
source bench/train_gpt_common.sh
steps=${STEPS:-6} peers=${PEERS:-3} vocab=${VOCAB:-4096}
(($# > 0)) || set -- small:256:8

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) threads; $steps steps per run, vocabulary $vocab"
echo
echo "| config | budget | chosen | measured peak | fits | step s | best peer step s | chosen / best |"
echo "|---|---:|---|---:|---|---:|---:|---:|"
run=0
for config in "$@"; do
  IFS=: read -r preset seq mb <<<"$config"
  common=(--model "$preset" --seq-len "$seq" --vocab-size "$vocab" --data-dir "$work/data" --sample-tokens 0
          --steps "$steps")
  "$bin" "${common[@]}" --micro-batch "$mb" --optimizer adamw --precision fp32 --checkpoint none --plan-only \
    --summary-json "$work/plain.json" > "$work/plain.log" 2>&1 || { cat "$work/plain.log"; exit 1; }
  plain=$(json "$work/plain.json" predicted peak_bytes_total)
  for pct in 30 50 75; do
    budget=$((plain * pct / 100))
    # No --optimizer: a flag given stays as given, and the default (8-bit AdamW) lets --fit choose 32- or 8-bit.
    "$bin" "${common[@]}" --micro-batch "$mb" --fit "$budget" --plan-only > "$work/fit$pct.log" 2>&1 ||
      { echo "| $config | $pct% | nothing fits | | | | | |"; continue; }
    chosen=$(sed -n 's/^chosen: \(.*\) (predicted peak.*/\1/p' "$work/fit$pct.log")
    # The chosen one, then the other fitting candidates by predicted step time, fastest first.
    # A choice without GaLore is compared with candidates without it (GaLore is chosen only when they do not fit).
    skip_galore=cat
    [[ $chosen == *galore* ]] || skip_galore="grep -v galore"
    mapfile -t ranked < <(echo "$chosen"; grep '^  fits ' "$work/fit$pct.log" |
      awk '{ t = $4; $1 = $2 = $3 = $4 = $5 = ""; sub(/^ +/, ""); print t "\t" $0 }' | sort -g | cut -f2 |
      grep -vxF "$chosen" | $skip_galore | head -n "$peers")
    best_peer=""
    chosen_step="" chosen_peak="" 
    for cand in "${ranked[@]}"; do
      run=$((run + 1))
      # shellcheck disable=SC2046  # the candidate's flags are split on purpose
      "$bin" "${common[@]}" $(fit_flags_of "$cand") --out-dir "$work/run$run" > "$work/run$run.log" 2>&1 ||
        { cat "$work/run$run.log"; exit 1; }
      step=$(median_step "$work/run$run/metrics.jsonl")
      if [[ $cand == "$chosen" ]]; then
        chosen_step=$step chosen_peak=$(json "$work/run$run/summary.json" peak_bytes_total)
      elif [[ -z $best_peer ]] || awk -v a="$step" -v b="$best_peer" 'BEGIN { exit !(a < b) }'; then
        best_peer=$step
      fi
    done
    awk -v c="$config" -v p="$pct" -v ch="$chosen" -v pk="$chosen_peak" -v b="$budget" -v s="$chosen_step" -v bp="$best_peer" \
      'BEGIN { printf "| %s | %d%% (%.1f MiB) | %s | %.1f MiB | %s | %.3f | %s | %s |\n", c, p, b / 1048576, ch, pk / 1048576,
               (pk <= b ? "yes" : "NO"), s, (bp == "" ? "-" : sprintf("%.3f", bp)),
               (bp == "" ? "-" : sprintf("%.2f", s / (s < bp ? s : bp))) }'
  done
done

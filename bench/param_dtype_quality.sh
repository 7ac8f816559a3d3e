#!/usr/bin/env bash
# What bf16 weights without an f32 master cost in quality (issue 29): the GPT example on fortunes, the same data,
# seed and schedule, trained once per configuration; the final validation loss of each beside fp32 AdamW's (f32
# master weights, fp32 compute):
#   fp32 AdamW                 --optimizer adamw --precision fp32
#   bf16 + f32 masters         --optimizer adamw --precision bf16
#   bf16 weights               --optimizer adamw --precision bf16 --param-dtype bf16
#   bf16 weights, Kahan        --optimizer adamw --precision bf16 --param-dtype bf16-kahan
#   the recipe                 --precision bf16 --param-dtype bf16 --optimizer adamw8bit --galore-rank 128
#                              --layerwise --checkpoint full
# Goal: each within 3% of fp32 AdamW's validation loss.
#
# Usage: bench/param_dtype_quality.sh
# Environment: PRESET (default small), STEPS (1000), MICRO_BATCH (16), SEQ (the preset's),
#   MEMTRAIN_BUILD_DIR, SKIP_BUILD=1, WORK.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
cd "$MEMTRAIN_ROOT"

# shellcheck source=bench/train_gpt_common.sh
source bench/train_gpt_common.sh

preset=${PRESET:-small} steps=${STEPS:-1000} micro=${MICRO_BATCH:-16}
seq_flag=()
[[ -z ${SEQ:-} ]] || seq_flag=(--seq-len "$SEQ")
configs=("fp32 AdamW|--optimizer adamw --precision fp32"
         "bf16 + f32 masters|--optimizer adamw --precision bf16"
         "bf16 weights|--optimizer adamw --precision bf16 --param-dtype bf16"
         "bf16 weights, Kahan|--optimizer adamw --precision bf16 --param-dtype bf16-kahan"
         "the recipe|--precision bf16 --param-dtype bf16 --optimizer adamw8bit --galore-rank 128 --layerwise --checkpoint full")

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) threads; preset $preset, $steps steps of micro-batch $micro"
echo
echo "| run | final val loss | vs fp32 AdamW | median step |"
echo "|---|---:|---:|---:|"
base=""
i=0
for config in "${configs[@]}"; do
  label=${config%%|*} flags=${config#*|}
  i=$((i + 1))
  # shellcheck disable=SC2206  # the flags are split on purpose
  args=(--model "$preset" "${seq_flag[@]}" --micro-batch "$micro" --steps "$steps" $flags --seed 1337 --lr 1e-3
        --checkpoint-interval 0 --sample-tokens 0 --data-dir "$work/data")
  "$bin" "${args[@]}" --out-dir "$work/run$i" --summary-json "$work/run$i.json" > "$work/run$i.log" 2>&1 ||
    { cat "$work/run$i.log"; mt_die "run of '$config' failed"; }
  loss=$(json "$work/run$i.json" final_val_loss) step=$(json "$work/run$i.json" median_step_seconds)
  [[ -n $base ]] || base=$loss
  awk -v l="$loss" -v b="$base" -v s="$step" -v name="$label" \
    'BEGIN { printf "| %s | %.4f | %+.2f%% | %.3f s |\n", name, l, 100 * (l / b - 1), s }'
done

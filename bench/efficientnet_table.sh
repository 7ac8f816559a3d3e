#!/usr/bin/env bash
# Activation memory of the EfficientNet example (memtrain_train_efficientnet, Fashion-MNIST) at batch 512, the
# batch of the seed's claim that a SiLU with its own gradient saves 20%: the activation bytes at the step's peak
# (run summary: peak_bytes_by_category.activations, the allocator's accounting) and the total peak, for
#   silu input    SiLU keeps only x (the default), full-size images
#   silu output   x * sigmoid(x) from two ops, which keep sigmoid(x) too
#   side 20 / 24  every step on images resized to 20x20 / 24x24: the early phases of progressive resizing
#   checkpoint    --checkpoint full (each MBConv block recomputed in the backward), for scale
# A few steps each (the peak is the same every step); the run's median step time beside it.
#
# Usage: bench/efficientnet_table.sh
# Environment: MEMTRAIN_BUILD_DIR (build), BATCH (512), STEPS (4), THREADS (2), WORK (scratch dir), DATA
# (fashion-mnist dir), EXTRA (flags added to every run).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
cd "$MEMTRAIN_ROOT"
bin=${MEMTRAIN_BUILD_DIR:-build}/examples/memtrain_train_efficientnet
[[ -x $bin ]] || mt_die "$bin is not built"
batch=${BATCH:-512} steps=${STEPS:-4} threads=${THREADS:-2} work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
data=${DATA:-/usr/share/datasets/fashion-mnist}
declare -A flags=(
  [silu_input]="--progressive none"
  [silu_output]="--progressive none --silu output"
  [side_20]="--progressive 20"
  [side_24]="--progressive 24"
  [checkpoint_full]="--progressive none --checkpoint full"
)
order=(silu_input silu_output side_20 side_24 checkpoint_full)
field() { perl -ne 'print $1 if /"\Q'"$2"'\E": ([-+0-9.eE]+)/' "$1"; }

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, OMP_NUM_THREADS=$threads; batch $batch, $steps steps ${EXTRA:-}"
printf '| run | activations at peak (MiB) | total peak (MiB) | median step (s) |\n|---|---|---|---|\n'
for name in "${order[@]}"; do
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=$threads "$bin" --data "$data" --batch "$batch" --max-steps "$steps" ${flags[$name]} ${EXTRA:-} \
    --out-dir "$work/$name" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; mt_die "$name failed"; }
  summary=$work/$name/summary.json
  acts=$(perl -0ne 'print $1 if /"peak_bytes_by_category":\s*\{[^}]*"activations":\s*([0-9]+)/' "$summary")
  total=$(field "$summary" peak_bytes_total)
  step=$(field "$summary" median_step_seconds)
  printf '| %s | %.2f | %.2f | %.3f |\n' "$name" "$(echo "$acts / 1048576" | bc -l)" \
    "$(echo "$total / 1048576" | bc -l)" "$step"
done

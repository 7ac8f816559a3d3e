#!/usr/bin/env bash
# Smoke test of the train_efficientnet example on a small generated IDX dataset (64 train, 20 test images of
# 28x28, batch 4: 16 steps in three resizing phases 20, 24, 28): it trains, summary.json carries the example's
# own results (test_accuracy in [0, 1], a positive finite test_loss, images_per_second), --plan-only predicts
# without reading data, and a falling --progressive list is refused naming the flag.
#   train_efficientnet_smoke.sh <memtrain_train_efficientnet binary> <scratch dir>
set -euo pipefail
bin=$1 dir=$2
rm -rf "$dir"
# shellcheck source=tests/examples/image_example_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/image_example_common.sh"
write_idx_dataset "$dir/data" 64 20

"$bin" --data "$dir/data" --epochs 1 --batch 4 --checkpoint full --progressive 20,24,28 --out-dir "$dir/run" \
  > "$dir/run.log" 2>&1 ||
  { cat "$dir/run.log"; exit 1; }
grep -q "image sides 20 -> 24 -> 28" "$dir/run.log" || { echo "no resizing schedule line"; cat "$dir/run.log"; exit 1; }
check_classifier_summary "$dir/run" "$dir/run.log"

"$bin" --plan-only --batch 4 --summary-json "$dir/plan.json" > "$dir/plan.log" 2>&1 || { cat "$dir/plan.log"; exit 1; }
grep -q '"peak_bytes_total"' "$dir/plan.json" || { echo "plan.json has no prediction"; cat "$dir/plan.log"; exit 1; }

if "$bin" --data "$dir/data" --progressive 24,20 --out-dir "$dir/bad" > "$dir/bad.log" 2>&1; then
  echo "a falling --progressive list was accepted"; exit 1
fi
grep -q -- "--progressive: sizes must rise" "$dir/bad.log" || { echo "unclear refusal:"; cat "$dir/bad.log"; exit 1; }
echo "train_efficientnet smoke: ok"

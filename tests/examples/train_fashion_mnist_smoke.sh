#!/usr/bin/env bash
# Smoke test of the train_fashion_mnist example on a small generated IDX dataset (64 train, 20 test images of
# 28x28; batch 1, so that the 64 steps outlast the example's 50 warmup steps): it trains, and summary.json
# carries the example's own results: test_accuracy in [0, 1], a positive finite test_loss and images_per_second.
#   train_fashion_mnist_smoke.sh <memtrain_train_fashion_mnist binary> <scratch dir>
set -euo pipefail
bin=$1 dir=$2
rm -rf "$dir"
# shellcheck source=tests/examples/image_example_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/image_example_common.sh"
write_idx_dataset "$dir/data" 64 20

"$bin" --data "$dir/data" --epochs 1 --batch 1 --out-dir "$dir/run" > "$dir/run.log" 2>&1 || { cat "$dir/run.log"; exit 1; }
check_classifier_summary "$dir/run" "$dir/run.log"
echo "train_fashion_mnist smoke: ok"

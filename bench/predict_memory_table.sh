#!/usr/bin/env bash
# How close train::predict_memory comes to the run it predicts: for each configuration, memtrain_train_gpt
# --plan-only writes the prediction (the run on the meta device), then the same flags train for real (--steps 2:
# two optimizer steps, the evaluation and the checkpoint save fit() ends with) and write their summary. One
# markdown row per configuration: predicted and measured peak_bytes_total, the error, the prediction's wall
# time, and the category that held the most at the measured peak.
#
# Error = predicted / measured - 1; the goal is within [-0.5%, +1.5%] (never more than 0.5% under).
#
# Usage: bench/predict_memory_table.sh [config...]
#   config = "preset|flags": the flags are train_gpt's (optimizer, precision, checkpoint, micro-batch, ...).
#   Default: a grid of 48, the tiny, mini and small presets under 16 combinations of the techniques.
# Columns also compare the allocator's reserved bytes (goal +-3%) and the process's peak RSS (goal +-5%) with
# their predictions.
# Environment: MEMTRAIN_BUILD_DIR (default build), SKIP_BUILD=1 to use the built example, VOCAB (512: the
#   tokenizer size; the plan and the run must agree on it), SEQ (64), WORK (a scratch dir, default a mktemp).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
cd "$MEMTRAIN_ROOT"

# shellcheck source=bench/train_gpt_common.sh
source bench/train_gpt_common.sh
vocab=${VOCAB:-512} seq=${SEQ:-64}

if (($# > 0)); then
  configs=("$@")
else
  # 3 presets x 16 technique combinations = 48 configurations.
  techniques=(
    "--optimizer adamw"
    "--optimizer adamw8bit"
    "--optimizer lion8bit"
    "--optimizer adafactor"
    "--optimizer adamw8bit --galore-rank 16 --galore-gap 1"
    "--optimizer adamw --checkpoint full"
    "--optimizer adamw --checkpoint selective"
    "--optimizer adamw --checkpoint every:2"
    "--optimizer adamw --checkpoint budget:1MiB"
    "--optimizer adamw --precision bf16"
    "--optimizer adamw --precision fp16"
    "--optimizer adamw --precision fp8"
    "--optimizer adamw --micro-batch 2 --grad-accum 2"
    "--optimizer adamw --layerwise"
    "--optimizer adamw8bit --precision bf16 --checkpoint selective --layerwise"
    "--optimizer adafactor --precision bf16 --checkpoint full --micro-batch 2 --grad-accum 2"
  )
  configs=()
  for preset in tiny mini small; do
    for t in "${techniques[@]}"; do configs+=("$preset|$t"); done
  done
fi

largest_at_peak() { "$py" -c 'import json, sys
c = json.load(open(sys.argv[1]))["peak_bytes_by_category"]
k = max(c, key=c.get); print(f"{k} ({100 * c[k] / max(1, sum(c.values())):.0f}%)")' "$1"; }

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) threads; vocab $vocab, windows of $seq tokens, micro-batch 4 unless set"
echo
# The corpus is prepared once, before the first measured run: a run that trains the tokenizer peaks there.
"$bin" --model tiny --vocab-size "$vocab" --seq-len "$seq" --steps 1 --sample-tokens 0 --data-dir "$work/data" \
  --out-dir "$work/prepare" > "$work/prepare.log" 2>&1 || { cat "$work/prepare.log"; mt_die "preparing the corpus failed"; }

echo "| preset | flags | predicted | measured | error | reserved error | RSS error | plan s | largest at peak |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---|"
i=0
for config in "${configs[@]}"; do
  preset=${config%%|*} flags=${config#*|}
  i=$((i + 1))
  [[ $flags == *--micro-batch* ]] || flags="--micro-batch 4 $flags"
  # shellcheck disable=SC2206  # the flags are split on purpose
  args=(--model "$preset" --vocab-size "$vocab" --seq-len "$seq" $flags --steps 2 --sample-tokens 0 --data-dir "$work/data")
  "$bin" "${args[@]}" --plan-only --summary-json "$work/plan$i.json" > "$work/plan$i.log" 2>&1 ||
    { cat "$work/plan$i.log"; mt_die "plan of '$config' failed"; }
  "$bin" "${args[@]}" --out-dir "$work/run$i" --summary-json "$work/run$i.json" > "$work/run$i.log" 2>&1 ||
    { cat "$work/run$i.log"; mt_die "run of '$config' failed"; }
  predicted=$(json "$work/plan$i.json" predicted peak_bytes_total)
  measured=$(json "$work/run$i.json" peak_bytes_total)
  reserved_p=$(json "$work/plan$i.json" predicted reserved_bytes) reserved_m=$(json "$work/run$i.json" reserved_bytes)
  rss_p=$(json "$work/plan$i.json" predicted peak_rss_bytes) rss_m=$(json "$work/run$i.json" peak_rss_bytes)
  seconds=$(json "$work/plan$i.json" predicted seconds)
  awk -v p="$predicted" -v m="$measured" -v rp="$reserved_p" -v rm="$reserved_m" -v sp="$rss_p" -v sm="$rss_m" \
    -v s="$seconds" -v pre="$preset" -v f="$flags" -v big="$(largest_at_peak "$work/run$i.json")" \
    'BEGIN { printf "| %s | %s | %d | %d | %+.2f%% | %+.1f%% | %+.1f%% | %.3f | %s |\n", pre, f, p, m, 100 * (p / m - 1),
             100 * (rp / rm - 1), 100 * (sp / sm - 1), s, big }'
done

#!/usr/bin/env bash
# The optimizer table of issue 4: the same GPT run (train_gpt on the prepared fortunes corpus) with each
# optimizer, then optimizer-state bytes, peak total bytes (memtrain's accounting) and the final val loss
# from each run's summary.json, with ratios against fp32 AdamW.
#   bench/optimizer_table.sh [steps=300] [model=mini] [micro_batch=8]
# Environment: MEMTRAIN_BUILD_DIR (default build), OMP_NUM_THREADS as usual.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MEMTRAIN_BUILD_DIR:-build}
[[ $build = /* ]] || build=$root/$build
steps=${1:-300} model=${2:-mini} micro=${3:-8}
out=${MEMTRAIN_TABLE_DIR:-$root/runs/optimizer_table}
mkdir -p "$out"
# Learning rates per family: Lion wants ~3-10x less than AdamW (its update has unit magnitude).
declare -A lr=([adamw]=1e-3 [adamw8bit]=1e-3 [lion]=2e-4 [lion8bit]=2e-4 [adafactor]=3e-3)
for opt in adamw adamw8bit lion lion8bit adafactor; do
  echo "== $opt (lr ${lr[$opt]})" >&2
  "$build/examples/memtrain_train_gpt" --model "$model" --steps "$steps" --micro-batch "$micro" \
    --optimizer "$opt" --lr "${lr[$opt]}" --data-dir "$root/data/fortunes" --out-dir "$out/$opt" \
    --sample-tokens 0 > "$out/$opt.log" 2>&1
done
python3 - "$out" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
rows = {o: json.loads((out / o / "summary.json").read_text()) for o in ["adamw", "adamw8bit", "lion", "lion8bit", "adafactor"]}
base = rows["adamw"]
mib = lambda b: b / 1048576
print("| optimizer | state MiB | state vs adamw | peak total MiB | peak vs adamw | val loss | val vs adamw |")
print("|---|---|---|---|---|---|---|")
for o, r in rows.items():
    print(f"| {o} | {mib(r['optimizer_state_bytes']):.2f} | {r['optimizer_state_bytes'] / base['optimizer_state_bytes']:.3f} | "
          f"{mib(r['peak_bytes_total']):.1f} | {r['peak_bytes_total'] / base['peak_bytes_total']:.3f} | "
          f"{r['final_val_loss']:.4f} | {r['final_val_loss'] / base['final_val_loss'] - 1:+.2%} |")
PY

#!/usr/bin/env bash
# The GaLore evidence of issue 5: the same GPT run (train_gpt on the prepared fortunes corpus, same steps and
# seed) with full-rank AdamW, GaLore over AdamW and 8-bit GaLore (GaLore over AdamW8bit) at rank n_embd/4,
# then val loss, optimizer-state bytes, peak bytes and median step time (SVD refreshes included) from each
# run's summary.json, against AdamW.
#   bench/galore_table.sh [steps=300] [model=mini] [micro_batch=8] [rank=64] [gap=100]
# GaLore runs at 4x AdamW's lr: its projected update is scaled by alpha = 0.25 (the reference's default pair is
# lr 0.01 with scale 0.25 against an AdamW baseline of 1e-3), so the projected weights see the same step size.
# Environment: MEMTRAIN_BUILD_DIR (default build), OMP_NUM_THREADS as usual.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MEMTRAIN_BUILD_DIR:-build}
[[ $build = /* ]] || build=$root/$build
steps=${1:-300} model=${2:-mini} micro=${3:-8} rank=${4:-64} gap=${5:-100}
out=${MEMTRAIN_TABLE_DIR:-$root/runs/galore_table}
mkdir -p "$out"
run() {  # name, then train_gpt flags
  local name=$1
  shift
  echo "== $name: $*" >&2
  "$build/examples/memtrain_train_gpt" --model "$model" --steps "$steps" --micro-batch "$micro" \
    --data-dir "$root/data/fortunes" --out-dir "$out/$name" --sample-tokens 0 "$@" > "$out/$name.log" 2>&1
}
run adamw --optimizer adamw --lr 1e-3
run galore --optimizer adamw --lr 4e-3 --galore-rank "$rank" --galore-gap "$gap"
run galore8bit --optimizer adamw8bit --lr 4e-3 --galore-rank "$rank" --galore-gap "$gap"
python3 - "$out" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
rows = {o: json.loads((out / o / "summary.json").read_text()) for o in ["adamw", "galore", "galore8bit"]}
base = rows["adamw"]
mib = lambda b: b / 1048576
print("| run | state MiB | state cut | peak total MiB | val loss | val vs adamw | median step s | step vs adamw |")
print("|---|---|---|---|---|---|---|---|")
for o, r in rows.items():
    print(f"| {o} | {mib(r['optimizer_state_bytes']):.2f} | {1 - r['optimizer_state_bytes'] / base['optimizer_state_bytes']:.1%} | "
          f"{mib(r['peak_bytes_total']):.1f} | {r['final_val_loss']:.4f} | {r['final_val_loss'] / base['final_val_loss'] - 1:+.2%} | "
          f"{r['median_step_seconds']:.3f} | {r['median_step_seconds'] / base['median_step_seconds'] - 1:+.1%} |")
PY

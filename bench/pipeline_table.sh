#!/usr/bin/env bash
# Pipeline parallelism measured (docs/results/pipeline.md): memtrain_train_gpt alone (the canonical reduction,
# 1 thread: the reference bits; and 2 threads: the speed peer) against --pipeline-stages P under mpirun (one
# thread per rank) in the 1F1B and the GPipe order, with the same global batch of ACCUM micro-batches. Prints a
# markdown table: final train and val loss (and whether they equal the reference to the last bit), median step,
# and per stage the peak, the parameter bytes, the optimizer state, the activations' peak and the idle fraction.
#   [SKIP_BUILD=1] [MODEL=small] [STAGES="2 4"] [STEPS=20] [MICRO=4] [ACCUM=8] [SEQ=128] bash bench/pipeline_table.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
source bench/train_gpt_common.sh
model=${MODEL:-small} stages=${STAGES:-"2 4"} steps=${STEPS:-20} micro=${MICRO:-4} accum=${ACCUM:-8} seq=${SEQ:-128}
[[ -n ${WORK:-} ]] || trap 'rm -rf "$work"' EXIT
mpi=(mpirun --allow-run-as-root --oversubscribe)
export OMPI_MCA_btl_vader_single_copy_mechanism=none
common=(--model "$model" --seq-len "$seq" --micro-batch "$micro" --grad-accum "$accum" --steps "$steps"
        --optimizer adamw --sample-tokens 0 --checkpoint-interval 0 --data-dir "$work/data" ${EXTRA:-})
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $model, T=$seq, micro-batch $micro x $accum, $steps steps"

# The corpus is prepared once, by the first run; the pipeline runs find it.
run alone_1t 1 -- --canonical-reduction
run alone_2t 2 -- --canonical-reduction
names=(alone_1t alone_2t)
for p in $stages; do
  for schedule in 1f1b gpipe; do
    run "pp${p}_$schedule" 1 "${mpi[@]}" -np "$p" -- --pipeline-stages "$p" --pipeline-schedule "$schedule"
    names+=("pp${p}_$schedule")
  done
done

python3 - "$work" "${names[@]}" <<'EOF'
import json, struct, sys
work, names = sys.argv[1], sys.argv[2:]
mib = lambda b: f"{b / 2**20:.2f}"
bits = lambda x: struct.pack("<d", x)
runs = {n: json.load(open(f"{work}/{n}.json")) for n in names}
ref = runs["alone_1t"]
print("| run | final loss | val loss | same bits as alone | median step (s) | stage: peak / params / optimizer state / activations peak (MiB), idle |")
print("|---|---|---|---|---|---|")
for n in names:
    r = runs[n]
    same = bits(r["final_train_loss"]) == bits(ref["final_train_loss"]) and bits(r["final_val_loss"]) == bits(ref["final_val_loss"])
    if r.get("stages"):
        cells = "<br>".join(
            f"{s['stage']}: {mib(s['peak_bytes_total'])} / {mib(s['peak_bytes_by_category']['parameters'])} / "
            f"{mib(s['optimizer_state_bytes'])} / {mib(s['peak_bytes_by_category']['activations'])}, "
            f"{100 * s['idle_fraction']:.0f}%" for s in r["stages"])
    else:
        cells = (f"alone: {mib(r['peak_bytes_total'])} / {mib(r['peak_bytes_by_category']['parameters'])} / "
                 f"{mib(r['optimizer_state_bytes'])} / {mib(r['peak_bytes_by_category']['activations'])}")
    print(f"| {n} | {r['final_train_loss']:.6f} | {r['final_val_loss']:.6f} | {'yes' if same else 'no'} | "
          f"{r['median_step_seconds']:.3f} | {cells} |")
EOF

#!/usr/bin/env bash
# Tensor parallelism measured (docs/results/tensor_parallel.md): memtrain_train_gpt alone (1 thread, the
# reference; 2 threads, the speed peer) against --tensor-parallel 2 under mpirun (one thread per rank), the same
# batches. Prints a markdown table: final train and val loss, the largest relative difference of any step's loss
# from the run alone's (metrics.jsonl), median step, every rank's peak, and rank 0's bytes by category at its
# peak (the summary's peak_bytes_by_category). The runs alone sum their micro-batches in the canonical tree, as
# data-parallel runs do.
#   [SKIP_BUILD=1] [MODEL=small] [TP=2] [STEPS=20] [MICRO=4] [ACCUM=1] [SEQ=128] [VOCAB=N] \
#     bash bench/tensor_parallel_table.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
source bench/train_gpt_common.sh
model=${MODEL:-small} tp=${TP:-2} steps=${STEPS:-20} micro=${MICRO:-4} accum=${ACCUM:-1} seq=${SEQ:-128}
[[ -n ${WORK:-} ]] || trap 'rm -rf "$work"' EXIT
mpi=(mpirun --allow-run-as-root --oversubscribe)
export OMPI_MCA_btl_vader_single_copy_mechanism=none
common=(--model "$model" --seq-len "$seq" --micro-batch "$micro" --steps "$steps"
        --optimizer adamw --sample-tokens 0 --checkpoint-interval 0 --data-dir "$work/data"
        ${VOCAB:+--vocab-size "$VOCAB"} ${EXTRA:-})
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $model, T=$seq," \
     "micro-batch $micro x $accum, $steps steps"

# The corpus is prepared once, by the first run; the others find it.
run alone_1t 1 -- --canonical-reduction --grad-accum "$accum"
run alone_2t 2 -- --canonical-reduction --grad-accum "$accum"
run "tp$tp" 1 "${mpi[@]}" -np "$tp" -- --tensor-parallel "$tp" --grad-accum "$accum"
grep -m1 "^model:" "$work/tp$tp.log"
names=(alone_1t alone_2t "tp$tp")
# WITH_DATA=1: also 2 data ranks of that group (2 x TP ranks; ACCUM even: each data rank takes half the
# micro-batches, the same global batch) and 2 data ranks of a 2-stage pipeline.
if [[ ${WITH_DATA:-0} == 1 ]]; then
  run "dp2_tp$tp" 1 "${mpi[@]}" -np $((2 * tp)) -- --tensor-parallel "$tp" --grad-accum $((accum / 2))
  run dp2_pp2 1 "${mpi[@]}" -np 4 -- --pipeline-stages 2 --grad-accum $((accum / 2))
  names+=("dp2_tp$tp" dp2_pp2)
fi

python3 - "$work" "${names[@]}" <<'EOF_PY'
import json, sys
work, names = sys.argv[1], sys.argv[2:]
mib = lambda b: f"{b / 2**20:.2f}"
runs = {n: json.load(open(f"{work}/{n}.json")) for n in names}
losses = {n: [json.loads(l)["loss"] for l in open(f"{work}/{n}/metrics.jsonl")] for n in names}
ref = losses["alone_1t"]
print("| run | final loss | val loss | max rel. step-loss diff vs alone_1t | median step (s) | peak per rank (MiB) "
      "| rank 0 at its peak: params / optimizer state / gradients / activations / workspace (MiB) |")
print("|---|---|---|---|---|---|---|")
for n in names:
    r = runs[n]
    diff = max(abs(a - b) / abs(b) for a, b in zip(losses[n], ref))
    peaks = ", ".join(mib(x["peak_bytes_total"]) for x in r["ranks"]) if r.get("ranks") else mib(r["peak_bytes_total"])
    c = r["peak_bytes_by_category"]
    at_peak = " / ".join(mib(c[k]) for k in ("parameters", "optimizer_state", "gradients", "activations", "workspace"))
    print(f"| {n} | {r['final_train_loss']:.6f} | {r['final_val_loss']:.6f} | {diff:.1e} | "
          f"{r['median_step_seconds']:.3f} | {peaks} | {at_peak} |")
EOF_PY

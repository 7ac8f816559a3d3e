#!/usr/bin/env bash
# Optimizer offload to files measured (docs/results/offload.md): memtrain_train_gpt with the optimizer state in
# memory against --offload-optimizer file:DIR, the same batches, REPEAT runs of each in turns (in, out, in, out,
# ...). Prints a markdown table: whether every step's loss is the same bits, the optimizer state's bytes, the peak
# RSS (the OS's VmHWM) and the allocator's peak, and the median step time (the median over runs of each run's
# median), with the ratios to the in-memory runs.
#   [SKIP_BUILD=1] [MODEL=gpt2-124M] [STEPS=10] [MICRO=2] [SEQ=128] [THREADS=2] [REPEAT=2] [OPTIMIZER=adamw] \
#     [OFFLOAD_DIR=dir] bash bench/offload_table.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
source bench/train_gpt_common.sh
model=${MODEL:-gpt2-124M} steps=${STEPS:-10} micro=${MICRO:-2} seq=${SEQ:-128} threads=${THREADS:-2}
repeat=${REPEAT:-2} optimizer=${OPTIMIZER:-adamw}
[[ -n ${WORK:-} ]] || trap 'rm -rf "$work"' EXIT
offload_dir=${OFFLOAD_DIR:-$work/offload}
mkdir -p "$offload_dir"
common=(--model "$model" --seq-len "$seq" --micro-batch "$micro" --grad-accum 1 --steps "$steps"
        --optimizer "$optimizer" --sample-tokens 0 --checkpoint-interval 0 --data-dir "$work/data" ${EXTRA:-})
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $threads threads; $model, T=$seq," \
     "micro-batch $micro, $steps steps, $optimizer; offload directory on $(df --output=source "$offload_dir" | tail -1)"

names=()
for ((i = 1; i <= repeat; ++i)); do
  run "memory_$i" "$threads" -- --offload-optimizer none
  run "files_$i" "$threads" -- --offload-optimizer "file:$offload_dir"
  names+=("memory_$i" "files_$i")
done
grep -m1 "^optimizer state in" "$work/files_1.log"

python3 - "$work" "${names[@]}" <<'EOF_PY'
import json, statistics, sys
work, names = sys.argv[1], sys.argv[2:]
mib = lambda b: f"{b / 2**20:.1f}"
runs = {n: json.load(open(f"{work}/{n}.json")) for n in names}
losses = {n: [json.loads(l)["loss"] for l in open(f"{work}/{n}/metrics.jsonl")] for n in names}
kinds = {"memory": [n for n in names if n.startswith("memory")], "files": [n for n in names if n.startswith("files")]}
med = lambda kind, key: statistics.median(runs[n][key] for n in kinds[kind])
same = all(losses[n] == losses[kinds["memory"][0]] for n in names)
print(f"every step's loss the same bits in all {len(names)} runs: {same}")
print("| state | optimizer state (MiB) | in files (MiB) | peak RSS (MiB) | allocator peak (MiB) | median step (s) |")
print("|---|---|---|---|---|---|")
for kind in ("memory", "files"):
    r = runs[kinds[kind][0]]
    rss, step = med(kind, "peak_rss_bytes"), med(kind, "median_step_seconds")
    rss_x = f" ({rss / med('memory', 'peak_rss_bytes'):.2f}x)" if kind == "files" else ""
    step_x = f" ({step / med('memory', 'median_step_seconds'):.2f}x)" if kind == "files" else ""
    print(f"| {kind} | {mib(r['optimizer_state_bytes'])} | {mib(r['offloaded_state_bytes'])} | {mib(rss)}{rss_x} "
          f"| {mib(med(kind, 'peak_bytes_total'))} | {step:.3f}{step_x} |")
print("peak RSS cut:", mib(med("memory", "peak_rss_bytes") - med("files", "peak_rss_bytes")), "MiB; state:",
      mib(runs[kinds["memory"][0]]["optimizer_state_bytes"]), "MiB")
EOF_PY

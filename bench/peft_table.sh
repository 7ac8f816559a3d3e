#!/usr/bin/env bash
# Parameter-efficient fine-tuning on gpt2-124M (windows of 256, micro-batch 4), memtrain_train_gpt: the total
# peak and the median step of full fine-tuning (fp32 AdamW, the reference of the peaks; and bf16 AdamW, the
# reference of the step times) against LoRA r=8, QLoRA (NF4 base) r=8 and LISA (2 blocks, a new draw every
# step), all three at bf16 with AdamW. Runs alternate, ROUNDS of each, so drifting load hits every
# configuration; a run's step time is the median of its steps after the first, and the table gives the median
# over rounds. The peak is the allocator's (the run summary's peak_bytes_total; the same in every round). For
# LISA it also prints the peak after every step: flat once the first draw has its state, whatever blocks the
# later draws pick.
#
# Usage: bench/peft_table.sh
# Environment: MEMTRAIN_BUILD_DIR (build), SKIP_BUILD=1, STEPS (6), ROUNDS (2), WORK (scratch dir).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
cd "$MEMTRAIN_ROOT"
# shellcheck source=bench/train_gpt_common.sh
source bench/train_gpt_common.sh
steps=${STEPS:-6} rounds=${ROUNDS:-2}

base=(--model gpt2-124M --seq-len 256 --micro-batch 4 --checkpoint-interval 0 --sample-tokens 0 --optimizer adamw
      --seed 3 --data-dir "$work/data")
declare -A flags=(
  [full_fp32]=""
  [full_bf16]="--precision bf16"
  [lora]="--precision bf16 --lora-rank 8"
  [qlora]="--precision bf16 --lora-rank 8 --quantize-base nf4"
  [lisa]="--precision bf16 --lisa-layers 2 --lisa-interval 1"
)
order=(full_fp32 full_bf16 lora qlora lisa)

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, OMP_NUM_THREADS=2; gpt2-124M, T 256, B 4," \
     "$steps steps (median after the first), $rounds rounds"
OMP_NUM_THREADS=2 "$bin" "${base[@]}" --steps 1 --out-dir "$work/prep" > "$work/prep.log" 2>&1 ||
  { cat "$work/prep.log"; mt_die "the preparation run (tokenizing the corpus) failed"; }
for ((r = 1; r <= rounds; ++r)); do
  for name in "${order[@]}"; do
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=2 "$bin" "${base[@]}" --steps "$steps" ${flags[$name]} --out-dir "$work/$name.$r" > "$work/$name.$r.log" 2>&1 ||
      { cat "$work/$name.$r.log"; mt_die "$name failed"; }
  done
done
"$py" - "$work" "$rounds" "${order[@]}" <<'PY'
import json, statistics, sys
work, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def run(name, r):
    rows = [json.loads(l) for l in open(f"{work}/{name}.{r}/metrics.jsonl")]
    summary = json.load(open(f"{work}/{name}.{r}/summary.json"))
    return rows, summary
table = {}
for name in names:
    steps, peaks = [], set()
    for r in range(1, rounds + 1):
        rows, summary = run(name, r)
        steps.append(statistics.median(x["step_seconds"] for x in rows[1:]))
        peaks.add(summary["peak_bytes_total"])
        cats = summary["peak_bytes_by_category"]
    table[name] = (max(peaks), statistics.median(steps), cats)
ref_peak, ref_step = table["full_fp32"][0], table["full_bf16"][1]
print(f"{'run':10} {'peak bytes':>14} {'vs full fp32':>12} {'median step s':>14} {'vs full bf16':>12}  at-peak MiB: params grads state acts workspace")
for name in names:
    peak, step, cats = table[name]
    mib = lambda k: cats[k] / 2**20
    print(f"{name:10} {peak:14,d} {peak / ref_peak:11.1%} {step:14.3f} {step / ref_step:11.2f}x  "
          f"{mib('parameters'):.0f} {mib('gradients'):.0f} {mib('optimizer_state'):.0f} {mib('activations'):.0f} {mib('workspace'):.0f}")
print(f"qlora / lora step: {table['qlora'][1] / table['lora'][1]:.2f}x")
rows, _ = run("lisa", rounds)
print("lisa peak after each step:", [x["peak_bytes"] for x in rows], "blocks:", [x["lisa_blocks"] for x in rows])
PY

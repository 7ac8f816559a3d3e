#!/usr/bin/env bash
# Data parallel speed on one host: the small GPT trained by memtrain_train_gpt as 1 rank x 2 threads
# (grad_accum 2) against 2 ranks x 1 thread under mpirun (grad_accum 1 each): the same global batch, the same
# bits. Runs alternate (ROUNDS of each, interleaved, so drifting load hits both) and each run's step times
# are medians over its steps after the first WARMUP. Prints one row per run and the ratio of the medians of
# the runs' medians (2 ranks / 1 rank, in tokens per second), then the data-parallel line of the last 2-rank
# run (time summing gradients and time the trainer waited for those sums).
#
# Usage: bench/data_parallel_table.sh
# Environment: MEMTRAIN_BUILD_DIR (build), SKIP_BUILD=1, STEPS (14), WARMUP (4), ROUNDS (3), SEQ (128),
#   MICRO (4), ZERO (0: the ZeRO stage of the 2-rank runs), WORK (scratch dir, default a mktemp).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
cd "$MEMTRAIN_ROOT"

# shellcheck source=bench/train_gpt_common.sh
source bench/train_gpt_common.sh
steps=${STEPS:-14} warmup=${WARMUP:-4} rounds=${ROUNDS:-3} seq=${SEQ:-128} micro=${MICRO:-4} zero=${ZERO:-0}
command -v mpirun > /dev/null || mt_die "mpirun is missing (bash scripts/setup.sh installs Open MPI)"
mpirun_cmd=(mpirun --allow-run-as-root --oversubscribe -np 2)
export OMPI_MCA_btl_vader_single_copy_mechanism=none  # see docs/distributed.md

base=(--model small --seq-len "$seq" --micro-batch "$micro" --sample-tokens 0 --seed 3 --data-dir "$work/data")
# Median step seconds after the warm-up steps, and the tokens per second that makes, from a metrics file.
step_stats() { "$py" -c 'import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][int(sys.argv[2]):]
s = statistics.median(r["step_seconds"] for r in rows)
print(s, rows[0]["tokens"] / s)' "$1" "$warmup"; }

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; small GPT, windows of $seq, global batch" \
     "2 x $micro windows, $steps steps (median after $warmup), $rounds rounds"
# The corpus is tokenized once, before anything is timed.
OMP_NUM_THREADS=2 "$bin" "${base[@]}" --steps 1 --out-dir "$work/prep" > "$work/prep.log" 2>&1 ||
  { cat "$work/prep.log"; mt_die "the preparation run failed"; }

declare -a one two
printf '%-22s %5s %14s %12s\n' run round "median step s" "tokens/s"
for ((r = 1; r <= rounds; ++r)); do
  OMP_NUM_THREADS=2 "$bin" "${base[@]}" --steps "$steps" --grad-accum 2 --checkpoint-interval 0 --out-dir "$work/one$r" > "$work/one$r.log" 2>&1 ||
    { cat "$work/one$r.log"; mt_die "1 rank x 2 threads failed"; }
  read -r s rate < <(step_stats "$work/one$r/metrics.jsonl")
  one+=("$s")
  printf '%-22s %5d %14.3f %12.0f\n' "1 rank x 2 threads" "$r" "$s" "$rate"
  OMP_NUM_THREADS=1 "${mpirun_cmd[@]}" "$bin" "${base[@]}" --steps "$steps" --grad-accum 1 --zero "$zero" \
    --checkpoint-interval 0 --out-dir "$work/two$r" \
    > "$work/two$r.log" 2>&1 || { cat "$work/two$r.log"; mt_die "2 ranks x 1 thread failed"; }
  read -r s rate < <(step_stats "$work/two$r/metrics.jsonl")
  two+=("$s")
  printf '%-22s %5d %14.3f %12.0f\n' "2 ranks x 1 thread z$zero" "$r" "$s" "$rate"
done
"$py" -c 'import statistics, sys
n = len(sys.argv) // 2
one, two = statistics.median(map(float, sys.argv[1:1 + n])), statistics.median(map(float, sys.argv[1 + n:]))
print(f"median step: 1 rank x 2 threads {one:.3f} s, 2 ranks x 1 thread {two:.3f} s; "
      f"2 ranks reach {one / two:.2f}x the tokens/s of 1 rank")' "${one[@]}" "${two[@]}"
grep "^data parallel:" "$work/two$rounds.log" || true

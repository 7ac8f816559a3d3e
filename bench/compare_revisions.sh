#!/usr/bin/env bash
# Step time of an earlier revision beside this tree's, in one session: the GPT training step (bench_gpt_e2e)
# and the GEMM bench (bench_gemm's oneDNN f32/bf16 and OpenBLAS f32, 2048x768x768, 2 threads). Answers "did
# this change slow the CPU path?" with both sides measured on the same machine, alternating, so a change of
# load hits both.
#
# The base is built in a git worktree of its own ($BASE_WORKTREE, $BASE_BUILD_DIR: only its two bench targets,
# CUDA off); this tree's binaries come from $MEMTRAIN_BUILD_DIR (built first unless SKIP_BUILD=1). Each round
# runs, per precision: base, this tree, then this tree with $VARIANT_ARGS when set (to switch off a later
# speed-up the base lacks, e.g. "--head-grads recompute"). Prints the CPU, then one line per run; the medians
# of the per-run median step times are the figures to quote. OpenBLAS in the GEMM rows does not change between
# revisions: how far its two rows differ is the noise of the session.
#
# Usage: BASE=f13c614 bench/compare_revisions.sh
# Environment: BASE (required), ROUNDS (3), GPT_ARGS (the bench_gpt_e2e arguments below), PRECISIONS
#   ("fp32 bf16"), VARIANT_ARGS (none), MEMTRAIN_BUILD_DIR (build), BASE_WORKTREE (/tmp/memtrain-base),
#   BASE_BUILD_DIR (build-base), SKIP_BUILD=1 to use existing binaries on both sides.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
cd "$MEMTRAIN_ROOT"

base=${BASE:?set BASE to the revision to compare with}
rounds=${ROUNDS:-3}
gpt_args=${GPT_ARGS:-"--model small --seq-len 256 --batch 8 --steps 8 --warmup 2 --threads $(nproc)"}
precisions=${PRECISIONS:-"fp32 bf16"}
variant_args=${VARIANT_ARGS:-}
build_dir=${MEMTRAIN_BUILD_DIR:-build}
base_tree=${BASE_WORKTREE:-/tmp/memtrain-base}
base_build=${BASE_BUILD_DIR:-build-base}
[[ $base_build = /* ]] || base_build="$MEMTRAIN_ROOT/$base_build"

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  mt_step "compare: build this tree's benches in $build_dir"
  MEMTRAIN_BUILD_DIR=$build_dir bash scripts/build.sh bench_gpt_e2e bench_gemm
  mt_step "compare: build $base's benches in $base_build (worktree $base_tree)"
  [[ -d $base_tree ]] || mt_run git worktree add --detach "$base_tree" "$base"
  mt_run git -C "$base_tree" checkout -q --detach "$base"
  (cd "$base_tree" && MEMTRAIN_BUILD_DIR=$base_build MEMTRAIN_CUDA=OFF MEMTRAIN_WERROR=OFF \
    bash scripts/build.sh bench_gpt_e2e bench_gemm)
fi

mt_step "compare: $(git -C "$base_tree" rev-parse --short HEAD) (base) vs $(git rev-parse --short HEAD) (this tree)"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), family $(grep -m1 'cpu family' /proc/cpuinfo |
  cut -d: -f2 | tr -d ' ') model $(grep -m1 '^model\s*:' /proc/cpuinfo | cut -d: -f2 | tr -d ' '),"\
  "$(grep -o -m1 'avx512_bf16' /proc/cpuinfo || echo 'no avx512_bf16'), $(nproc) cpus"

median_step() { "$@" 2>&1 | grep -o 'median step [0-9.]* ms' || echo "failed: $*"; }
read -r -a gpt <<<"$gpt_args"
read -r -a variant <<<"$variant_args"
for ((r = 1; r <= rounds; r++)); do
  for p in $precisions; do
    echo "round $r $p base: $(median_step "$base_build/bench/bench_gpt_e2e" "${gpt[@]}" --precision "$p")"
    echo "round $r $p this: $(median_step "$build_dir/bench/bench_gpt_e2e" "${gpt[@]}" --precision "$p")"
    if ((${#variant[@]} > 0)); then
      echo "round $r $p this ${variant[*]}: $(median_step "$build_dir/bench/bench_gpt_e2e" "${gpt[@]}" \
        --precision "$p" "${variant[@]}")"
    fi
  done
done

gemm_filter='gemm/(f32|bf16)/(onednn|openblas)/fwd_NN/2048x768x768/threads:2/real_time'
for ((r = 1; r <= rounds; r++)); do
  for side in base this; do
    bin=$build_dir/bench/bench_gemm
    [[ $side == base ]] && bin=$base_build/bench/bench_gemm
    "$bin" --benchmark_filter="$gemm_filter" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
      2>&1 | grep median | awk -v s="$side" -v r="$r" '{print "round " r " " s ": " $1 " " $2 " " $3}'
  done
done

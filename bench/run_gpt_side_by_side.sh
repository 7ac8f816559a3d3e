#!/usr/bin/env bash
# End-to-end GPT training step, memtrain beside libtorch, on this machine's CPU (fp32, AdamW, one process
# after the other). Builds bench_gpt_e2e and, when libtorch is installed, its peer gpt_step_torch; runs
# both on each config and prints a table: median step ms, tokens/s, peak RSS, and memtrain/peer ratios.
#
# memtrain runs untuned (plain environment). The peer runs tuned, and only the peer: jemalloc preloaded
# with page decay off (MALLOC_CONF dirty/muzzy_decay_ms:-1), OMP_WAIT_POLICY=PASSIVE, and
# OPENBLAS_CORETYPE=SkylakeX where the CPU has AVX-512 (on a CPU without it OpenBLAS's SkylakeX kernels
# die with SIGILL, so the variable is left unset there and OpenBLAS picks its kernels itself).
# Both get --threads $THREADS (default: nproc). Wall-clock time is what the table compares; each
# program also prints its CPU time per step, which shows how much a busy machine inflated the wall time.
#
# Usage: bench/run_gpt_side_by_side.sh [configs...]   config = model:seq_len:batch
#   default configs: small:256:8 gpt2-124M:256:4
# Environment: MEMTRAIN_BUILD_DIR (default build), STEPS (10), WARMUP (3), THREADS (nproc),
#   SKIP_BUILD=1 to use existing binaries.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
cd "$MEMTRAIN_ROOT"
warn() { printf 'warning: %s\n' "$*" >&2; }

build_dir=${MEMTRAIN_BUILD_DIR:-build}
steps=${STEPS:-10}
warmup=${WARMUP:-3}
threads=${THREADS:-$(nproc)}
configs=("$@")
((${#configs[@]} > 0)) || configs=(small:256:8 gpt2-124M:256:4)

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  MEMTRAIN_BUILD_DIR=$build_dir bash scripts/build.sh bench_gpt_e2e
  # bench/CMakeLists.txt defines the peer's target only when find_package(Torch) succeeded.
  if grep -q 'gpt_step_torch' "$build_dir/build.ninja"; then
    mt_run cmake --build "$build_dir" --parallel "${MEMTRAIN_JOBS:-2}" --target gpt_step_torch
  else
    warn "libtorch not found by CMake: running memtrain only"
  fi
fi
mt_bin=$build_dir/bench/bench_gpt_e2e
peer_bin=$build_dir/bench/torch_peer/gpt_step_torch
[[ -x $mt_bin ]] || mt_die "$mt_bin is missing (build it, or unset SKIP_BUILD)"

# The peer's environment.
peer_env=(OMP_WAIT_POLICY=PASSIVE)
find_jemalloc() {
  local f
  for f in /usr/lib/*-linux-gnu/libjemalloc.so.2 /usr/lib/libjemalloc.so.2; do
    [[ -e $f ]] && { echo "$f"; return; }
  done
}
jemalloc=$(find_jemalloc)
if [[ -z $jemalloc && -x $peer_bin ]] && command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
  mt_run apt-get install -y -q libjemalloc2 >/dev/null && jemalloc=$(find_jemalloc)
fi
if [[ -n $jemalloc ]]; then
  peer_env+=("LD_PRELOAD=$jemalloc" "MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1")
else
  warn "libjemalloc2 not found: the peer runs with glibc malloc"
fi
if grep -qw avx512f /proc/cpuinfo; then
  peer_env+=(OPENBLAS_CORETYPE=SkylakeX)
else
  warn "no AVX-512 on this CPU: OPENBLAS_CORETYPE=SkylakeX would SIGILL, so it is left unset for the peer"
fi

# Field `key` of a RESULT line.
field() { sed -n "s/.* $2=\([^ ]*\).*/\1/p" <<<"$1"; }

rows=()
for cfg in "${configs[@]}"; do
  IFS=: read -r model seq batch <<<"$cfg"
  args=(--model "$model" --seq-len "$seq" --batch "$batch" --steps "$steps" --warmup "$warmup" --threads "$threads")
  mt_step "memtrain $model T=$seq B=$batch (load: $(cut -d' ' -f1-3 /proc/loadavg))"
  mt_out=$("$mt_bin" "${args[@]}" | tee -a /dev/stderr | grep '^RESULT')
  peer_out=""
  if [[ -x $peer_bin ]]; then
    mt_step "libtorch $model T=$seq B=$batch, env: ${peer_env[*]} (load: $(cut -d' ' -f1-3 /proc/loadavg))"
    peer_out=$(env "${peer_env[@]}" "$peer_bin" "${args[@]}" | tee -a /dev/stderr | grep '^RESULT')
  fi
  rows+=("$model|$seq|$batch|$mt_out|$peer_out")
done

echo
printf '%-10s %4s %3s | %10s %10s %8s %9s | %10s %10s %8s | %7s %7s\n' model T B "mt ms" "mt tok/s" "mt RSS" \
  "mt alloc" "peer ms" "peer tok/s" "peer RSS" "ms x" "RSS x"
for row in "${rows[@]}"; do
  IFS='|' read -r model seq batch mt_out peer_out <<<"$row"
  mt_ms=$(field "$mt_out" step_ms) mt_tok=$(field "$mt_out" tok_s) mt_rss=$(field "$mt_out" rss_mib)
  mt_alloc=$(field "$mt_out" alloc_mib)
  if [[ -n $peer_out ]]; then
    p_ms=$(field "$peer_out" step_ms) p_tok=$(field "$peer_out" tok_s) p_rss=$(field "$peer_out" rss_mib)
    r_ms=$(awk -v a="$mt_ms" -v b="$p_ms" 'BEGIN { printf "%.2f", a / b }')
    r_rss=$(awk -v a="$mt_rss" -v b="$p_rss" 'BEGIN { printf "%.2f", a / b }')
  else
    p_ms=- p_tok=- p_rss=- r_ms=- r_rss=-
  fi
  printf '%-10s %4s %3s | %10s %10s %8s %9s | %10s %10s %8s | %7s %7s\n' "$model" "$seq" "$batch" "$mt_ms" "$mt_tok" \
    "${mt_rss}M" "${mt_alloc}M" "$p_ms" "$p_tok" "${p_rss}M" "$r_ms" "$r_rss"
done
echo "(ms x, RSS x: memtrain / libtorch; below 1 means memtrain is faster / smaller)"

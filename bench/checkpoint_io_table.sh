#!/usr/bin/env bash
# Checkpoint save and resume memory and time, one markdown row per run: bench_checkpoint_io saves once, then
# each program given loads the same file ROUNDS times, interleaved (a change in machine load hits all alike).
#
#   bench/checkpoint_io_table.sh MODEL OPTIMIZER ROUNDS PROGRAM [PROGRAM ...]
#
# PROGRAM is a bench_checkpoint_io binary: this build's, and for a before/after comparison the same source built
# against an older libmemtrain, e.g. (headers and library of revision REV, checked out and built in OLD):
#   c++ -O2 -std=c++20 -DFMT_SHARED -I OLD/include bench/bench_checkpoint_io.cpp -L OLD/build -l:libmemtrain.so \
#       -lfmt -fopenmp -Wl,-rpath,OLD/build -o /tmp/bench_checkpoint_io_REV
# Columns: the phase's file size, seconds, the allocator's live bytes after it and its peak during it, and the
# OS's RSS before and after it and its peak during it (VmHWM, reset at the phase's start).
set -euo pipefail
model=${1:?model}; optimizer=${2:?optimizer}; rounds=${3:?rounds}; shift 3
[ $# -ge 1 ] || { echo "usage: $0 MODEL OPTIMIZER ROUNDS PROGRAM [PROGRAM ...]" >&2; exit 2; }
dir=$(mktemp -d /tmp/checkpoint_io.XXXXXX)
trap 'rm -rf "$dir"' EXIT
cpu_field() { grep -m1 "^$1" /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'; }
bf16=no; grep -qw avx512_bf16 /proc/cpuinfo && bf16=yes
echo "CPU: $(cpu_field 'model name') (family $(cpu_field 'cpu family') model $(cpu_field 'model'), avx512_bf16 $bf16), $(nproc) cores; $(date -u +%F); $model, $optimizer"
echo
echo "| program | phase | file MiB | s | live after MiB | live peak MiB | RSS before MiB | RSS after MiB | RSS peak MiB |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
row() {  # program phase
  local line
  line=$("$1" --phase "$2" --dir "$dir" --model "$model" --optimizer "$optimizer" | grep '^RESULT')
  local v; v() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$line"; }
  echo "| $(basename "$1") | $2 | $(v file_mib) | $(v seconds) | $(v live_after_mib) | $(v live_peak_mib) | $(v rss_before_mib) | $(v rss_after_mib) | $(v rss_peak_mib) |"
}
row "$1" save
for ((r = 0; r < rounds; ++r)); do
  for program in "$@"; do row "$program" load; done
done

#!/usr/bin/env bash
# Step time, peak RSS and peak reserved bytes of bench_gpt_e2e under two or more sets of flags, one binary,
# alternating within each round, so that a change of load on this shared machine hits every variant alike. For a
# switch that the library keeps both ways (amp::WeightCasts, the allocator's reserve cap, the heap release),
# this is the interleaved comparison: the medians over rounds of each variant's median step are the figures.
#
# Usage: bench/ab_gpt_e2e.sh "label|flags" "label|flags" ...
#   e.g. bench/ab_gpt_e2e.sh "old|--reserve-slack none --release-heap no" "new|"
# Environment: ROUNDS (3), GPT_ARGS (the common bench_gpt_e2e arguments below), MEMTRAIN_BUILD_DIR (build),
#   SKIP_BUILD=1 to use the built bench.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
cd "$MEMTRAIN_ROOT"

(($# >= 2)) || mt_die "usage: bench/ab_gpt_e2e.sh \"label|flags\" \"label|flags\" ..."
rounds=${ROUNDS:-3}
gpt_args=${GPT_ARGS:-"--model gpt2-124M --seq-len 256 --batch 4 --steps 4 --warmup 2 --threads $(nproc)"}
build_dir=${MEMTRAIN_BUILD_DIR:-build}
[[ ${SKIP_BUILD:-0} == 1 ]] || MEMTRAIN_BUILD_DIR=$build_dir bash scripts/build.sh bench_gpt_e2e
bin=$build_dir/bench/bench_gpt_e2e

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), family $(grep -m1 'cpu family' /proc/cpuinfo |
  cut -d: -f2 | tr -d ' ') model $(grep -m1 '^model\s*:' /proc/cpuinfo | cut -d: -f2 | tr -d ' '),"\
  "$(grep -o -m1 'avx512_bf16' /proc/cpuinfo || echo 'no avx512_bf16'), $(nproc) cpus; $gpt_args"
read -r -a common <<<"$gpt_args"
declare -A steps
for ((r = 1; r <= rounds; r++)); do
  for variant in "$@"; do
    label=${variant%%|*}
    read -r -a flags <<<"${variant#*|}"
    line=$("$bin" "${common[@]}" "${flags[@]}" 2>&1 | grep '^RESULT') || mt_die "bench_gpt_e2e failed for '$variant'"
    step=$(sed -n 's/.* step_ms=\([0-9.]*\).*/\1/p' <<<"$line")
    steps[$label]+="$step "
    echo "round $r $label: $line"
  done
done
for variant in "$@"; do
  label=${variant%%|*}
  # shellcheck disable=SC2086  # the step times are split on purpose
  echo "median of $label: $(printf '%s\n' ${steps[$label]} | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}') ms"
done

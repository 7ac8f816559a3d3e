#!/usr/bin/env bash
# Configures and builds memtrain with Ninja. Re-running it reconfigures in place and rebuilds only what
# changed. Arguments, if any, are the Ninja targets to build (default: everything).
#
# Environment (all optional):
#   MEMTRAIN_BUILD_DIR   build directory (default: build, or build-asan when MEMTRAIN_SANITIZE=1)
#   MEMTRAIN_BUILD_TYPE  CMAKE_BUILD_TYPE (default: Release; RelWithDebInfo when sanitizing, there at -O1 -g1)
#   MEMTRAIN_JOBS        parallel compile jobs (default: 2)
#   MEMTRAIN_CUDA        AUTO (default: build CUDA when /usr/local/cuda/bin/nvcc exists), ON, OFF;
#                        default OFF when sanitizing (ASan does not look inside CUDA kernels)
#   MEMTRAIN_BENCH       ON / OFF: build the benchmarks (default ON; OFF when sanitizing, to save CI time)
#   MEMTRAIN_SANITIZE    1 = AddressSanitizer + UndefinedBehaviorSanitizer build
#   MEMTRAIN_WERROR      ON / OFF: compiler warnings are errors (default ON when CI=true, except in the
#                        sanitizer build; OFF otherwise)
#   MEMTRAIN_CMAKE_ARGS  extra arguments for the configure step, split on spaces
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$MEMTRAIN_ROOT"

sanitize=${MEMTRAIN_SANITIZE:-0}
type_flags=()
if [[ $sanitize == 1 ]]; then
  build_dir=${MEMTRAIN_BUILD_DIR:-build-asan}
  build_type=${MEMTRAIN_BUILD_TYPE:-RelWithDebInfo}
  cuda=${MEMTRAIN_CUDA:-OFF}
  sanitize_flag=ON
  # The sanitizer build exists to run the tests; benchmarks are timed in the normal build only.
  bench=${MEMTRAIN_BENCH:-OFF}
  # -O1 -g1 instead of RelWithDebInfo's -O2 -g: half the compile time (galore_projector.cpp, Eigen's SVD:
  # 167 s -> 81 s), while ASan and UBSan reports keep function names and line numbers.
  [[ $build_type == RelWithDebInfo ]] && type_flags=(-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG")
else
  build_dir=${MEMTRAIN_BUILD_DIR:-build}
  build_type=${MEMTRAIN_BUILD_TYPE:-Release}
  cuda=${MEMTRAIN_CUDA:-AUTO}
  sanitize_flag=OFF
  bench=${MEMTRAIN_BENCH:-ON}
fi
jobs=${MEMTRAIN_JOBS:-2}
# Always passed, so a build directory configured by CI and reused by hand (or the other way) follows the
# environment rather than its cache. In CI only the normal build defaults to -Werror: the sanitizer build
# (-O1, instrumented) has not been checked warning-free with every compiler CI may use.
if [[ -n ${MEMTRAIN_WERROR:-} ]]; then
  werror=$MEMTRAIN_WERROR
elif [[ ${CI:-} == true && $sanitize != 1 ]]; then
  werror=ON
else
  werror=OFF
fi
read -r -a extra_args <<<"${MEMTRAIN_CMAKE_ARGS:-}"

# A directory configured by another generator cannot be switched to Ninja in place.
if [[ -f $build_dir/CMakeCache.txt ]] && ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$build_dir/CMakeCache.txt"; then
  mt_die "$build_dir was configured with another generator; remove it or set MEMTRAIN_BUILD_DIR"
fi

mt_step "build: configure $build_dir ($build_type, CUDA=$cuda, sanitize=$sanitize_flag, werror=$werror)"
mt_run cmake -S . -B "$build_dir" -G Ninja \
  -DCMAKE_BUILD_TYPE="$build_type" \
  -DMEMTRAIN_CUDA="$cuda" \
  -DMEMTRAIN_SANITIZE="$sanitize_flag" \
  -DMEMTRAIN_BENCH="$bench" \
  -DMEMTRAIN_WERROR="$werror" \
  "${type_flags[@]}" \
  "${extra_args[@]}"

mt_step "build: compile ${*:-all targets} with $jobs jobs"
targets=()
(($# > 0)) && targets=(--target "$@")
mt_run cmake --build "$build_dir" --parallel "$jobs" "${targets[@]}"

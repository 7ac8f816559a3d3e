#!/usr/bin/env bash
# Builds memtrain and runs every test: the GoogleTest suite through ctest, then the install check (the
# library is installed to a scratch prefix and an outside project builds against memtrain::memtrain).
# Idempotent: a second run reuses the packages and the build.
#
# Environment:
#   MEMTRAIN_SANITIZE=1     test only the ASan+UBSan build (in build-asan) instead of the normal one
#   MEMTRAIN_CI_SANITIZE=1  test the normal build, then the ASan+UBSan build as well (slow: off in CI)
#   MEMTRAIN_CI_FUZZ=1      then fuzz every file reader for 30 s (scripts/fuzz.sh: its own clang build in
#                           build-fuzz, regression inputs replayed; about 5 minutes on 2 cores)
#   MEMTRAIN_TEST_JOBS      parallel tests (default: 2)
#   MEMTRAIN_TEST_TIMEOUT   seconds one test may take (default: 900)
#   and the build variables of scripts/build.sh.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$MEMTRAIN_ROOT"
start=$SECONDS

test_jobs=${MEMTRAIN_TEST_JOBS:-2}
test_timeout=${MEMTRAIN_TEST_TIMEOUT:-900}

# Builds and tests one configuration; $1 is 0 (normal) or 1 (sanitizers).
run_suite() {
  local sanitize=$1 build_dir
  if [[ $sanitize == 1 ]]; then
    build_dir=${MEMTRAIN_ASAN_BUILD_DIR:-build-asan}
    # Leaks are errors; a UBSan report stops the test with a stack.
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:strict_string_checks=1}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  else
    build_dir=${MEMTRAIN_BUILD_DIR:-build}
  fi
  local suite_start=$SECONDS

  MEMTRAIN_SANITIZE=$sanitize MEMTRAIN_BUILD_DIR=$build_dir bash scripts/build.sh

  # Both steps run even when the first fails, so one log shows every failure.
  local failed=()
  # Alone, because it compiles a project of its own.
  mt_step "test: install memtrain and build an outside project against it"
  mt_run ctest --test-dir "$build_dir" --output-on-failure --timeout "$test_timeout" -L install ||
    failed+=("install check")

  # Last, so ctest's closing summary line counts the whole unit suite.
  mt_step "test: unit tests in $build_dir ($test_jobs in parallel)"
  mt_run ctest --test-dir "$build_dir" --output-on-failure -j "$test_jobs" --timeout "$test_timeout" -LE install ||
    failed+=("unit tests")

  if ((${#failed[@]} > 0)); then
    mt_die "$build_dir: FAILED: ${failed[*]} (after $((SECONDS - suite_start)) s; see the output above)"
  fi
  echo "$build_dir: built and tested in $((SECONDS - suite_start)) s"
}

bash scripts/setup.sh

if [[ ${MEMTRAIN_SANITIZE:-0} == 1 ]]; then
  run_suite 1
else
  run_suite 0
  if [[ ${MEMTRAIN_CI_SANITIZE:-0} == 1 ]]; then
    run_suite 1
  fi
fi

if [[ ${MEMTRAIN_CI_FUZZ:-0} == 1 ]]; then
  mt_step "test: fuzz the file readers (scripts/fuzz.sh)"
  bash scripts/fuzz.sh 30
fi

mt_step "all tests passed in $((SECONDS - start)) s"

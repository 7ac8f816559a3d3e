#!/usr/bin/env bash
# Builds the libFuzzer harnesses of memtrain's file readers (cmake/memtrain_fuzz.cmake) with clang, replays
# every committed regression input (tests/fuzz/regressions/<target>/*) through its harness, then fuzzes
# each reader for SECONDS (default 30), two at a time, on a copy of its seed corpus (tests/fuzz/corpus/<target>/
# is never written to). Prints, per target, the executions, libFuzzer's final coverage (cov: edges, ft:
# features) and the exit status; exits non-zero when a regression input fails or a fuzzer finds a crash, a
# sanitizer report, a leak, an allocation over 2 GB or an input that runs over 10 s, naming the input it
# saved. scripts/test.sh runs it in CI (MEMTRAIN_CI_FUZZ=1).
#
# Usage: bash scripts/fuzz.sh [SECONDS]
# Environment:
#   MEMTRAIN_FUZZ_BUILD_DIR  build directory (default: build-fuzz)
#   MEMTRAIN_JOBS            parallel compile jobs (default: 2)
#   MEMTRAIN_FUZZ_PARALLEL   fuzzers run at once (default: 2)
#
# To reproduce a crash: build-fuzz/fuzz_<target> CRASH_FILE. To minimise it:
#   build-fuzz/fuzz_<target> -minimize_crash=1 -runs=100000 -exact_artifact_path=small CRASH_FILE
# then commit it under tests/fuzz/regressions/<target>/ and fix the reader.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$MEMTRAIN_ROOT"
start=$SECONDS

seconds=${1:-30}
[[ $seconds =~ ^[1-9][0-9]*$ ]] || mt_die "usage: bash scripts/fuzz.sh [SECONDS], a whole number > 0 (got '$seconds')"
build_dir=${MEMTRAIN_FUZZ_BUILD_DIR:-build-fuzz}
jobs=${MEMTRAIN_JOBS:-2}
parallel=${MEMTRAIN_FUZZ_PARALLEL:-2}
# The order of cmake/memtrain_fuzz.cmake's MEMTRAIN_FUZZ_TARGETS.
targets=(safetensors trainer_config bpe_gpt2 bpe_load token_shard idx idx_gz hf_config)

# Per target: the dictionary (if any) and the largest input worth trying (a little over the largest seed).
fuzz_args() {
  local dict=tests/fuzz/dict
  case $1 in
    safetensors) echo "-dict=$dict/safetensors.dict -max_len=4096" ;;
    trainer_config | bpe_load) echo "-dict=$dict/json.dict -max_len=4096" ;;
    hf_config) echo "-dict=$dict/json.dict -max_len=2048" ;;
    bpe_gpt2) echo "-dict=$dict/json.dict -max_len=8192" ;;
    token_shard | idx | idx_gz) echo "-max_len=2048" ;;
    *) mt_die "no fuzz arguments for target '$1'" ;;
  esac
}

# ---- packages: clang, its sanitizer and libFuzzer runtimes, lld, and clang's OpenMP (find_package) ------
packages=(clang libclang-rt-14-dev lld libomp-dev)
mt_step "fuzz: checking ${#packages[@]} Debian packages"
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  echo "all installed: ${packages[*]}"
else
  echo "missing: ${missing[*]}"
  [[ $(id -u) -eq 0 ]] || mt_die "installing packages needs root; run as root (or with sudo): bash scripts/fuzz.sh"
  export DEBIAN_FRONTEND=noninteractive
  mt_run apt-get update
  mt_run apt-get install -y --no-install-recommends "${missing[@]}"
fi

# ---- build ------------------------------------------------------------------------------------------------
if [[ -f $build_dir/CMakeCache.txt ]] && ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$build_dir/CMakeCache.txt"; then
  mt_die "$build_dir was configured with another generator; remove it or set MEMTRAIN_FUZZ_BUILD_DIR"
fi
build_start=$SECONDS
mt_step "fuzz: configure and build $build_dir (clang, ASan + UBSan + libFuzzer)"
# Debug: assertions on (the fuzz flags set -O1 themselves). Only the readers are built, so the library's
# optional parts are not even looked for.
mt_run cmake -S . -B "$build_dir" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug \
  -DMEMTRAIN_FUZZ=ON -DMEMTRAIN_CUDA=OFF -DMEMTRAIN_TESTS=OFF -DMEMTRAIN_BENCH=OFF -DMEMTRAIN_EXAMPLES=OFF \
  -DMEMTRAIN_MPI=OFF -DMEMTRAIN_ONEDNN=OFF -DMEMTRAIN_NATIVE=OFF -DMEMTRAIN_WERROR=OFF
mt_run cmake --build "$build_dir" --target memtrain_fuzzers -j "$jobs"
echo "built in $((SECONDS - build_start)) s"

# Sanitizer reports abort with a stack; leaks count. Kept when the caller set them (scripts/test.sh does).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

out=$build_dir/fuzz-out
rm -rf "$out"
mkdir -p "$out"
failed=()

# ---- regressions: every committed input, once --------------------------------------------------------------
mt_step "fuzz: replay tests/fuzz/regressions"
for t in "${targets[@]}"; do
  dir=tests/fuzz/regressions/$t
  [[ -d $dir ]] || continue
  mapfile -t inputs < <(find "$dir" -type f | sort)
  ((${#inputs[@]} > 0)) || continue
  if "$build_dir/fuzz_$t" "${inputs[@]}" >"$out/regressions_$t.log" 2>&1; then
    echo "$t: ${#inputs[@]} regression inputs pass"
  else
    echo "$t: a regression input FAILED (log: $out/regressions_$t.log):"
    grep -E '^(Running|SUMMARY|==[0-9]+==ERROR)' "$out/regressions_$t.log" | tail -n 5 || true
    failed+=("$t regressions")
  fi
done

# ---- fuzz: each target for $seconds, $parallel at a time --------------------------------------------------
# One target: its own corpus copy and artifact folder, libFuzzer's output in $out/$t.log, its status in $out/$t.rc.
fuzz_one() {
  local t=$1 args
  args=$(fuzz_args "$t")
  mkdir -p "$out/$t/corpus" "$out/$t/artifacts"
  cp tests/fuzz/corpus/"$t"/* "$out/$t/corpus/"
  local rc=0
  # shellcheck disable=SC2086  # $args is a list of options
  "$build_dir/fuzz_$t" $args -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$out/$t/artifacts/" "$out/$t/corpus" >"$out/$t.log" 2>&1 || rc=$?
  echo "$rc" >"$out/$t.rc"
}

mt_step "fuzz: ${#targets[@]} targets for $seconds s each, $parallel at a time (logs in $out)"
running=0
for t in "${targets[@]}"; do
  if ((running >= parallel)); then
    wait -n || true
    running=$((running - 1))
  fi
  fuzz_one "$t" &
  running=$((running + 1))
done
wait || true

printf '%-15s %12s %8s %8s %s\n' target executions cov ft status
for t in "${targets[@]}"; do
  log=$out/$t.log
  rc=$(cat "$out/$t.rc" 2>/dev/null || echo "?")
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  # The last status line ("#N DONE cov: C ft: F ...", or the last progress line before a crash).
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -n 1 | cut -d' ' -f2)
  ft=$(grep -oE 'ft: [0-9]+' "$log" | tail -n 1 | cut -d' ' -f2)
  # Findings only: libFuzzer also saves "slow-unit-*" files, a note when a machine stalls, not a failure
  # (an input over -timeout is a "timeout-*").
  artifacts=$(find "$out/$t/artifacts" -type f \( -name 'crash-*' -o -name 'oom-*' -o -name 'timeout-*' \
    -o -name 'leak-*' \) | sort)
  status="ok"
  if [[ $rc != 0 || -n $artifacts ]]; then
    status="FAILED (exit $rc; log $log)"
    failed+=("$t")
  fi
  printf '%-15s %12s %8s %8s %s\n' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "$status"
  for a in $artifacts; do
    echo "    input: $a"
    grep -E '^(SUMMARY|==[0-9]+== ERROR|==[0-9]+==ERROR)' "$log" | head -n 3 | sed 's/^/    /' || true
  done
done

if ((${#failed[@]} > 0)); then
  mt_die "fuzz: FAILED: ${failed[*]} (after $((SECONDS - start)) s)"
fi
mt_step "fuzz: every reader survived ${seconds} s of fuzzing; all done in $((SECONDS - start)) s"

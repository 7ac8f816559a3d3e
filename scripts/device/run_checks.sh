#!/usr/bin/env bash
# The device run (one call of the device tool, on a machine with an NVIDIA GPU), from the repository root,
# with .devcarry/ made by scripts/device/prepare.sh carried along:
#   1. what the machine is (GPU, driver, toolkit, PyTorch);
#   2. the CUDA test suite (every Cuda* test: each CUDA kernel against the CPU reference);
#   3. GEMM TFLOP/s, memtrain (cuBLAS / cuBLASLt) beside PyTorch on the same shapes, in this one call;
#   4. the other kernels (attention, optimizer steps, layer_norm, cross_entropy) beside PyTorch;
#   5. compute-sanitizer memcheck over the CUDA tests when time is left.
# MEMTRAIN_DEVICE_STEPS picks steps (default "tests,gemm,kernels,memcheck"); the environment summary always runs.
# Logs go to $OUT (the device tool brings them back). Each step has its own time limit so one hang
# cannot eat the lease; the exit status is the test suite's.
set -uo pipefail
OUT=${OUT:-/tmp/memtrain-device-out}
mkdir -p "$OUT"
carry=.devcarry
cuda_libs=/usr/local/cuda/lib64:/usr/local/cuda/lib
export LD_LIBRARY_PATH="$PWD/$carry/lib:$cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Where the toolkit's cuBLAS is missing, PyTorch's wheels (nvidia-cublas) carry the same libraries.
if ldd $carry/memtrain_tests | grep -q "not found"; then
  for dir in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    for lib in "$dir"/nvidia/*/lib "$dir"/nvidia/cu13/lib; do [[ -d $lib ]] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$lib"; done
  done
fi
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  /usr/local/cuda/bin/nvcc --version | tail -n 2
  ldd --version | head -n 1
  echo "glibc needed by the carried binaries: $(cat $carry/glibc_needed.txt)"
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'
  ldd $carry/memtrain_tests | grep -i "not found" || echo "all libraries found"
} 2>&1 | tee "$OUT/env.txt"

steps=",${MEMTRAIN_DEVICE_STEPS:-tests,gemm,kernels,memcheck},"
want() { [[ $steps == *",$1,"* ]]; }
tests_rc=0

if want tests; then
echo "== CUDA tests ($(elapsed) s)"
timeout 240 $carry/memtrain_tests --gtest_filter='Cuda*' --gtest_brief=0 --gtest_output=xml:"$OUT/cuda_tests.xml" \
  >"$OUT/cuda_tests.log" 2>&1
tests_rc=$?
grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]|Failure|error:|Expected|Which is|actual|Value of" "$OUT/cuda_tests.log" | head -n 120
echo "tests rc=$tests_rc"
fi

if want gemm; then
echo "== GEMM, memtrain ($(elapsed) s)"
timeout 120 $carry/bench_cuda_gemm "$OUT/gemm_memtrain.json" 2>&1 | tee "$OUT/gemm_memtrain.md"
echo "== GEMM, PyTorch ($(elapsed) s)"
PYTHONUNBUFFERED=1 timeout 120 python3 scripts/device/gemm_peer.py "$OUT/gemm_torch.json" 2>&1 | tee "$OUT/gemm_torch.md"
fi

if want kernels; then
echo "== kernels, memtrain ($(elapsed) s)"
timeout 120 $carry/bench_cuda_kernels "$OUT/kernels_memtrain.json" 2>&1 | tee "$OUT/kernels_memtrain.md"
echo "== kernels, PyTorch ($(elapsed) s)"
PYTHONUNBUFFERED=1 timeout 120 python3 scripts/device/kernels_peer.py "$OUT/kernels_torch.json" 2>&1 |
  tee "$OUT/kernels_torch.md"
fi

sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if want memcheck && (( $(elapsed) < ${MEMTRAIN_SANITIZE_BEFORE_S:-330} )) && [[ -x $sanitizer ]]; then
  echo "== compute-sanitizer memcheck over the CUDA tests ($(elapsed) s)"
  timeout "${MEMTRAIN_SANITIZE_LIMIT_S:-150}" "$sanitizer" --tool memcheck --print-limit 20 $carry/memtrain_tests --gtest_filter="${MEMTRAIN_SANITIZE_FILTER:-Cuda*}" \
    >"$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$?"
  grep -E "ERROR SUMMARY|Invalid|out of bounds|^\[  FAILED" "$OUT/memcheck.log" | head -n 30
fi
echo "done in $(elapsed) s"
exit $tests_rc

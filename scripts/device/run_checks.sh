#!/usr/bin/env bash
# The device run (one call of the device tool, on a machine with an NVIDIA GPU), from the repository root,
# with .devcarry/ made by scripts/device/prepare.sh carried along:
#   1. what the machine is (GPU, driver, toolkit, PyTorch);
#   2. the CUDA test suite (every Cuda* test: each CUDA kernel against the CPU reference);
#   3. GEMM TFLOP/s, memtrain (cuBLAS / cuBLASLt) beside PyTorch on the same shapes, in this one call;
#   4. the other kernels (attention, optimizer steps, layer_norm, cross_entropy) beside PyTorch;
#   5. gpt: an end-to-end GPT-2 124M training step (T=1024, B=MEMTRAIN_GPT_BATCH, default 8; 3 warm-up and
#      MEMTRAIN_GPT_STEPS timed steps, default 10) with bench_gpt_e2e --device cuda for fp32 + AdamW, bf16 +
#      AdamW and bf16 + 8-bit GaLore (rank 128) + selective checkpointing, then PyTorch eager on the same model
#      and batch (scripts/device/gpt_peer.py: fp32 fused AdamW, bf16 autocast): tokens/s, step ms, peak memory;
#   6. compute-sanitizer memcheck over the CUDA tests when time is left.
# MEMTRAIN_DEVICE_STEPS picks steps (default "tests,gemm,kernels,gpt,memcheck"); the environment summary always runs.
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

steps=",${MEMTRAIN_DEVICE_STEPS:-tests,gemm,kernels,gpt,memcheck},"
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

if want gpt; then
gpt_args=(--model gpt2-124M --seq-len 1024 --batch "${MEMTRAIN_GPT_BATCH:-8}" --warmup 3
          --steps "${MEMTRAIN_GPT_STEPS:-10}" --device cuda)
# One run per configuration, each under its own limit: a hang or an out-of-memory costs that row only. All
# of them log into one file (few files come back from the device).
gpt_log="$OUT/gpt.log"
: >"$gpt_log"
gpt_run() {  # gpt_run NAME FLAGS...
  local name=$1 part
  shift
  echo "== GPT-2 124M step, memtrain $name ($(elapsed) s)"
  part=$(mktemp)
  timeout "${MEMTRAIN_GPT_LIMIT_S:-90}" $carry/bench_gpt_e2e "${gpt_args[@]}" "$@" >"$part" 2>&1
  local rc=$?
  { echo "==== memtrain $name: rc=$rc"; cat "$part"; } >>"$gpt_log"
  echo "rc=$rc"
  grep -E "^memtrain GPT|^median step|^host allocator|^RESULT|rror" "$part" | head -n 8
  rm -f "$part"
}
gpt_run fp32_adamw
gpt_run bf16_adamw --precision bf16
gpt_run bf16_galore8bit_selective --precision bf16 --optimizer adamw8bit --galore-rank 128 --galore-gap 200 \
  --checkpoint selective
echo "== GPT-2 124M step, PyTorch eager ($(elapsed) s)"
PYTHONUNBUFFERED=1 timeout "${MEMTRAIN_GPT_PEER_LIMIT_S:-120}" python3 scripts/device/gpt_peer.py --model gpt2-124M \
  --seq-len 1024 --batch "${MEMTRAIN_GPT_BATCH:-8}" --warmup 3 --steps "${MEMTRAIN_GPT_STEPS:-10}" \
  --modes fp32,bf16 >"$OUT/gpt_torch.part" 2>&1
peer_rc=$?
{ echo "==== torch eager: rc=$peer_rc"; cat "$OUT/gpt_torch.part"; } >>"$gpt_log"
rm -f "$OUT/gpt_torch.part"
echo "rc=$peer_rc"
grep -E "^torch|^RESULT|failed|skipped" "$gpt_log" | grep -v "^RESULT impl=memtrain" | head -n 8
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

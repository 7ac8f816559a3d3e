#!/usr/bin/env bash
# Builds, on this (GPU-less) machine, what the device run needs and puts it in .devcarry/ for the device
# tool's `carry`: the test binary, the GPU GEMM and kernel benchmarks and the end-to-end GPT step benchmark
# (bench_gpt_e2e --device cuda), built for sm_90 (H100/H200), plus the shared
# libraries the device image may lack. The binaries link libstdc++ and libgcc statically and use Eigen
# instead of oneDNN for CPU matmuls, so only small libraries travel (the 64 MiB limit); cudart and
# cuBLAS come from the device's own CUDA 13 toolkit.
#
#   bash scripts/device/prepare.sh            # then: device run with carry [".devcarry"], command
#                                             #   bash scripts/device/run_checks.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
build_dir=${MEMTRAIN_DEVICE_BUILD_DIR:-build-cuda}

cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEMTRAIN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DMEMTRAIN_NATIVE=OFF -DMEMTRAIN_ONEDNN=OFF -DMEMTRAIN_BENCH=ON -DMEMTRAIN_EXAMPLES=OFF \
  -DCMAKE_EXE_LINKER_FLAGS="-static-libstdc++ -static-libgcc" >/dev/null
ninja -C "$build_dir" -j"${JOBS:-2}" memtrain_tests bench_cuda_gemm bench_cuda_kernels bench_gpt_e2e

rm -rf .devcarry && mkdir -p .devcarry/lib
bins=(memtrain_tests bench_cuda_gemm bench_cuda_kernels bench_gpt_e2e)
cp "$build_dir/tests/memtrain_tests" "$build_dir/bench/bench_cuda_gemm" "$build_dir/bench/bench_cuda_kernels" \
  "$build_dir/bench/bench_gpt_e2e" .devcarry/
(cd .devcarry && strip "${bins[@]}")
# Everything the binaries load that is not CUDA's, glibc's or the kernel's: copied with its soname.
for bin in "${bins[@]/#/.devcarry/}"; do
  ldd "$bin" | awk '/=> \// {print $1, $3}' | while read -r soname path; do
    case "$soname" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libcuda.so*|libcudart*|libcublas*) ;;
      # Large and part of the device's toolkit (or of PyTorch's nvidia-* wheels, which run_checks.sh adds).
      libcusolver*|libcusparse*|libnvJitLink*|libcudnn*) ;;
      # cuBLAS loads the system's libstdc++ (any newer one serves our statically linked code too).
      libstdc++.so*|libgcc_s.so*) ;;
      *) cp -L "$path" ".devcarry/lib/$soname" ;;
    esac
  done
done
# The newest glibc symbol version the binaries need: the device image must have at least this glibc.
objdump -T "${bins[@]/#/.devcarry/}" .devcarry/lib/* 2>/dev/null |
  grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1 > .devcarry/glibc_needed.txt
du -sh .devcarry
ls -la .devcarry .devcarry/lib
echo "needs $(cat .devcarry/glibc_needed.txt)"

// round_into_bf16 on CUDA (src/core/backend_entries.def): the kernel and the entry in one nvcc-compiled file,
// as norm.cu. Reference: src/cpu/bf16_rounding.cpp. Thread t of the grid-stride loop owns one Philox block of
// 8 elements, so element i draws the bits core/bf16_rounding.h gives (seed, stream, i) on the CPU too.
#include "core/bf16_rounding.h"
#include "core/operand_checks.h"
#include "cuda/cuda_backend_entries.h"
#include "cuda/cuda_common.h"
#include "memtrain/core/error.h"

#include <cstdint>

namespace memtrain::cuda {
namespace {

__global__ void round_stochastic_kernel(std::uint16_t* out, const float* value, std::int64_t n, std::uint64_t seed,
                                        std::uint64_t stream, std::uint64_t first_block) {
  const std::int64_t blocks = (n + 7) / 8;
  for (std::int64_t b = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; b < blocks;
       b += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const Philox4x32 bits = philox4x32_10(first_block + static_cast<std::uint64_t>(b), stream, seed);
    const std::int64_t end = n < 8 * b + 8 ? n : 8 * b + 8;
    for (std::int64_t i = 8 * b; i < end; ++i) {
      const std::uint32_t word = bits.v[(i % 8) / 2];
      const std::uint32_t r = (i & 1) != 0 ? word >> 16 : word & 0xffffu;
      out[i] = ::memtrain::detail::bf16_bits_stochastic(value[i], r);
    }
  }
}

__global__ void round_kahan_kernel(std::uint16_t* out, std::uint16_t* compensation, const float* value,
                                   std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::uint16_t kept = ::memtrain::detail::bf16_bits_nearest(value[i]);
    out[i] = kept;
    compensation[i] = ::memtrain::detail::bf16_bits_nearest(value[i] - ::memtrain::detail::bf16_bits_to_float(kept));
  }
}

constexpr int kThreads = 256;

unsigned grid_for(std::int64_t items) {
  const std::int64_t blocks = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 4096 ? (blocks < 1 ? 1 : blocks) : 4096);
}

}  // namespace

void CudaBackend::round_into_bf16(const Tensor& param, const Tensor& value, const Tensor& compensation,
                                  std::uint64_t seed, std::uint64_t stream, std::uint64_t first) const {
  constexpr const char* op = "cuda::round_into_bf16";
  ::memtrain::detail::check_round_into_bf16(param, value, compensation, first);
  const std::int64_t n = param.numel();
  if (n == 0) return;
  detail::DeviceGuard guard(param.device().index, op);
  auto* out = static_cast<std::uint16_t*>(param.data_ptr());
  if (compensation.defined()) {
    round_kahan_kernel<<<grid_for(n), kThreads, 0, detail::launch_stream()>>>(
        out, static_cast<std::uint16_t*>(compensation.data_ptr()), value.data<float>(), n);
  } else {
    round_stochastic_kernel<<<grid_for((n + 7) / 8), kThreads, 0, detail::launch_stream()>>>(
        out, value.data<float>(), n, seed, stream, first / 8);
  }
  MT_CUDA_CHECK(op, cudaGetLastError);
}

}  // namespace memtrain::cuda

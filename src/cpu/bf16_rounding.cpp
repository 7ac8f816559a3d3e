// The CPU's round_into_bf16 (src/core/backend_entries.def): the reference the CUDA kernel is tested against.
// Stochastic: one Philox block per 8 elements, OpenMP over blocks, so each element's bits are those of its
// index alone. Kahan: to nearest, the remainder kept in the compensation.
#include "core/bf16_rounding.h"
#include "core/operand_checks.h"
#include "cpu/cpu_backend.h"

#include <algorithm>
#include <cstdint>

namespace memtrain::cpu {
namespace {

void round_stochastic(std::uint16_t* out, const float* value, std::int64_t n, std::uint64_t seed,
                      std::uint64_t stream, std::uint64_t first_block) {
  const std::int64_t blocks = (n + 7) / 8;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (std::int64_t b = 0; b < blocks; ++b) {
    const Philox4x32 bits = philox4x32_10(first_block + static_cast<std::uint64_t>(b), stream, seed);
    const std::int64_t end = std::min<std::int64_t>(n, 8 * b + 8);
    for (std::int64_t i = 8 * b; i < end; ++i) {
      const std::uint32_t word = bits.v[(i % 8) / 2];
      const std::uint32_t r = (i & 1) != 0 ? word >> 16 : word & 0xffffu;
      out[i] = detail::bf16_bits_stochastic(value[i], r);
    }
  }
}

void round_kahan(std::uint16_t* out, std::uint16_t* compensation, const float* value, std::int64_t n) {
#pragma omp parallel for simd if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint16_t kept = detail::bf16_bits_nearest(value[i]);
    out[i] = kept;
    compensation[i] = detail::bf16_bits_nearest(value[i] - detail::bf16_bits_to_float(kept));
  }
}

}  // namespace

void CpuBackend::round_into_bf16(const Tensor& param, const Tensor& value, const Tensor& compensation,
                                 std::uint64_t seed, std::uint64_t stream, std::uint64_t first) const {
  detail::check_round_into_bf16(param, value, compensation, first);
  if (!runs_kernels()) return;
  auto* out = static_cast<std::uint16_t*>(param.data_ptr());
  if (compensation.defined()) {
    round_kahan(out, static_cast<std::uint16_t*>(compensation.data_ptr()), value.data<float>(), param.numel());
  } else {
    round_stochastic(out, value.data<float>(), param.numel(), seed, stream, first / 8);
  }
}

}  // namespace memtrain::cpu

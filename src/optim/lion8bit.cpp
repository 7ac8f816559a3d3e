// Lion8bit: like AdamW8bit, OpenMP over blocks with a one-block fp32 scratch per thread; the moment is
// dequantized, used for the sign update, advanced and requantized block by block. The update pass also
// tracks the new moment's max and min, so requantizing is one table-encoder pass.
#include "memtrain/optim/lion8bit.h"

#include "memtrain/core/allocator.h"
#include "memtrain/optim/factories.h"
#include "memtrain/optim/quantized_state.h"

#include <algorithm>
#include <vector>

namespace memtrain::optim {
namespace {

struct LionCoeffs {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, decay, lr;
};

inline void lion_span(float* p, const float* g, float* m, std::int64_t n, const LionCoeffs& c) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const float u = c.beta1 * m[i] + c.one_minus_beta1 * g[i];
    const float s = static_cast<float>((u > 0.0f) - (u < 0.0f));
    p[i] = p[i] * c.decay - c.lr * s;
    m[i] = c.beta2 * m[i] + c.one_minus_beta2 * g[i];
  }
}

// lion_span on a dequantized block (the same expressions, so the same rounding), also returning
// max(0, m) and min(0, m) of the new moment for its block scale; max and min are exact in any order.
inline void lion_block(float* __restrict p, const float* __restrict g, float* __restrict m, std::int64_t n,
                       const LionCoeffs& c, float& m_hi, float& m_lo) {
  float hi = 0.0f, lo = 0.0f;
#pragma omp simd reduction(max : hi) reduction(min : lo)
  for (std::int64_t i = 0; i < n; ++i) {
    const float u = c.beta1 * m[i] + c.one_minus_beta1 * g[i];
    const float s = static_cast<float>((u > 0.0f) - (u < 0.0f));
    p[i] = p[i] * c.decay - c.lr * s;
    m[i] = c.beta2 * m[i] + c.one_minus_beta2 * g[i];
    hi = std::max(hi, m[i]);
    lo = std::min(lo, m[i]);
  }
  m_hi = hi;
  m_lo = lo;
}

}  // namespace

Lion8bit::Lion8bit(std::vector<ParamGroup> groups, std::int64_t block_size, std::int64_t min_8bit_size)
    : Optimizer(std::move(groups)), block_size_(block_size), min_8bit_size_(min_8bit_size) {
  MT_CHECK(block_size > 0, "Lion8bit", "block_size must be positive, got {}", block_size);
  MT_CHECK(min_8bit_size >= 0, "Lion8bit", "min_8bit_size must be >= 0, got {}", min_8bit_size);
}

void Lion8bit::init_state(const Tensor& param, const ParamGroup&, ParamState& state) {
  check_f32_contiguous(param, "Lion8bit");
  CategoryGuard guard(MemoryCategory::optimizer_state);
  const std::int64_t n = param.numel();
  if (n >= min_8bit_size_) {
    QuantizedState m(n, QuantMap::signed_dynamic, block_size_);
    state.tensors["exp_avg.codes"] = m.codes();
    state.tensors["exp_avg.absmax"] = m.absmax();
  } else {
    state.tensors["exp_avg"] = zeros(param.shape());
  }
}

void Lion8bit::update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) {
  const Tensor g_contig = grad_f32(grad);  // the base checked shape and finiteness
  const float* g = g_contig.data<float>();
  float* p = param.data<float>();
  const LionCoeffs c{static_cast<float>(group.beta1), static_cast<float>(1.0 - group.beta1),
                     static_cast<float>(group.beta2), static_cast<float>(1.0 - group.beta2),
                     static_cast<float>(1.0 - group.lr * group.weight_decay), static_cast<float>(group.lr)};

  auto codes = state.tensors.find("exp_avg.codes");
  if (codes == state.tensors.end()) {
    float* m = state.tensors.at("exp_avg").data<float>();
    const std::int64_t n = param.numel();
    const std::int64_t chunks = (n + block_size_ - 1) / block_size_;
#pragma omp parallel for schedule(static) if (n > 32768)
    for (std::int64_t b = 0; b < chunks; ++b) {
      const std::int64_t off = b * block_size_;
      lion_span(p + off, g + off, m + off, std::min(block_size_, n - off), c);
    }
    return;
  }
  QuantizedState qm(codes->second, state.tensors.at("exp_avg.absmax"), QuantMap::signed_dynamic, block_size_);
  const std::int64_t n = param.numel();
  const std::int64_t bs = block_size_;
  const std::int64_t nb = qm.num_blocks();
  std::uint8_t* m_codes = qm.codes().data<std::uint8_t>();
  float* m_absmax = qm.absmax().data<float>();
  const float* map = qm.map();
#pragma omp parallel if (nb > 1)
  {
    std::vector<float> m(static_cast<std::size_t>(bs));
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < nb; ++b) {
      const std::int64_t off = b * bs, len = std::min(bs, n - off);
      detail::dequantize_block(m_codes + off, len, m_absmax[b], map, m.data());
      float hi = 0.0f, lo = 0.0f;
      lion_block(p + off, g + off, m.data(), len, c, hi, lo);
      const float scale = detail::block_scale(hi, lo);
      detail::encode_block(m.data(), len, scale, map, m_codes + off);
      m_absmax[b] = scale == 0.0f ? 0.0f : scale;  // as quantize_block: an all-zero block stores +0
    }
  }
}

std::unique_ptr<Optimizer> make_lion8bit(std::vector<ParamGroup> groups, std::int64_t block_size,
                                         std::int64_t min_8bit_size) {
  return std::make_unique<Lion8bit>(std::move(groups), block_size, min_8bit_size);
}

}  // namespace memtrain::optim

// AdamW8bit: each OpenMP thread owns a scratch of one block per moment; a block is dequantized, updated
// in fp32 together with its parameters, and requantized with a fresh absmax, so no fp32 copy of the
// whole state ever exists. The update pass also tracks each moment's max and min, so requantizing is one
// more pass over the (L1-resident) block: the table encoder, no separate absmax pass.
#include "memtrain/optim/adamw8bit.h"

#include "memtrain/core/allocator.h"
#include "memtrain/optim/factories.h"
#include "memtrain/optim/quantized_state.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace memtrain::optim {
namespace {

struct AdamCoeffs {
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float decay;      // 1 - lr * weight_decay
  float step_size;  // lr / (1 - beta1^t)
  float inv_sqrt_bc2;
  float eps;
};

AdamCoeffs coeffs(const ParamGroup& g, std::int64_t step) {
  const double bc1 = 1.0 - std::pow(g.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(g.beta2, static_cast<double>(step));
  return {static_cast<float>(g.beta1), static_cast<float>(g.beta2), static_cast<float>(1.0 - g.beta1),
          static_cast<float>(1.0 - g.beta2),  static_cast<float>(1.0 - g.lr * g.weight_decay),
          static_cast<float>(g.lr / bc1),     static_cast<float>(1.0 / std::sqrt(bc2)),
          static_cast<float>(g.eps)};
}

// One AdamW update over n contiguous elements; m and v are fp32 (state or a dequantized block).
inline void adamw_span(float* p, const float* g, float* m, float* v, std::int64_t n, const AdamCoeffs& c) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    m[i] = c.beta1 * m[i] + c.one_minus_beta1 * g[i];
    v[i] = c.beta2 * v[i] + c.one_minus_beta2 * g[i] * g[i];
    const float denom = std::sqrt(v[i]) * c.inv_sqrt_bc2 + c.eps;
    p[i] = p[i] * c.decay - c.step_size * m[i] / denom;
  }
}

// The same update (the same expressions, so the same rounding) on a dequantized block, also returning
// max(0, m), min(0, m), max(0, v) and min(0, v) for the block scales. Max and min are exact whatever the
// order, so the vectorized reductions give the scales detail::block_scale would.
struct BlockRange {
  float m_hi = 0.0f, m_lo = 0.0f, v_hi = 0.0f, v_lo = 0.0f;
};
inline BlockRange adamw_block(float* __restrict p, const float* __restrict g, float* __restrict m,
                              float* __restrict v, std::int64_t n, const AdamCoeffs& c) {
  float m_hi = 0.0f, m_lo = 0.0f, v_hi = 0.0f, v_lo = 0.0f;
#pragma omp simd reduction(max : m_hi, v_hi) reduction(min : m_lo, v_lo)
  for (std::int64_t i = 0; i < n; ++i) {
    m[i] = c.beta1 * m[i] + c.one_minus_beta1 * g[i];
    v[i] = c.beta2 * v[i] + c.one_minus_beta2 * g[i] * g[i];
    const float denom = std::sqrt(v[i]) * c.inv_sqrt_bc2 + c.eps;
    p[i] = p[i] * c.decay - c.step_size * m[i] / denom;
    m_hi = std::max(m_hi, m[i]);
    m_lo = std::min(m_lo, m[i]);
    v_hi = std::max(v_hi, v[i]);
    v_lo = std::min(v_lo, v[i]);
  }
  return {m_hi, m_lo, v_hi, v_lo};
}

}  // namespace

AdamW8bit::AdamW8bit(std::vector<ParamGroup> groups, std::int64_t block_size, std::int64_t min_8bit_size)
    : Optimizer(std::move(groups)), block_size_(block_size), min_8bit_size_(min_8bit_size) {
  MT_CHECK(block_size > 0, "AdamW8bit", "block_size must be positive, got {}", block_size);
  MT_CHECK(min_8bit_size >= 0, "AdamW8bit", "min_8bit_size must be >= 0, got {}", min_8bit_size);
}

void AdamW8bit::init_state(const Tensor& param, const ParamGroup&, ParamState& state) {
  check_f32_contiguous(param, "AdamW8bit");
  CategoryGuard guard(MemoryCategory::optimizer_state);
  const std::int64_t n = param.numel();
  if (n >= min_8bit_size_) {
    QuantizedState m(n, QuantMap::signed_dynamic, block_size_);
    QuantizedState v(n, QuantMap::unsigned_dynamic, block_size_);
    state.tensors["exp_avg.codes"] = m.codes();
    state.tensors["exp_avg.absmax"] = m.absmax();
    state.tensors["exp_avg_sq.codes"] = v.codes();
    state.tensors["exp_avg_sq.absmax"] = v.absmax();
  } else {
    state.tensors["exp_avg"] = zeros(param.shape());
    state.tensors["exp_avg_sq"] = zeros(param.shape());
  }
}

void AdamW8bit::update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) {
  const Tensor g_contig = grad_f32(grad);  // the base checked shape and finiteness
  const float* g = g_contig.data<float>();
  float* p = param.data<float>();
  const std::int64_t n = param.numel();
  const AdamCoeffs c = coeffs(group, state.step);

  auto codes = state.tensors.find("exp_avg.codes");
  if (codes == state.tensors.end()) {
    float* m = state.tensors.at("exp_avg").data<float>();
    float* v = state.tensors.at("exp_avg_sq").data<float>();
    // Chunks of one block keep the parallel loop's body the same inlined kernel as the 8-bit path.
    const std::int64_t chunks = (n + block_size_ - 1) / block_size_;
#pragma omp parallel for schedule(static) if (n > 32768)
    for (std::int64_t b = 0; b < chunks; ++b) {
      const std::int64_t off = b * block_size_;
      adamw_span(p + off, g + off, m + off, v + off, std::min(block_size_, n - off), c);
    }
    return;
  }
  QuantizedState qm(codes->second, state.tensors.at("exp_avg.absmax"), QuantMap::signed_dynamic, block_size_);
  QuantizedState qv(state.tensors.at("exp_avg_sq.codes"), state.tensors.at("exp_avg_sq.absmax"),
                    QuantMap::unsigned_dynamic, block_size_);
  const std::int64_t bs = block_size_;
  const std::int64_t nb = qm.num_blocks();
  std::uint8_t* m_codes = qm.codes().data<std::uint8_t>();
  std::uint8_t* v_codes = qv.codes().data<std::uint8_t>();
  float* m_absmax = qm.absmax().data<float>();
  float* v_absmax = qv.absmax().data<float>();
  const float* m_map = qm.map();
  const float* v_map = qv.map();
#pragma omp parallel if (nb > 1)
  {
    std::vector<float> m(static_cast<std::size_t>(bs)), v(static_cast<std::size_t>(bs));
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < nb; ++b) {
      const std::int64_t off = b * bs, len = std::min(bs, n - off);
      detail::dequantize_block(m_codes + off, len, m_absmax[b], m_map, m.data());
      detail::dequantize_block(v_codes + off, len, v_absmax[b], v_map, v.data());
      const BlockRange r = adamw_block(p + off, g + off, m.data(), v.data(), len, c);
      const float m_scale = detail::block_scale(r.m_hi, r.m_lo), v_scale = detail::block_scale(r.v_hi, r.v_lo);
      detail::encode_block(m.data(), len, m_scale, m_map, m_codes + off);
      detail::encode_block(v.data(), len, v_scale, v_map, v_codes + off);
      m_absmax[b] = m_scale == 0.0f ? 0.0f : m_scale;  // as quantize_block: an all-zero block stores +0
      v_absmax[b] = v_scale == 0.0f ? 0.0f : v_scale;
    }
  }
}

std::unique_ptr<Optimizer> make_adamw8bit(std::vector<ParamGroup> groups, std::int64_t block_size,
                                          std::int64_t min_8bit_size) {
  return std::make_unique<AdamW8bit>(std::move(groups), block_size, min_8bit_size);
}

}  // namespace memtrain::optim

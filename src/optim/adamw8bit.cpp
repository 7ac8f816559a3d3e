// AdamW8bit: OpenMP over blocks; a block is decoded, updated in fp32 together with its parameters, and
// requantized with a fresh absmax, so no fp32 copy of the whole state ever exists. With AVX2 one pass per
// block decodes both moments (scalar map loads), updates 8 lanes at a time, keeps the new moments in a
// one-block scratch (L1) and tracks their max and min; a second pass over the scratch encodes them (the
// table encoder of quantized_kernels.h). Bytes streamed per parameter: p read and written, g read, two
// codes read and written = 16 (fp32 AdamW: 28). With AVX-512 the block is decoded into the scratch first
// (byte planes), updated 16 lanes at a time and encoded by the arithmetic encoder, and the next block's
// p, g and codes are prefetched. The portable path does the same in three loops.
//
// Rounding: every product and sum is rounded on its own, in the order written (fp-contract off below),
// on both paths and in the fp32-state path for small tensors, as the CUDA kernel (kernels/optim.cu) does.
// With IEEE sqrt and division the AVX-512, AVX2 and portable paths give the same bits (tested).
#include "memtrain/optim/adamw8bit.h"

#include "memtrain/core/allocator.h"
#include "memtrain/cuda/optim.h"
#include "memtrain/optim/factories.h"
#include "memtrain/optim/quantized_state.h"
#include "quantized_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif

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

// One AdamW update over n contiguous elements; m and v are fp32 (state or a decoded block). Also returns
// max(0, .) and min(0, .) of the new m and v, for the block scales (max and min are exact in any order).
// __builtin_sqrtf: std::sqrt was compiled without fp-contract off, and GCC would not inline it here.
struct BlockRange {
  float m_hi = 0.0f, m_lo = 0.0f, v_hi = 0.0f, v_lo = 0.0f;
};
inline BlockRange adamw_span(float* __restrict p, const float* __restrict g, float* __restrict m,
                             float* __restrict v, std::int64_t n, const AdamCoeffs& c) {
  float m_hi = 0.0f, m_lo = 0.0f, v_hi = 0.0f, v_lo = 0.0f;
#pragma omp simd reduction(max : m_hi, v_hi) reduction(min : m_lo, v_lo)
  for (std::int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = c.beta1 * m[i] + c.one_minus_beta1 * gi;
    const float vi = c.beta2 * v[i] + c.one_minus_beta2 * gi * gi;
    const float denom = __builtin_sqrtf(vi) * c.inv_sqrt_bc2 + c.eps;
    p[i] = p[i] * c.decay - c.step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
    m_hi = std::max(m_hi, mi);
    m_lo = std::min(m_lo, mi);
    v_hi = std::max(v_hi, vi);
    v_lo = std::min(v_lo, vi);
  }
  return {m_hi, m_lo, v_hi, v_lo};
}

// One moment's block: its codes, its absmax and the moment's encoder.
struct Moments8 {
  std::uint8_t* codes;
  float* absmax;  // this block's
  const detail::EncodeTable& table;
};

#if defined(MEMTRAIN_OPTIM_AVX2)
// The coefficients in registers of the vector path's width.
template <int Lanes>
struct AdamRegs {
  using V = detail::FloatVec<Lanes>;
  typename V::type beta1, beta2, one_minus_beta1, one_minus_beta2, decay, step_size, inv_sqrt_bc2, eps;
  explicit AdamRegs(const AdamCoeffs& c)
      : beta1(V::splat(c.beta1)), beta2(V::splat(c.beta2)),
        one_minus_beta1(V::splat(c.one_minus_beta1)), one_minus_beta2(V::splat(c.one_minus_beta2)),
        decay(V::splat(c.decay)), step_size(V::splat(c.step_size)),
        inv_sqrt_bc2(V::splat(c.inv_sqrt_bc2)), eps(V::splat(c.eps)) {}
};
#endif

#if defined(MEMTRAIN_OPTIM_AVX512)
// Three passes over L1: decode both moments into the scratch (byte-plane lookups), update 16 lanes at a
// time (p in place, the new moments back into the scratch, their max and min), encode the scratch
// (arithmetic encoder). A last group of fewer than 16 lanes runs under a mask: p and g are read and p
// written only where the mask is set, and the scratch lanes beyond len (stale but finite) do not enter max
// and min.
[[gnu::always_inline]] inline void adamw8bit_block_avx512(float* p, const float* g, const Moments8& m,
                                                          const Moments8& v, std::int64_t len,
                                                          const AdamRegs<16>& c,
                                                          float* ms, float* vs) {
  detail::decode_span_avx512(m.table, m.codes, len, *m.absmax, ms);
  detail::decode_span_avx512(v.table, v.codes, len, *v.absmax, vs);
  __m512 m_hi = _mm512_setzero_ps(), m_lo = m_hi, v_hi = m_hi, v_lo = m_hi;
  for (std::int64_t i = 0; i < len; i += 16) {
    const __mmask16 k = detail::lanes_left(len - i);
    detail::prefetch_ahead(i, p, g, m.codes, v.codes);
    const __m512 gi = _mm512_maskz_loadu_ps(k, g + i);
    const __m512 mi =
        _mm512_add_ps(_mm512_mul_ps(c.beta1, _mm512_loadu_ps(ms + i)), _mm512_mul_ps(c.one_minus_beta1, gi));
    const __m512 vi = _mm512_add_ps(_mm512_mul_ps(c.beta2, _mm512_loadu_ps(vs + i)),
                                    _mm512_mul_ps(_mm512_mul_ps(c.one_minus_beta2, gi), gi));
    const __m512 denom = _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(vi), c.inv_sqrt_bc2), c.eps);
    const __m512 pi = _mm512_sub_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, p + i), c.decay),
                                    _mm512_div_ps(_mm512_mul_ps(c.step_size, mi), denom));
    _mm512_mask_storeu_ps(p + i, k, pi);
    _mm512_storeu_ps(ms + i, mi);
    _mm512_storeu_ps(vs + i, vi);
    m_hi = _mm512_mask_max_ps(m_hi, k, m_hi, mi);
    m_lo = _mm512_mask_min_ps(m_lo, k, m_lo, mi);
    v_hi = _mm512_mask_max_ps(v_hi, k, v_hi, vi);
    v_lo = _mm512_mask_min_ps(v_lo, k, v_lo, vi);
  }
  const float m_new = detail::block_scale(_mm512_reduce_max_ps(m_hi), _mm512_reduce_min_ps(m_lo));
  const float v_new = detail::block_scale(_mm512_reduce_max_ps(v_hi), _mm512_reduce_min_ps(v_lo));
  detail::encode_span_avx512(ms, len, m_new, m.table, m.codes);
  detail::encode_span_avx512(vs, len, v_new, v.table, v.codes);
  *m.absmax = detail::stored_scale(m_new);
  *v.absmax = detail::stored_scale(v_new);
}
#elif !defined(MEMTRAIN_OPTIM_AVX2)
void adamw8bit_block_portable(float* p, const float* g, const Moments8& m, const Moments8& v, std::int64_t len,
                              const AdamCoeffs& c, float* ms, float* vs) {
  detail::dequantize_block(m.codes, len, *m.absmax, m.table.map, ms);
  detail::dequantize_block(v.codes, len, *v.absmax, v.table.map, vs);
  const BlockRange r = adamw_span(p, g, ms, vs, len, c);
  const float m_scale = detail::block_scale(r.m_hi, r.m_lo), v_scale = detail::block_scale(r.v_hi, r.v_lo);
  detail::encode_span(ms, len, m_scale, m.table, m.codes);
  detail::encode_span(vs, len, v_scale, v.table, v.codes);
  *m.absmax = detail::stored_scale(m_scale);
  *v.absmax = detail::stored_scale(v_scale);
}
#else
// adamw_span's expressions on 8 lanes: decode, update p in place, new m and v to the scratch.
struct Range8 {
  __m256 m_hi = _mm256_setzero_ps(), m_lo = _mm256_setzero_ps(), v_hi = _mm256_setzero_ps(),
         v_lo = _mm256_setzero_ps();
};
inline void adamw8(float* p, const float* g, const std::uint8_t* mc, const std::uint8_t* vc, const float* m_map,
                   const float* v_map, __m256 m_scale, __m256 v_scale, const AdamRegs<8>& c, float* ms,
                   float* vs, Range8& r) {
  const __m256 m = _mm256_mul_ps(detail::decode8(m_map, mc), m_scale);
  const __m256 v = _mm256_mul_ps(detail::decode8(v_map, vc), v_scale);
  const __m256 gi = _mm256_loadu_ps(g);
  const __m256 mi = _mm256_add_ps(_mm256_mul_ps(c.beta1, m), _mm256_mul_ps(c.one_minus_beta1, gi));
  const __m256 vi = _mm256_add_ps(_mm256_mul_ps(c.beta2, v), _mm256_mul_ps(_mm256_mul_ps(c.one_minus_beta2, gi), gi));
  const __m256 denom = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(vi), c.inv_sqrt_bc2), c.eps);
  const __m256 pi = _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(p), c.decay),
                                  _mm256_div_ps(_mm256_mul_ps(c.step_size, mi), denom));
  _mm256_storeu_ps(p, pi);
  _mm256_storeu_ps(ms, mi);
  _mm256_storeu_ps(vs, vi);
  r.m_hi = _mm256_max_ps(r.m_hi, mi);
  r.m_lo = _mm256_min_ps(r.m_lo, mi);
  r.v_hi = _mm256_max_ps(r.v_hi, vi);
  r.v_lo = _mm256_min_ps(r.v_lo, vi);
}

// The scratch holds round_up(len, 8) floats. A last group of fewer than 8 runs on padded copies: zero
// gradient, parameter and codes of value 0 update to exactly 0, which leaves the block's max and min as
// they are. Inlined into the thread's loop, and everything the loop reads copied to locals first: vector
// stores may alias any memory, so values behind pointers or references would be reloaded every iteration.
[[gnu::always_inline]] inline void adamw8bit_block_avx2(float* p, const float* g, const Moments8& m,
                                                        const Moments8& v, std::int64_t len,
                                                        const AdamRegs<8>& c,
                                                        float* ms, float* vs) {
  const float* m_map = m.table.map;
  const float* v_map = v.table.map;
  std::uint8_t* m_codes = m.codes;
  std::uint8_t* v_codes = v.codes;
  const __m256 m_scale = _mm256_set1_ps(*m.absmax), v_scale = _mm256_set1_ps(*v.absmax);
  Range8 r;
  std::int64_t i = 0;
  for (; i + 8 <= len; i += 8)
    adamw8(p + i, g + i, m_codes + i, v_codes + i, m_map, v_map, m_scale, v_scale, c, ms + i, vs + i, r);
  if (const std::int64_t rest = len - i; rest > 0) {
    const auto count = static_cast<std::size_t>(rest);
    float pt[8] = {}, gt[8] = {};
    std::uint8_t mct[8], vct[8];
    std::memset(mct, m.table.zero_code, sizeof(mct));
    std::memset(vct, v.table.zero_code, sizeof(vct));
    std::memcpy(pt, p + i, count * sizeof(float));
    std::memcpy(gt, g + i, count * sizeof(float));
    std::memcpy(mct, m_codes + i, count);
    std::memcpy(vct, v_codes + i, count);
    adamw8(pt, gt, mct, vct, m_map, v_map, m_scale, v_scale, c, ms + i, vs + i, r);
    std::memcpy(p + i, pt, count * sizeof(float));
  }
  const float m_new = detail::block_scale(detail::hmax8(r.m_hi), detail::hmin8(r.m_lo));
  const float v_new = detail::block_scale(detail::hmax8(r.v_hi), detail::hmin8(r.v_lo));
  detail::encode_span_avx2(ms, len, m_new, m.table, m_codes);
  detail::encode_span_avx2(vs, len, v_new, v.table, v_codes);
  *m.absmax = detail::stored_scale(m_new);
  *v.absmax = detail::stored_scale(v_new);
}
#endif

}  // namespace

AdamW8bit::AdamW8bit(std::vector<ParamGroup> groups, std::int64_t block_size, std::int64_t min_8bit_size)
    : Optimizer(std::move(groups)), block_size_(block_size), min_8bit_size_(min_8bit_size) {
  MT_CHECK(block_size > 0, "AdamW8bit", "block_size must be positive, got {}", block_size);
  MT_CHECK(min_8bit_size >= 0, "AdamW8bit", "min_8bit_size must be >= 0, got {}", min_8bit_size);
}

void AdamW8bit::init_state(const Tensor& param, const ParamGroup&, ParamState& state) {
  check_f32_contiguous(param, "AdamW8bit", /*cuda_ok=*/true);
  // Its step is not behind the backend contract yet, so it has no meta (dry-run) step.
  MT_CHECK(!param.device().is_meta(), "AdamW8bit", "has no step on meta yet (AdamW, SGD and Lion do)");
  CategoryGuard guard(MemoryCategory::optimizer_state);
  const std::int64_t n = param.numel();
  const Device device = param.device();
  if (n >= min_8bit_size_) {
    MT_CHECK(device.is_cpu() || cuda::quant_block_size_supported(block_size_), "AdamW8bit",
             "block_size {} is not supported on {} (a power of two in [32, 4096])", block_size_, device.str());
    QuantizedState m(n, QuantMap::signed_dynamic, block_size_);
    QuantizedState v(n, QuantMap::unsigned_dynamic, block_size_);
    state.tensors["exp_avg.codes"] = m.codes().to(device);
    state.tensors["exp_avg.absmax"] = m.absmax().to(device);
    state.tensors["exp_avg_sq.codes"] = v.codes().to(device);
    state.tensors["exp_avg_sq.absmax"] = v.absmax().to(device);
  } else {
    state.tensors["exp_avg"] = zeros(param.shape(), DType::f32, device);
    state.tensors["exp_avg_sq"] = zeros(param.shape(), DType::f32, device);
  }
}

void AdamW8bit::update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) {
  const Tensor g_contig = grad_f32(grad, param.device());  // the base checked shape and finiteness
  if (param.device().is_cuda()) return update_cuda(param, g_contig, group, state);
  const float* g = g_contig.data<float>();
  float* p = param.data<float>();
  const std::int64_t n = param.numel();
  const std::int64_t bs = block_size_;
  const std::int64_t nb = (n + bs - 1) / bs;
  const AdamCoeffs c = coeffs(group, state.step);

  auto codes = state.tensors.find("exp_avg.codes");
  if (codes == state.tensors.end()) {
    float* m = state.tensors.at("exp_avg").data<float>();
    float* v = state.tensors.at("exp_avg_sq").data<float>();
    // Chunks of one block keep the parallel loop's body the same inlined kernel as the 8-bit path.
#pragma omp parallel for schedule(static) if (n >= detail::kParallelMinElements)
    for (std::int64_t b = 0; b < nb; ++b) {
      const std::int64_t off = b * bs;
      adamw_span(p + off, g + off, m + off, v + off, std::min(bs, n - off), c);
    }
    return;
  }
  QuantizedState qm(codes->second, state.tensors.at("exp_avg.absmax"), QuantMap::signed_dynamic, bs);
  QuantizedState qv(state.tensors.at("exp_avg_sq.codes"), state.tensors.at("exp_avg_sq.absmax"),
                    QuantMap::unsigned_dynamic, bs);
  std::uint8_t* m_codes = qm.codes().data<std::uint8_t>();
  std::uint8_t* v_codes = qv.codes().data<std::uint8_t>();
  float* m_absmax = qm.absmax().data<float>();
  float* v_absmax = qv.absmax().data<float>();
  const detail::EncodeTable& m_table = detail::encode_table(QuantMap::signed_dynamic);
  const detail::EncodeTable& v_table = detail::encode_table(QuantMap::unsigned_dynamic);
#pragma omp parallel if (n >= detail::kParallelMinElements)
  {
    detail::BlockScratch scratch(bs, 2);  // one block per moment
#if defined(MEMTRAIN_OPTIM_AVX512)
    const AdamRegs<16> regs(c);
#elif defined(MEMTRAIN_OPTIM_AVX2)
    const AdamRegs<8> regs(c);
#endif
    float* ms = scratch.array(0);
    float* vs = scratch.array(1);
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < nb; ++b) {
      const std::int64_t off = b * bs, len = std::min(bs, n - off);
      const Moments8 m{m_codes + off, m_absmax + b, m_table}, v{v_codes + off, v_absmax + b, v_table};
#if defined(MEMTRAIN_OPTIM_AVX512)
      adamw8bit_block_avx512(p + off, g + off, m, v, len, regs, ms, vs);
#elif defined(MEMTRAIN_OPTIM_AVX2)
      adamw8bit_block_avx2(p + off, g + off, m, v, len, regs, ms, vs);
#else
      adamw8bit_block_portable(p + off, g + off, m, v, len, c, ms, vs);
#endif
    }
  }
}

void AdamW8bit::update_cuda(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) {
  const cuda::AdamWHyper hyper{group.lr, group.weight_decay, group.beta1, group.beta2, group.eps, state.step,
                               /*skip_nonfinite=*/false};  // the base already checked the gradient
  const auto n = static_cast<std::size_t>(param.numel());
  const int device = param.device().index;
  auto f32 = [&](const char* name) { return state.tensors.at(name).data<float>(); };
  if (state.tensors.count("exp_avg.codes") == 0) {
    cuda::adamw_step(param.data<float>(), grad.data<float>(), f32("exp_avg"), f32("exp_avg_sq"), n, hyper, device);
    return;
  }
  cuda::adamw8bit_step(param.data<float>(), grad.data<float>(), state.tensors.at("exp_avg.codes").data<std::uint8_t>(),
                       f32("exp_avg.absmax"), state.tensors.at("exp_avg_sq.codes").data<std::uint8_t>(),
                       f32("exp_avg_sq.absmax"), n, block_size_, hyper, device);
}

std::unique_ptr<Optimizer> make_adamw8bit(std::vector<ParamGroup> groups, std::int64_t block_size,
                                          std::int64_t min_8bit_size) {
  return std::make_unique<AdamW8bit>(std::move(groups), block_size, min_8bit_size);
}

}  // namespace memtrain::optim

// Lion8bit: like AdamW8bit, OpenMP over blocks with a one-block fp32 scratch per thread. With AVX2 one pass
// per block decodes the moment (scalar map loads), takes the sign update, writes the new moment to the
// scratch and tracks its max and min; a second pass encodes the scratch (quantized_kernels.h). Bytes
// streamed per parameter: p read and written, g read, one code read and written = 14 (fp32 Lion: 20).
// With AVX-512: decode first, then 16 lanes at a time, as in adamw8bit.cpp.
//
// Rounding: every product and sum is rounded on its own, in the order written (fp-contract off below), on
// every path and in the fp32-state path, as the CUDA kernel (kernels/optim.cu) does; the AVX-512, AVX2 and
// portable paths give the same bits (tested).
#include "memtrain/optim/lion8bit.h"

#include "memtrain/core/allocator.h"
#include "memtrain/cuda/optim.h"
#include "memtrain/optim/factories.h"
#include "memtrain/optim/quantized_state.h"
#include "quantized_kernels.h"

#include <algorithm>
#include <cstring>
#include <vector>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif

namespace memtrain::optim {
namespace {

struct LionCoeffs {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, decay, lr;
};

// One Lion update over n contiguous elements (m: state or a decoded block); returns max(0, m) and
// min(0, m) of the new moment for its block scale (max and min are exact in any order).
inline void lion_span(float* __restrict p, const float* __restrict g, float* __restrict m, std::int64_t n,
                      const LionCoeffs& c, float& m_hi, float& m_lo) {
  float hi = 0.0f, lo = 0.0f;
#pragma omp simd reduction(max : hi) reduction(min : lo)
  for (std::int64_t i = 0; i < n; ++i) {
    const float u = c.beta1 * m[i] + c.one_minus_beta1 * g[i];
    const float s = static_cast<float>((u > 0.0f) - (u < 0.0f));
    p[i] = p[i] * c.decay - c.lr * s;
    const float mi = c.beta2 * m[i] + c.one_minus_beta2 * g[i];
    m[i] = mi;
    hi = std::max(hi, mi);
    lo = std::min(lo, mi);
  }
  m_hi = hi;
  m_lo = lo;
}

#if defined(MEMTRAIN_OPTIM_AVX2)
// The coefficients in registers of the vector path's width.
template <int Lanes>
struct LionRegs {
  using V = detail::FloatVec<Lanes>;
  typename V::type beta1, one_minus_beta1, beta2, one_minus_beta2, decay, lr;
  explicit LionRegs(const LionCoeffs& c)
      : beta1(V::splat(c.beta1)), one_minus_beta1(V::splat(c.one_minus_beta1)),
        beta2(V::splat(c.beta2)), one_minus_beta2(V::splat(c.one_minus_beta2)),
        decay(V::splat(c.decay)), lr(V::splat(c.lr)) {}
};
#endif

#if defined(MEMTRAIN_OPTIM_AVX512)
// As adamw8bit_block_avx512: decode into the scratch, update 16 lanes at a time (the last group under a
// mask, so p and g beyond len are not touched and stale scratch lanes stay out of max and min), encode.
[[gnu::always_inline]] inline void lion8bit_block_avx512(float* p, const float* g, std::uint8_t* codes, float* absmax,
                                                         std::int64_t len, const LionRegs<16>& c,
                                                         const detail::EncodeTable& table, float* ms) {
  detail::decode_span_avx512(table, codes, len, *absmax, ms);
  const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
  __m512 hi = zero, lo = zero;
  for (std::int64_t i = 0; i < len; i += 16) {
    const __mmask16 k = detail::lanes_left(len - i);
    detail::prefetch_ahead(i, p, g, codes);
    const __m512 m = _mm512_loadu_ps(ms + i);
    const __m512 gi = _mm512_maskz_loadu_ps(k, g + i);
    const __m512 u = _mm512_add_ps(_mm512_mul_ps(c.beta1, m), _mm512_mul_ps(c.one_minus_beta1, gi));
    const __m512 s = _mm512_sub_ps(_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(u, zero, _CMP_GT_OQ), one),
                                   _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(u, zero, _CMP_LT_OQ), one));
    _mm512_mask_storeu_ps(p + i, k, _mm512_sub_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, p + i), c.decay),
                                                  _mm512_mul_ps(c.lr, s)));
    const __m512 mi = _mm512_add_ps(_mm512_mul_ps(c.beta2, m), _mm512_mul_ps(c.one_minus_beta2, gi));
    _mm512_storeu_ps(ms + i, mi);
    hi = _mm512_mask_max_ps(hi, k, hi, mi);
    lo = _mm512_mask_min_ps(lo, k, lo, mi);
  }
  const float new_scale = detail::block_scale(_mm512_reduce_max_ps(hi), _mm512_reduce_min_ps(lo));
  detail::encode_span_avx512(ms, len, new_scale, table, codes);
  *absmax = detail::stored_scale(new_scale);
}
#elif !defined(MEMTRAIN_OPTIM_AVX2)
void lion8bit_block_portable(float* p, const float* g, std::uint8_t* codes, float* absmax, std::int64_t len,
                             const LionCoeffs& c, const detail::EncodeTable& table, float* ms) {
  detail::dequantize_block(codes, len, *absmax, table.map, ms);
  float hi = 0.0f, lo = 0.0f;
  lion_span(p, g, ms, len, c, hi, lo);
  const float scale = detail::block_scale(hi, lo);
  detail::encode_span(ms, len, scale, table, codes);
  *absmax = detail::stored_scale(scale);
}
#else
// lion_span's expressions on 8 lanes: decode, update p in place, new moment to the scratch.
inline void lion8(float* p, const float* g, const std::uint8_t* mc, const float* map, __m256 scale,
                  const LionRegs<8>& c, float* ms, __m256& hi, __m256& lo) {
  const __m256 m = _mm256_mul_ps(detail::decode8(map, mc), scale);
  const __m256 gi = _mm256_loadu_ps(g);
  const __m256 u = _mm256_add_ps(_mm256_mul_ps(c.beta1, m), _mm256_mul_ps(c.one_minus_beta1, gi));
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  const __m256 s = _mm256_sub_ps(_mm256_and_ps(_mm256_cmp_ps(u, zero, _CMP_GT_OQ), one),
                                 _mm256_and_ps(_mm256_cmp_ps(u, zero, _CMP_LT_OQ), one));
  _mm256_storeu_ps(p, _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(p), c.decay), _mm256_mul_ps(c.lr, s)));
  const __m256 mi = _mm256_add_ps(_mm256_mul_ps(c.beta2, m), _mm256_mul_ps(c.one_minus_beta2, gi));
  _mm256_storeu_ps(ms, mi);
  hi = _mm256_max_ps(hi, mi);
  lo = _mm256_min_ps(lo, mi);
}

// The scratch holds round_up(len, 8) floats; a last group of fewer than 8 runs on padded copies (zero
// gradient and parameter, codes of value 0: the new moment there is 0, which leaves max and min alone).
// Inlined into the thread's loop, so the coefficients stay in registers across blocks (vector stores may
// alias anything, so values behind a reference would be reloaded every iteration).
[[gnu::always_inline]] inline void lion8bit_block_avx2(float* p, const float* g, std::uint8_t* codes, float* absmax, std::int64_t len,
                         const LionRegs<8>& c, const detail::EncodeTable& table, float* ms) {
  const __m256 scale = _mm256_set1_ps(*absmax);
  __m256 hi = _mm256_setzero_ps(), lo = _mm256_setzero_ps();
  std::int64_t i = 0;
  for (; i + 8 <= len; i += 8) lion8(p + i, g + i, codes + i, table.map, scale, c, ms + i, hi, lo);
  if (const std::int64_t rest = len - i; rest > 0) {
    const auto count = static_cast<std::size_t>(rest);
    float pt[8] = {}, gt[8] = {};
    std::uint8_t ct[8];
    std::memset(ct, table.zero_code, sizeof(ct));
    std::memcpy(pt, p + i, count * sizeof(float));
    std::memcpy(gt, g + i, count * sizeof(float));
    std::memcpy(ct, codes + i, count);
    lion8(pt, gt, ct, table.map, scale, c, ms + i, hi, lo);
    std::memcpy(p + i, pt, count * sizeof(float));
  }
  const float new_scale = detail::block_scale(detail::hmax8(hi), detail::hmin8(lo));
  detail::encode_span_avx2(ms, len, new_scale, table, codes);
  *absmax = detail::stored_scale(new_scale);
}
#endif

}  // namespace

Lion8bit::Lion8bit(std::vector<ParamGroup> groups, std::int64_t block_size, std::int64_t min_8bit_size)
    : Optimizer(std::move(groups)), block_size_(block_size), min_8bit_size_(min_8bit_size) {
  MT_CHECK(block_size > 0, "Lion8bit", "block_size must be positive, got {}", block_size);
  MT_CHECK(min_8bit_size >= 0, "Lion8bit", "min_8bit_size must be >= 0, got {}", min_8bit_size);
}

void Lion8bit::init_state(const Tensor& param, const ParamGroup&, ParamState& state) {
  check_f32_contiguous(param, "Lion8bit", /*cuda_ok=*/true);
  // Its step is not behind the backend contract yet, so it has no meta (dry-run) step.
  MT_CHECK(!param.device().is_meta(), "Lion8bit", "has no step on meta yet (AdamW, SGD and Lion do)");
  CategoryGuard guard(MemoryCategory::optimizer_state);
  const std::int64_t n = param.numel();
  const Device device = param.device();
  if (n >= min_8bit_size_) {
    MT_CHECK(device.is_cpu() || cuda::quant_block_size_supported(block_size_), "Lion8bit",
             "block_size {} is not supported on {} (a power of two in [32, 4096])", block_size_, device.str());
    QuantizedState m(n, QuantMap::signed_dynamic, block_size_);
    state.tensors["exp_avg.codes"] = m.codes().to(device);
    state.tensors["exp_avg.absmax"] = m.absmax().to(device);
  } else {
    state.tensors["exp_avg"] = zeros(param.shape(), DType::f32, device);
  }
}

void Lion8bit::update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) {
  const Tensor g_contig = grad_f32(grad, param.device());  // the base checked shape and finiteness
  if (param.device().is_cuda()) return update_cuda(param, g_contig, group, state);
  const float* g = g_contig.data<float>();
  float* p = param.data<float>();
  const std::int64_t n = param.numel();
  const std::int64_t bs = block_size_;
  const std::int64_t nb = (n + bs - 1) / bs;
  const LionCoeffs c{static_cast<float>(group.beta1), static_cast<float>(1.0 - group.beta1),
                     static_cast<float>(group.beta2), static_cast<float>(1.0 - group.beta2),
                     static_cast<float>(1.0 - group.lr * group.weight_decay), static_cast<float>(group.lr)};

  auto codes = state.tensors.find("exp_avg.codes");
  if (codes == state.tensors.end()) {
    float* m = state.tensors.at("exp_avg").data<float>();
#pragma omp parallel for schedule(static) if (n >= detail::kParallelMinElements)
    for (std::int64_t b = 0; b < nb; ++b) {
      const std::int64_t off = b * bs;
      float hi, lo;  // unused: fp32 state has no scale
      lion_span(p + off, g + off, m + off, std::min(bs, n - off), c, hi, lo);
    }
    return;
  }
  QuantizedState qm(codes->second, state.tensors.at("exp_avg.absmax"), QuantMap::signed_dynamic, bs);
  std::uint8_t* m_codes = qm.codes().data<std::uint8_t>();
  float* m_absmax = qm.absmax().data<float>();
  const detail::EncodeTable& table = detail::encode_table(QuantMap::signed_dynamic);
#pragma omp parallel if (n >= detail::kParallelMinElements)
  {
    detail::BlockScratch scratch(bs, 1);
    float* ms = scratch.array(0);
#if defined(MEMTRAIN_OPTIM_AVX512)
    const LionRegs<16> regs(c);
#elif defined(MEMTRAIN_OPTIM_AVX2)
    const LionRegs<8> regs(c);
#endif
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < nb; ++b) {
      const std::int64_t off = b * bs, len = std::min(bs, n - off);
#if defined(MEMTRAIN_OPTIM_AVX512)
      lion8bit_block_avx512(p + off, g + off, m_codes + off, m_absmax + b, len, regs, table, ms);
#elif defined(MEMTRAIN_OPTIM_AVX2)
      lion8bit_block_avx2(p + off, g + off, m_codes + off, m_absmax + b, len, regs, table, ms);
#else
      lion8bit_block_portable(p + off, g + off, m_codes + off, m_absmax + b, len, c, table, ms);
#endif
    }
  }
}

void Lion8bit::update_cuda(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) {
  const cuda::LionHyper hyper{group.lr, group.weight_decay, group.beta1, group.beta2,
                              /*skip_nonfinite=*/false};  // the base already checked the gradient
  const auto n = static_cast<std::size_t>(param.numel());
  const int device = param.device().index;
  if (state.tensors.count("exp_avg.codes") == 0) {
    cuda::lion_step(param.data<float>(), grad.data<float>(), state.tensors.at("exp_avg").data<float>(), n, hyper,
                    device);
    return;
  }
  cuda::lion8bit_step(param.data<float>(), grad.data<float>(), state.tensors.at("exp_avg.codes").data<std::uint8_t>(),
                      state.tensors.at("exp_avg.absmax").data<float>(), n, block_size_, hyper, device);
}

std::unique_ptr<Optimizer> make_lion8bit(std::vector<ParamGroup> groups, std::int64_t block_size,
                                         std::int64_t min_8bit_size) {
  return std::make_unique<Lion8bit>(std::move(groups), block_size, min_8bit_size);
}

}  // namespace memtrain::optim

// The contract's adamw8bit_step and lion8bit_step on the CPU (moved from optim/adamw8bit.cpp and
// lion8bit.cpp, whose classes keep the state and the step count). The encoder tables and block helpers are
// the 8-bit state's own (cpu/quantized_kernels.h).
//
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
//
// Lion8bit: like AdamW8bit, OpenMP over blocks with a one-block fp32 scratch per thread. With AVX2 one pass
// per block decodes the moment (scalar map loads), takes the sign update, writes the new moment to the
// scratch and tracks its max and min; a second pass encodes the scratch (quantized_kernels.h). Bytes
// streamed per parameter: p read and written, g read, one code read and written = 14 (fp32 Lion: 20).
// With AVX-512: decode first, then 16 lanes at a time, as AdamW8bit does.
//
// Rounding: every product and sum is rounded on its own, in the order written (fp-contract off below), on
// every path and in the fp32-state path, as the CUDA kernel (kernels/optim.cu) does; the AVX-512, AVX2 and
// portable paths give the same bits (tested).
#include "cpu/cpu_backend.h"

#include "cpu/quantized_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/fp_contract_off.h"  // last: it applies to what follows

namespace memtrain::cpu {
namespace {

namespace qk = ::memtrain::optim::detail;
using ::memtrain::QuantMap;

// ---- AdamW8bit ----


struct AdamCoeffs {
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float decay;      // 1 - lr * weight_decay
  float step_size;  // lr / (1 - beta1^t)
  float inv_sqrt_bc2;
  float eps;
};

AdamCoeffs coeffs(double lr, double beta1, double beta2, double eps, double weight_decay, std::int64_t step) {
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  return {static_cast<float>(beta1), static_cast<float>(beta2), static_cast<float>(1.0 - beta1),
          static_cast<float>(1.0 - beta2),  static_cast<float>(1.0 - lr * weight_decay),
          static_cast<float>(lr / bc1),     static_cast<float>(1.0 / std::sqrt(bc2)),
          static_cast<float>(eps)};
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
  const qk::EncodeTable& table;
};

#if defined(MEMTRAIN_OPTIM_AVX2)
// The coefficients in registers of the vector path's width.
template <int Lanes>
struct AdamRegs {
  using V = qk::FloatVec<Lanes>;
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
  qk::decode_span_avx512(m.table, m.codes, len, *m.absmax, ms);
  qk::decode_span_avx512(v.table, v.codes, len, *v.absmax, vs);
  __m512 m_hi = _mm512_setzero_ps(), m_lo = m_hi, v_hi = m_hi, v_lo = m_hi;
  for (std::int64_t i = 0; i < len; i += 16) {
    const __mmask16 k = qk::lanes_left(len - i);
    qk::prefetch_ahead(i, p, g, m.codes, v.codes);
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
  const float m_new = qk::block_scale(_mm512_reduce_max_ps(m_hi), _mm512_reduce_min_ps(m_lo));
  const float v_new = qk::block_scale(_mm512_reduce_max_ps(v_hi), _mm512_reduce_min_ps(v_lo));
  qk::encode_span_avx512(ms, len, m_new, m.table, m.codes);
  qk::encode_span_avx512(vs, len, v_new, v.table, v.codes);
  *m.absmax = qk::stored_scale(m_new);
  *v.absmax = qk::stored_scale(v_new);
}
#elif !defined(MEMTRAIN_OPTIM_AVX2)
void adamw8bit_block_portable(float* p, const float* g, const Moments8& m, const Moments8& v, std::int64_t len,
                              const AdamCoeffs& c, float* ms, float* vs) {
  qk::dequantize_block(m.codes, len, *m.absmax, m.table.map, ms);
  qk::dequantize_block(v.codes, len, *v.absmax, v.table.map, vs);
  const BlockRange r = adamw_span(p, g, ms, vs, len, c);
  const float m_scale = qk::block_scale(r.m_hi, r.m_lo), v_scale = qk::block_scale(r.v_hi, r.v_lo);
  qk::encode_span(ms, len, m_scale, m.table, m.codes);
  qk::encode_span(vs, len, v_scale, v.table, v.codes);
  *m.absmax = qk::stored_scale(m_scale);
  *v.absmax = qk::stored_scale(v_scale);
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
  const __m256 m = _mm256_mul_ps(qk::decode8(m_map, mc), m_scale);
  const __m256 v = _mm256_mul_ps(qk::decode8(v_map, vc), v_scale);
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
  const float m_new = qk::block_scale(qk::hmax8(r.m_hi), qk::hmin8(r.m_lo));
  const float v_new = qk::block_scale(qk::hmax8(r.v_hi), qk::hmin8(r.v_lo));
  qk::encode_span_avx2(ms, len, m_new, m.table, m_codes);
  qk::encode_span_avx2(vs, len, v_new, v.table, v_codes);
  *m.absmax = qk::stored_scale(m_new);
  *v.absmax = qk::stored_scale(v_new);
}
#endif

// Full-precision moments (tensors below the optimizer's min_8bit_size). Chunks of one block keep the
// parallel loop's body the same inlined kernel as the 8-bit path.
void adamw8bit_f32_state(float* p, const float* g, float* m, float* v, std::int64_t n, std::int64_t bs,
                         const AdamCoeffs& c) {
  const std::int64_t nb = (n + bs - 1) / bs;
#pragma omp parallel for schedule(static) if (n >= qk::kParallelMinElements)
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::int64_t off = b * bs;
    adamw_span(p + off, g + off, m + off, v + off, std::min(bs, n - off), c);
  }
}

void adamw8bit_blocks(float* p, const float* g, std::uint8_t* m_codes, float* m_absmax, std::uint8_t* v_codes,
                      float* v_absmax, std::int64_t n, std::int64_t bs, const AdamCoeffs& c) {
  const std::int64_t nb = (n + bs - 1) / bs;
  const qk::EncodeTable& m_table = qk::encode_table(QuantMap::signed_dynamic);
  const qk::EncodeTable& v_table = qk::encode_table(QuantMap::unsigned_dynamic);
#pragma omp parallel if (n >= qk::kParallelMinElements)
  {
    qk::BlockScratch scratch(bs, 2);  // one block per moment
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

// ---- Lion8bit ----
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
  using V = qk::FloatVec<Lanes>;
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
                                                         const qk::EncodeTable& table, float* ms) {
  qk::decode_span_avx512(table, codes, len, *absmax, ms);
  const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
  __m512 hi = zero, lo = zero;
  for (std::int64_t i = 0; i < len; i += 16) {
    const __mmask16 k = qk::lanes_left(len - i);
    qk::prefetch_ahead(i, p, g, codes);
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
  const float new_scale = qk::block_scale(_mm512_reduce_max_ps(hi), _mm512_reduce_min_ps(lo));
  qk::encode_span_avx512(ms, len, new_scale, table, codes);
  *absmax = qk::stored_scale(new_scale);
}
#elif !defined(MEMTRAIN_OPTIM_AVX2)
void lion8bit_block_portable(float* p, const float* g, std::uint8_t* codes, float* absmax, std::int64_t len,
                             const LionCoeffs& c, const qk::EncodeTable& table, float* ms) {
  qk::dequantize_block(codes, len, *absmax, table.map, ms);
  float hi = 0.0f, lo = 0.0f;
  lion_span(p, g, ms, len, c, hi, lo);
  const float scale = qk::block_scale(hi, lo);
  qk::encode_span(ms, len, scale, table, codes);
  *absmax = qk::stored_scale(scale);
}
#else
// lion_span's expressions on 8 lanes: decode, update p in place, new moment to the scratch.
inline void lion8(float* p, const float* g, const std::uint8_t* mc, const float* map, __m256 scale,
                  const LionRegs<8>& c, float* ms, __m256& hi, __m256& lo) {
  const __m256 m = _mm256_mul_ps(qk::decode8(map, mc), scale);
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
                         const LionRegs<8>& c, const qk::EncodeTable& table, float* ms) {
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
  const float new_scale = qk::block_scale(qk::hmax8(hi), qk::hmin8(lo));
  qk::encode_span_avx2(ms, len, new_scale, table, codes);
  *absmax = qk::stored_scale(new_scale);
}
#endif

// Full-precision moment (tensors below the optimizer's min_8bit_size), in chunks of one block.
void lion8bit_f32_state(float* p, const float* g, float* m, std::int64_t n, std::int64_t bs, const LionCoeffs& c) {
  const std::int64_t nb = (n + bs - 1) / bs;
#pragma omp parallel for schedule(static) if (n >= qk::kParallelMinElements)
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::int64_t off = b * bs;
    float hi, lo;  // unused: fp32 state has no scale
    lion_span(p + off, g + off, m + off, std::min(bs, n - off), c, hi, lo);
  }
}

void lion8bit_blocks(float* p, const float* g, std::uint8_t* m_codes, float* m_absmax, std::int64_t n,
                     std::int64_t bs, const LionCoeffs& c) {
  const std::int64_t nb = (n + bs - 1) / bs;
  const qk::EncodeTable& table = qk::encode_table(QuantMap::signed_dynamic);
#pragma omp parallel if (n >= qk::kParallelMinElements)
  {
    qk::BlockScratch scratch(bs, 1);
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

}  // namespace

// Any positive block size: the CPU kernels take a last, shorter block and a per-thread scratch of any size.
bool CpuBackend::blockwise_block_size_ok(std::int64_t block_size) const { return block_size > 0; }

void CpuBackend::adamw8bit_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                                const Tensor& exp_avg_absmax, const Tensor& exp_avg_sq,
                                const Tensor& exp_avg_sq_absmax, std::int64_t block_size, double lr, double beta1,
                                double beta2, double eps, double weight_decay, std::int64_t step) const {
  const Tensor g32 = grad.to(DType::f32).contiguous();
  if (!runs_kernels()) return;
  const AdamCoeffs c = coeffs(lr, beta1, beta2, eps, weight_decay, step);
  float* p = param.data<float>();
  const std::int64_t n = param.numel();
  if (!exp_avg_absmax.defined()) {
    adamw8bit_f32_state(p, g32.data<float>(), exp_avg.data<float>(), exp_avg_sq.data<float>(), n, block_size, c);
    return;
  }
  adamw8bit_blocks(p, g32.data<float>(), exp_avg.data<std::uint8_t>(), exp_avg_absmax.data<float>(),
                   exp_avg_sq.data<std::uint8_t>(), exp_avg_sq_absmax.data<float>(), n, block_size, c);
}

void CpuBackend::lion8bit_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                               const Tensor& exp_avg_absmax, std::int64_t block_size, double lr, double beta1,
                               double beta2, double weight_decay) const {
  const Tensor g32 = grad.to(DType::f32).contiguous();
  if (!runs_kernels()) return;
  const LionCoeffs c{static_cast<float>(beta1), static_cast<float>(1.0 - beta1),
                     static_cast<float>(beta2), static_cast<float>(1.0 - beta2),
                     static_cast<float>(1.0 - lr * weight_decay), static_cast<float>(lr)};
  float* p = param.data<float>();
  const std::int64_t n = param.numel();
  if (!exp_avg_absmax.defined()) {
    lion8bit_f32_state(p, g32.data<float>(), exp_avg.data<float>(), n, block_size, c);
    return;
  }
  lion8bit_blocks(p, g32.data<float>(), exp_avg.data<std::uint8_t>(), exp_avg_absmax.data<float>(), n, block_size,
                  c);
}

}  // namespace memtrain::cpu

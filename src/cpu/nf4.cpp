// The CPU's NF4 entries (core/backend_entries.def) and the scalar parts of the format: the quantiser, the
// block absmax, and the choice of dequantisation path (the span kernels are in nf4_dequant_simd.cpp).
//
// Quantiser: a 64-block's absmax is max |w|; w / absmax is rounded to f32 (as bitsandbytes does) and coded as
// the nearest NF4 level, ties to the lower one. The decision thresholds are exact: the largest float at or
// below each midpoint of adjacent levels, so "x > threshold" is "x nearer the upper level" for every float x.
// The block absmaxes minus their mean go through the 8-bit optimizer state's encoder (signed dynamic map,
// blocks of 256, the scale is a block's largest-magnitude value with its sign), so the nested quantisation
// is the one the 8-bit optimizers are tested with.
#include "cpu/nf4_kernels.h"

#include "core/nf4_table.h"
#include "cpu/cpu_backend.h"
#include "cpu/quantized_kernels.h"
#include "memtrain/core/error.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <limits>

#include "cpu/fp_contract_off.h"  // block_absmax rounds its product and its sum separately, as every backend does

namespace memtrain::cpu {
namespace qk = ::memtrain::optim::detail;
namespace nf4 {

namespace {
using ::memtrain::detail::kNf4Levels;

constexpr std::int64_t kBlock = 64, kAbsmaxBlock = 256;
constexpr std::int64_t kParallelBlocks = 256;  // below this a span is not worth a thread team

std::array<float, 15> make_thresholds() {
  std::array<float, 15> t{};
  for (int i = 0; i < 15; ++i) {
    const double mid = (double(kNf4Levels[i]) + double(kNf4Levels[i + 1])) / 2.0;  // exact in double
    float f = static_cast<float>(mid);
    if (double(f) > mid) f = std::nextafter(f, -std::numeric_limits<float>::infinity());
    t[i] = f;
  }
  return t;
}
const std::array<float, 15> kThresholds = make_thresholds();

std::uint8_t nearest_code(float x) {
  std::uint8_t c = 0;
  for (const float t : kThresholds) c += x > t ? 1 : 0;  // thresholds ascend
  return c;
}

bool cpu_has(const char* feature) {
  __builtin_cpu_init();
  return std::string_view(feature) == "avx512" ? __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
                                               : __builtin_cpu_supports("avx2");
}

DequantPath best_path() {
  if (cpu_has("avx512")) return DequantPath::avx512;
  return cpu_has("avx2") ? DequantPath::avx2 : DequantPath::scalar;
}

std::atomic<DequantPath> g_path{best_path()};

void dequantize(const Nf4View& v, std::int64_t first_block, std::int64_t blocks, void* out, bool bf16) {
  auto* span = dequant_span_scalar;
  if (g_path.load() == DequantPath::avx2) span = dequant_span_avx2;
  if (g_path.load() == DequantPath::avx512) span = dequant_span_avx512;
  const std::int64_t elem_bytes = bf16 ? 2 : 4;
  constexpr std::int64_t kChunk = 64;  // blocks per task
  const std::int64_t chunks = (blocks + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (blocks >= kParallelBlocks)
  for (std::int64_t ch = 0; ch < chunks; ++ch) {
    const std::int64_t b0 = ch * kChunk, n = std::min(kChunk, blocks - b0);
    span(v, first_block + b0, n, static_cast<char*>(out) + b0 * kBlock * elem_bytes, bf16);
  }
}
}  // namespace

bool path_supported(DequantPath path) {
  switch (path) {
    case DequantPath::avx2: return cpu_has("avx2");
    case DequantPath::avx512: return cpu_has("avx512");
    default: return true;
  }
}

void set_dequant_path(DequantPath path) {
  MT_CHECK(path_supported(path), "nf4::set_dequant_path", "this CPU does not run the requested path");
  g_path.store(path == DequantPath::best ? best_path() : path);
}

DequantPath dequant_path() { return g_path.load(); }

float block_absmax(const Nf4View& v, std::int64_t b) {
  return v.dynamic_map[v.absmax_codes[b]] * v.scales[b / kAbsmaxBlock] + v.mean;
}

void dequantize_f32(const Nf4View& v, std::int64_t first_block, std::int64_t blocks, float* out) {
  dequantize(v, first_block, blocks, out, false);
}
void dequantize_bf16(const Nf4View& v, std::int64_t first_block, std::int64_t blocks, std::uint16_t* out) {
  dequantize(v, first_block, blocks, out, true);
}

void quantize_blocks(const float* w, std::int64_t n, std::uint8_t* codes, float* absmax) {
#pragma omp parallel for schedule(static) if (n >= kParallelBlocks * kBlock)
  for (std::int64_t b = 0; b < n / kBlock; ++b) {
    const float* x = w + b * kBlock;
    float a = 0.0f;
    for (std::int64_t i = 0; i < kBlock; ++i) a = std::max(a, std::fabs(x[i]));
    absmax[b] = a;
    for (std::int64_t j = 0; j < kBlock / 2; ++j) {
      // An all-zero block codes every element as the exact 0 (and dequantises to 0 whatever its absmax).
      const std::uint8_t hi = a == 0.0f ? ::memtrain::detail::kNf4ZeroCode : nearest_code(x[2 * j] / a);
      const std::uint8_t lo = a == 0.0f ? ::memtrain::detail::kNf4ZeroCode : nearest_code(x[2 * j + 1] / a);
      codes[b * kBlock / 2 + j] = static_cast<std::uint8_t>(hi << 4 | lo);
    }
  }
}

}  // namespace nf4

float CpuBackend::nf4_quantize(const Tensor& codes, const Tensor& absmax_codes, const Tensor& absmax_scales,
                               const Tensor& w) const {
  const std::int64_t n = w.numel(), blocks = n / nf4::kBlock;
  // The f32 copy of w (none when it already is f32 and dense) and the per-block absmax: transient workspace.
  CategoryGuard workspace(MemoryCategory::workspace);
  const Tensor x = compute_operand(w);
  const Tensor absmax = ::memtrain::detail::workspace_on(w.device(), blocks, DType::f32);
  if (!runs_kernels()) return 0.0f;
  nf4::quantize_blocks(x.data<float>(), n, codes.data<std::uint8_t>(), absmax.data<float>());
  float* a = absmax.data<float>();
  double sum = 0.0;
  for (std::int64_t b = 0; b < blocks; ++b) sum += a[b];
  const float mean = blocks > 0 ? static_cast<float>(sum / static_cast<double>(blocks)) : 0.0f;
  for (std::int64_t b = 0; b < blocks; ++b) a[b] -= mean;  // in place: the centred values are all we keep
  const qk::EncodeTable& table = qk::encode_table(QuantMap::signed_dynamic);
  for (std::int64_t s = 0; s * nf4::kAbsmaxBlock < blocks; ++s) {
    const std::int64_t b0 = s * nf4::kAbsmaxBlock, len = std::min(nf4::kAbsmaxBlock, blocks - b0);
    float hi = 0.0f, lo = 0.0f;
    for (std::int64_t i = 0; i < len; ++i) {
      hi = std::max(hi, a[b0 + i]);
      lo = std::min(lo, a[b0 + i]);
    }
    const float scale = qk::block_scale(hi, lo);
    qk::encode_span(a + b0, len, scale, table, absmax_codes.data<std::uint8_t>() + b0);
    absmax_scales.data<float>()[s] = scale;
  }
  return mean;
}

void CpuBackend::nf4_dequantize(const Tensor& out, const Tensor& codes, const Tensor& absmax_codes,
                                const Tensor& absmax_scales, float absmax_mean, std::int64_t start) const {
  if (!runs_kernels()) return;
  const nf4::Nf4View v{codes.data<const std::uint8_t>(), absmax_codes.data<const std::uint8_t>(),
                       absmax_scales.data<const float>(), absmax_mean,
                       qk::encode_table(QuantMap::signed_dynamic).map};
  const std::int64_t first = start / nf4::kBlock, blocks = out.numel() / nf4::kBlock;
  if (out.dtype() == DType::bf16) {
    nf4::dequantize_bf16(v, first, blocks, static_cast<std::uint16_t*>(out.data_ptr()));
  } else {
    nf4::dequantize_f32(v, first, blocks, out.data<float>());
  }
}

}  // namespace memtrain::cpu

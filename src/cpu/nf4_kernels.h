// The CPU's NF4 kernels (memtrain/ops/nf4.h has the format): the quantiser (scalar: it runs once per weight)
// and the dequantiser, a scalar reference plus AVX2 and AVX-512 paths compiled with target attributes and
// picked at run time, so every build carries all three and tests can force each against the scalar one.
#pragma once

#include <cstdint>

namespace memtrain::cpu::nf4 {

// Where the stored matrix lives: codes [n/2], absmax_codes [n/64], scales [ceil(n/64/256)], the mean, and
// the signed dynamic map the absmax codes index.
struct Nf4View {
  const std::uint8_t* codes = nullptr;
  const std::uint8_t* absmax_codes = nullptr;
  const float* scales = nullptr;
  float mean = 0.0f;
  const float* dynamic_map = nullptr;
};

enum class DequantPath { scalar, avx2, avx512, best };
// Whether this CPU runs the path (scalar and best: always).
bool path_supported(DequantPath path);
// The path the dequantiser uses from now on (tests); best: the widest this CPU runs. Throws when unsupported.
void set_dequant_path(DequantPath path);
DequantPath dequant_path();  // resolved: never best

// Block b's absmax: dynamic_map[absmax_codes[b]] * scales[b / 256] + mean, rounded after each step.
float block_absmax(const Nf4View& v, std::int64_t b);

// Elements [64 first_block, 64 (first_block + blocks)) of the flattened matrix into out (f32, or bf16 bits),
// by the chosen path; OpenMP over blocks.
void dequantize_f32(const Nf4View& v, std::int64_t first_block, std::int64_t blocks, float* out);
void dequantize_bf16(const Nf4View& v, std::int64_t first_block, std::int64_t blocks, std::uint16_t* out);

// The per-path span kernels (nf4_dequant_simd.cpp), single-threaded.
void dequant_span_scalar(const Nf4View& v, std::int64_t first_block, std::int64_t blocks, void* out, bool bf16);
void dequant_span_avx2(const Nf4View& v, std::int64_t first_block, std::int64_t blocks, void* out, bool bf16);
void dequant_span_avx512(const Nf4View& v, std::int64_t first_block, std::int64_t blocks, void* out, bool bf16);

// Codes of n floats (n % 64 == 0) and the per-block absmax, f32 [n/64].
void quantize_blocks(const float* w, std::int64_t n, std::uint8_t* codes, float* absmax);

}  // namespace memtrain::cpu::nf4

// Block-wise 8-bit state (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization").
// A state tensor of n floats is split into blocks of `block_size` elements; each block keeps n 8-bit codes
// and one fp32 absmax. A code indexes a 256-entry dynamic tree map (values in [-1, 1] or [0, 1], sorted
// ascending), so value = map[code] * absmax. The stored absmax is the block's largest-magnitude value
// WITH its sign, so that element is exact whichever its sign (the signed map has +1 but no -1). Optimizers dequantize a block into a small fp32 scratch,
// update it and requantize it, so fp32 state for a whole tensor never exists. Reusable by any optimizer
// (AdamW8bit, Lion8bit, GaLore's projected state, offloaded state).
#pragma once

#include "memtrain/core/quant_map.h"
#include "memtrain/core/tensor.h"

#include <array>
#include <cstdint>

namespace memtrain::optim {

// The two dynamic tree maps (memtrain/core/quant_map.h describes them), sorted ascending.
using ::memtrain::QuantMap;
const std::array<float, 256>& dynamic_map(QuantMap map);

namespace detail {
// Nearest code of x (already divided by absmax) in a sorted 256-entry map; ties go to the lower code.
// The reference the fast encoder is tested against.
std::uint8_t quantize_nearest(float x, const float* map);
// One block of `len` floats: absmax of the block (0 for an all-zero block) and its codes. NaN is not
// expected (the optimizers skip non-finite gradients before they reach the state). `map` must be one of
// the two dynamic_map()s. Same result as quantize_block_reference, bit for bit.
float quantize_block(const float* src, std::int64_t len, const float* map, std::uint8_t* codes);
void dequantize_block(const std::uint8_t* codes, std::int64_t len, float absmax, const float* map, float* dst);

// The pieces of quantize_block, for kernels that track a block's max and min while they compute it.
using ::memtrain::detail::block_scale;  // (hi, lo): memtrain/core/quant_map.h
float block_scale(const float* src, std::int64_t len);
// Codes of src[i] / scale for i < len (all the zero code when scale is 0), by the fastest encoder built:
// arithmetic with AVX-512 (the register search tree where that is unsure), else the table encoder with AVX2,
// else encode_block_scalar.
void encode_block(const float* src, std::int64_t len, float scale, const float* map, std::uint8_t* codes);
void encode_block_scalar(const float* src, std::int64_t len, float scale, const float* map, std::uint8_t* codes);
// quantize_block by a plain max/min loop and a binary search per element (quantize_nearest).
float quantize_block_reference(const float* src, std::int64_t len, const float* map, std::uint8_t* codes);
}  // namespace detail

class QuantizedState {
 public:
  QuantizedState() = default;
  // Allocates codes (u8 [n]) and absmax (f32 [ceil(n / block_size)]) under MemoryCategory::optimizer_state,
  // holding all zeros.
  QuantizedState(std::int64_t numel, QuantMap map, std::int64_t block_size = 256);
  // Wraps existing tensors (e.g. taken from an optimizer's ParamState); checks dtypes and sizes.
  QuantizedState(Tensor codes, Tensor absmax, QuantMap map, std::int64_t block_size = 256);

  std::int64_t numel() const { return numel_; }
  std::int64_t block_size() const { return block_size_; }
  std::int64_t num_blocks() const { return (numel_ + block_size_ - 1) / block_size_; }
  std::int64_t block_length(std::int64_t b) const;  // block_size, or less for the last block
  QuantMap map_kind() const { return map_kind_; }
  const float* map() const { return map_; }
  const Tensor& codes() const { return codes_; }
  const Tensor& absmax() const { return absmax_; }
  std::size_t nbytes() const { return codes_.nbytes() + absmax_.nbytes(); }

  // dst/src hold block_length(b) floats.
  void dequantize_block(std::int64_t b, float* dst) const;
  void quantize_block(std::int64_t b, const float* src);

  // Whole-tensor conversions over n floats (tests, checkpoint inspection); OpenMP over blocks.
  void quantize(const float* src);
  void dequantize(float* dst) const;

  static std::int64_t num_blocks_for(std::int64_t numel, std::int64_t block_size) {
    return (numel + block_size - 1) / block_size;
  }

 private:
  Tensor codes_;
  Tensor absmax_;
  std::int64_t numel_ = 0;
  std::int64_t block_size_ = 256;
  QuantMap map_kind_ = QuantMap::signed_dynamic;
  const float* map_ = nullptr;
};

}  // namespace memtrain::optim

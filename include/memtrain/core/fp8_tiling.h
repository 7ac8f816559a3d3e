// The tile geometry of blockwise FP8 (DeepSeek-V3): a row-major (rows, cols) matrix is cut into tiles of
// 1x128 (activations: one scale per row per 128 columns) or 128x128 (weights); edge tiles are partial. One
// definition below the layers that use it (amp/fp8.h, the CPU and CUDA backends), so a tensor quantized on
// any device carries the same scale grid.
#pragma once

#include <cstdint>

namespace memtrain {

// Tile shapes of blockwise FP8: 1 x 128 (per row) or 128 x 128.
enum class Fp8Tiling { row_1x128, block_128x128 };

constexpr std::int64_t kFp8TileCols = 128;
constexpr std::int64_t fp8_tile_rows(Fp8Tiling tiling) { return tiling == Fp8Tiling::row_1x128 ? 1 : 128; }
// Shape of the inverse-scale matrix for a (rows, cols) input: (ceil(rows / tile rows), ceil(cols / 128)).
constexpr std::int64_t fp8_scale_rows(std::int64_t rows, Fp8Tiling tiling) {
  return (rows + fp8_tile_rows(tiling) - 1) / fp8_tile_rows(tiling);
}
constexpr std::int64_t fp8_scale_cols(std::int64_t cols) { return (cols + kFp8TileCols - 1) / kFp8TileCols; }

}  // namespace memtrain

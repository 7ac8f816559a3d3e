// Resizing NCHW images, for progressive resizing (training first on smaller images): bilinear interpolation
// with half-pixel centres (align_corners false) and, when shrinking, a triangle filter widened by the scale
// factor so every input pixel contributes (PyTorch's F.interpolate(mode="bilinear", antialias=True)).
//
// Separable: out = R_h x R_w^T per image, with R [out, in] rows of interpolation weights
//   w(o, i) = tri((i + 0.5 - (o + 0.5) * f) / s) / sum_i tri(...),  f = in / out, s = max(f, 1),
//   tri(t) = max(0, 1 - |t|).
// It runs as two ops::linear calls, so it works on any device (meta included, where a plan sees its bytes)
// and is differentiable, though training only ever feeds it data.
#pragma once

#include "memtrain/core/tensor.h"

#include <vector>

namespace memtrain::nn {

// The weights of one axis, row-major [out, in], in float64.
std::vector<double> resize_weights(std::int64_t in, std::int64_t out);

// x [B, C, H, W] (floating) -> [B, C, height, width]; x itself (no copy) when the size is unchanged.
Tensor resize_images(const Tensor& x, std::int64_t height, std::int64_t width);

}  // namespace memtrain::nn

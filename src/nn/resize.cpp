#include "memtrain/nn/resize.h"

#include "memtrain/core/error.h"
#include "memtrain/ops/linalg.h"

#include <algorithm>
#include <cmath>

namespace memtrain::nn {

std::vector<double> resize_weights(std::int64_t in, std::int64_t out) {
  MT_CHECK(in >= 1 && out >= 1, "nn::resize_weights", "sizes must be positive, got {} -> {}", in, out);
  const double f = static_cast<double>(in) / static_cast<double>(out), support = std::max(f, 1.0);
  std::vector<double> w(static_cast<std::size_t>(in * out), 0.0);
  for (std::int64_t o = 0; o < out; ++o) {
    const double centre = (static_cast<double>(o) + 0.5) * f;
    double* row = w.data() + o * in;
    double total = 0.0;
    for (std::int64_t i = 0; i < in; ++i) {
      const double t = (static_cast<double>(i) + 0.5 - centre) / support;
      row[i] = std::max(0.0, 1.0 - std::abs(t));
      total += row[i];
    }
    // Upsampling near the border leaves one neighbour outside [0, in): the rest is renormalised, which is the
    // clamp-to-edge of half-pixel bilinear interpolation.
    for (std::int64_t i = 0; i < in; ++i) row[i] /= total;
  }
  return w;
}

Tensor resize_images(const Tensor& x, std::int64_t height, std::int64_t width) {
  MT_CHECK(x.dim() == 4 && is_floating(x.dtype()), "nn::resize_images", "expects floating x [B, C, H, W], got {} {}",
           dtype_name(x.dtype()), shape_str(x.shape()));
  MT_CHECK(height >= 1 && width >= 1, "nn::resize_images", "target size must be positive, got {}x{}", height, width);
  const std::int64_t h = x.size(2), w = x.size(3);
  if (h == height && w == width) return x;
  const Tensor rw = from_buffer(resize_weights(w, width).data(), {width, w}, DType::f64, x.dtype(), x.device());
  const Tensor rh = from_buffer(resize_weights(h, height).data(), {height, h}, DType::f64, x.dtype(), x.device());
  const Tensor cols = ops::linear(x, rw);                                        // [B, C, H, width]
  return ops::linear(cols.transpose(2, 3), rh).transpose(2, 3).contiguous();     // [B, C, height, width]
}

}  // namespace memtrain::nn

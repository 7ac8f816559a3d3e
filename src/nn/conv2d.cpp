#include "memtrain/nn/conv2d.h"

#include "memtrain/core/error.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/nn.h"

#include <cmath>

namespace memtrain::nn {

Conv2d::Conv2d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel_size, std::int64_t stride,
               std::int64_t padding, bool bias, DType dtype, std::int64_t groups)
    : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size), stride_(stride),
      padding_(padding), groups_(groups) {
  MT_CHECK(in_channels > 0 && out_channels > 0 && kernel_size > 0, "nn::Conv2d",
           "in {}, out {} and kernel {} must be positive", in_channels, out_channels, kernel_size);
  MT_CHECK(stride >= 1 && padding >= 0, "nn::Conv2d", "needs stride >= 1 and padding >= 0, got {} and {}", stride,
           padding);
  MT_CHECK(groups >= 1 && in_channels % groups == 0 && out_channels % groups == 0, "nn::Conv2d",
           "groups {} must be >= 1 and divide in {} and out {}", groups, in_channels, out_channels);
  const std::int64_t fan_in = in_channels / groups * kernel_size * kernel_size;
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  Tensor w = new_parameter({out_channels, in_channels / groups, kernel_size, kernel_size}, dtype);
  init_uniform_(w, -bound, bound);
  weight_ = register_parameter("weight", w);
  if (bias) {
    Tensor b = new_parameter({out_channels}, dtype);
    init_uniform_(b, -bound, bound);
    bias_ = register_parameter("bias", b);
  }
}

Tensor Conv2d::forward(const Tensor& x) const {
  MT_CHECK(x.dim() == 4 && x.size(1) == in_channels_, "nn::Conv2d",
           "Conv2d({}, {}, kernel {}) expected x [B, {}, H, W], got {}", in_channels_, out_channels_, kernel_size_,
           in_channels_, shape_str(x.shape()));
  MT_CHECK(x.size(2) + 2 * padding_ >= kernel_size_ && x.size(3) + 2 * padding_ >= kernel_size_, "nn::Conv2d",
           "Conv2d({}, {}, kernel {}, padding {}): input {} is smaller than the kernel", in_channels_, out_channels_,
           kernel_size_, padding_, shape_str(x.shape()));
  return ops::conv2d(x, weight_, bias_, stride_, padding_, groups_);
}

void init_uniform_(Tensor& t, double lo, double hi) {
  MT_CHECK(lo < hi, "nn::init_uniform_", "needs lo < hi, got [{}, {}]", lo, hi);
  t.copy_(rand(t.shape(), t.dtype(), t.device()) * (hi - lo) + lo);  // rand is (0, 1]: no graph recorded
}

}  // namespace memtrain::nn

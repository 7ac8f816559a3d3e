// Conv2d: y = conv2d(x, weight, bias) over NCHW images, weight [out, in / groups, k, k], bias [out] (optional),
// square kernel, the same stride and zero padding on both spatial dims. groups splits the channels into groups
// convolved separately (groups == in == out: a depthwise convolution). PyTorch's default init:
// kaiming_uniform with a = sqrt(5), which is uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) with
// fan_in = in / groups * k * k, for the weight and the bias alike; drawn from the default RNG stream
// (manual_seed), weight first.
#pragma once

#include "memtrain/nn/module.h"

namespace memtrain::nn {

class Conv2d : public Module {
 public:
  Conv2d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel_size, std::int64_t stride = 1,
         std::int64_t padding = 0, bool bias = true, DType dtype = DType::f32, std::int64_t groups = 1);
  // x [B, in, H, W] -> [B, out, (H + 2p - k) / s + 1, (W + 2p - k) / s + 1].
  Tensor forward(const Tensor& x) const;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }  // undefined without bias

 private:
  std::int64_t in_channels_, out_channels_, kernel_size_, stride_, padding_, groups_;
  Tensor weight_;
  Tensor bias_;
};

// In place, not recorded by autograd: t = uniform(lo, hi) from the default RNG stream.
void init_uniform_(Tensor& t, double lo, double hi);

}  // namespace memtrain::nn

// BatchNorm2d over NCHW: y = (x - mean) / sqrt(var + eps) * weight + bias per channel, weight [C] (init 1),
// bias [C] (init 0), as PyTorch's nn.BatchNorm2d (affine, track_running_stats).
//   train(): mean and the biased var over (B, H, W) of this batch, differentiable through both; then, without
//            recording a graph, running = (1 - momentum) * running + momentum * batch stat, the running var
//            taking the unbiased var (n / (n - 1)), and num_batches_tracked += 1.
//   eval():  the running statistics, treated as constants.
// Buffers (in state_dict, not trained): running_mean [C] (init 0), running_var [C] (init 1) in the layer's
// dtype, and num_batches_tracked, an i64 scalar, as in PyTorch checkpoints.
// Composed from differentiable ops (mean, sub, mul, rsqrt), so autograd needs no rule of its own.
#pragma once

#include "memtrain/nn/module.h"

namespace memtrain::nn {

class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(std::int64_t num_features, double eps = 1e-5, double momentum = 0.1, DType dtype = DType::f32);
  // x [B, C, H, W] -> [B, C, H, W]. Not const: in training mode it updates the running statistics.
  Tensor forward(const Tensor& x);
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  const Tensor& running_mean() const { return running_mean_; }
  const Tensor& running_var() const { return running_var_; }
  std::int64_t num_batches_tracked() const;

 private:
  std::int64_t num_features_;
  double eps_;
  double momentum_;
  Tensor weight_;
  Tensor bias_;
  Tensor running_mean_;
  Tensor running_var_;
  Tensor num_batches_tracked_;
};

}  // namespace memtrain::nn

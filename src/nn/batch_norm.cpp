#include "memtrain/nn/batch_norm.h"

#include "memtrain/autograd/grad_mode.h"
#include "memtrain/ckpt/checkpoint.h"
#include "memtrain/core/error.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/nn.h"
#include "memtrain/ops/reduce.h"

namespace memtrain::nn {

BatchNorm2d::BatchNorm2d(std::int64_t num_features, double eps, double momentum, DType dtype)
    : num_features_(num_features), eps_(eps), momentum_(momentum) {
  MT_CHECK(num_features > 0, "nn::BatchNorm2d", "num_features must be positive, got {}", num_features);
  MT_CHECK(eps > 0.0, "nn::BatchNorm2d", "eps must be positive, got {}", eps);
  MT_CHECK(momentum >= 0.0 && momentum <= 1.0, "nn::BatchNorm2d", "momentum must be in [0, 1], got {}", momentum);
  weight_ = register_parameter("weight", new_parameter({num_features}, dtype).fill_(1.0));
  bias_ = register_parameter("bias", new_parameter({num_features}, dtype).zero_());
  running_mean_ = register_buffer("running_mean", zeros({num_features}, dtype));
  running_var_ = register_buffer("running_var", ones({num_features}, dtype));
  num_batches_tracked_ = register_buffer("num_batches_tracked", zeros({}, DType::i64));
}

std::int64_t BatchNorm2d::num_batches_tracked() const { return num_batches_tracked_.item<std::int64_t>(); }

Tensor BatchNorm2d::forward(const Tensor& x) {
  MT_CHECK(x.dim() == 4 && x.size(1) == num_features_, "nn::BatchNorm2d",
           "BatchNorm2d({}) expected x [B, {}, H, W], got {}", num_features_, num_features_, shape_str(x.shape()));
  if (x.device().is_cuda()) {  // fused kernels; the CPU keeps the composition below (same rule)
    const bool update = is_training() && !ckpt::in_rerun();
    Tensor y = ops::batch_norm(x, weight_, bias_, running_mean_, running_var_, is_training(), momentum_, eps_, update);
    if (update) num_batches_tracked_.fill_(static_cast<double>(num_batches_tracked() + 1));
    return y;
  }
  const std::int64_t C = num_features_;
  const Shape per_channel{1, C, 1, 1};
  const Tensor w = weight_.reshape(per_channel), b = bias_.reshape(per_channel);
  if (!is_training()) {
    const Tensor invstd = ops::rsqrt(running_var_.reshape(per_channel) + eps_);  // (1,C,1,1), constants
    return (x - running_mean_.reshape(per_channel)) * (invstd * w) + b;
  }
  const std::int64_t n = x.size(0) * x.size(2) * x.size(3);  // values per channel
  MT_CHECK(n > 1, "nn::BatchNorm2d", "training needs more than one value per channel, got input {}",
           shape_str(x.shape()));
  const Tensor mean = ops::mean(x, {0, 2, 3}, true);     // (1,C,1,1)
  const Tensor xc = x - mean;                            // (B,C,H,W)
  const Tensor var = ops::mean(xc * xc, {0, 2, 3}, true);  // (1,C,1,1), biased: what normalises the batch
  Tensor y = xc * (ops::rsqrt(var + eps_) * w) + b;
  if (!ckpt::in_rerun()) {  // a checkpoint re-run recomputes this batch; its statistics are already in
    autograd::NoGradGuard no_grad;
    const double m = momentum_, unbias = static_cast<double>(n) / static_cast<double>(n - 1);
    running_mean_.copy_(running_mean_ * (1.0 - m) + mean.detach().reshape({C}) * m);
    running_var_.copy_(running_var_ * (1.0 - m) + var.detach().reshape({C}) * (m * unbias));
    num_batches_tracked_.fill_(static_cast<double>(num_batches_tracked() + 1));
  }
  return y;
}

}  // namespace memtrain::nn

#include "memtrain/nn/batch_norm.h"

#include "memtrain/ckpt/checkpoint.h"
#include "memtrain/core/error.h"
#include "memtrain/ops/nn.h"

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

// ops::batch_norm holds the rule (and picks the device's fused kernels or the composition); the module keeps the
// checks that name it, the checkpoint rule for its running statistics and the batch count.
Tensor BatchNorm2d::forward(const Tensor& x) {
  MT_CHECK(x.dim() == 4 && x.size(1) == num_features_, "nn::BatchNorm2d",
           "BatchNorm2d({}) expected x [B, {}, H, W], got {}", num_features_, num_features_, shape_str(x.shape()));
  if (is_training()) {
    const std::int64_t n = x.size(0) * x.size(2) * x.size(3);  // values per channel
    MT_CHECK(n > 1, "nn::BatchNorm2d", "training needs more than one value per channel, got input {}",
             shape_str(x.shape()));
  }
  // A checkpoint re-run recomputes this batch; its statistics are already in.
  const bool update = is_training() && !ckpt::in_rerun();
  Tensor y = ops::batch_norm(x, weight_, bias_, running_mean_, running_var_, is_training(), momentum_, eps_, update);
  if (update) num_batches_tracked_.fill_(static_cast<double>(num_batches_tracked() + 1));
  return y;
}

}  // namespace memtrain::nn

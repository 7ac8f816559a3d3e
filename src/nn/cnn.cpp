#include "memtrain/nn/cnn.h"

#include "memtrain/core/error.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/nn.h"

#include <string>

namespace memtrain::nn {

void CNNConfig::validate() const {
  MT_CHECK(in_channels > 0 && conv1_channels > 0 && conv2_channels > 0 && hidden > 0 && num_classes > 0, "CNNConfig",
           "sizes must be positive: in_channels {} conv1 {} conv2 {} hidden {} num_classes {}", in_channels,
           conv1_channels, conv2_channels, hidden, num_classes);
  MT_CHECK(image_size >= 4 && image_size % 4 == 0, "CNNConfig",
           "image_size must be a positive multiple of 4 (two 2x2 pools), got {}", image_size);
  MT_CHECK(dropout >= 0.0 && dropout < 1.0, "CNNConfig", "dropout must be in [0, 1), got {}", dropout);
}

Tensor CNN::ConvStage::forward(const Tensor& x) const {
  return ops::max_pool2d(ops::relu(bn->forward(conv->forward(x))), 2);
}

CNN::CNN(const CNNConfig& config, DType dtype) : config_(config) {
  config_.validate();
  const auto& c = config_;
  const std::int64_t side = c.image_size / 4;
  const std::int64_t channels[] = {c.in_channels, c.conv1_channels, c.conv2_channels};
  for (std::size_t i = 0; i < stages_.size(); ++i) {  // registers conv1, bn1, conv2, bn2 in this order
    const std::string n = std::to_string(i + 1);
    stages_[i].conv =
        register_module("conv" + n, std::make_shared<Conv2d>(channels[i], channels[i + 1], 3, 1, 1, true, dtype));
    stages_[i].bn = register_module("bn" + n, std::make_shared<BatchNorm2d>(channels[i + 1], 1e-5, 0.1, dtype));
  }
  fc1_ = register_module("fc1", std::make_shared<Linear>(c.conv2_channels * side * side, c.hidden, true, dtype));
  init_torch_default_(*fc1_);
  dropout_ = register_module("dropout", std::make_shared<Dropout>(c.dropout));
  fc2_ = register_module("fc2", std::make_shared<Linear>(c.hidden, c.num_classes, true, dtype));
  init_torch_default_(*fc2_);
}

Tensor CNN::forward(const Tensor& x) {
  const auto& c = config_;
  MT_CHECK(x.dim() == 4 && x.size(1) == c.in_channels && x.size(2) == c.image_size && x.size(3) == c.image_size,
           "nn::CNN", "expected x [B, {}, {}, {}], got {}", c.in_channels, c.image_size, c.image_size,
           shape_str(x.shape()));
  Tensor h = x;
  const auto n = static_cast<std::int64_t>(stages_.size());
  for (std::int64_t i = 0; i < n; ++i)  // (B,C1,S/2,S/2), then (B,C2,S/4,S/4)
    h = run_block(i, n, [&stage = stages_[i]](const Tensor& in) { return stage.forward(in); }, h);
  h = dropout_->forward(ops::relu(fc1_->forward(h.flatten(1))));                // (B,hidden)
  return fc2_->forward(h);                                                      // (B,classes)
}

Tensor CNN::loss(const Tensor& x, const Tensor& targets) {
  MT_CHECK(targets.dim() == 1 && x.dim() >= 1 && targets.size(0) == x.size(0), "nn::CNN::loss",
           "targets {} must be [B] for x {}", shape_str(targets.shape()), shape_str(x.shape()));
  return ops::cross_entropy(forward(x), targets, ops::Reduction::mean, -100);
}

}  // namespace memtrain::nn

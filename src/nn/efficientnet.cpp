#include "memtrain/nn/efficientnet.h"

#include "memtrain/core/error.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/nn.h"
#include "memtrain/ops/reduce.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace memtrain::nn {

namespace {
const char* kWhere = "EfficientNetConfig";

// Output side of a convolution with kernel k, padding k/2 and `stride` (odd k keeps the side at stride 1).
std::int64_t conv_side(std::int64_t side, std::int64_t kernel, std::int64_t stride) {
  return (side + 2 * (kernel / 2) - kernel) / stride + 1;
}
}  // namespace

SiluKind silu_kind_from_name(const std::string& name) {
  if (name == "input") return SiluKind::saves_input;
  if (name == "output") return SiluKind::saves_output;
  ::memtrain::detail::throw_error("nn::silu_kind_from_name",
                                  fmt::format("unknown SiLU kind '{}': expected input (saves x only) or output "
                                              "(x * sigmoid(x), which keeps sigmoid(x) too)",
                                              name));
}

Tensor silu(const Tensor& x, SiluKind kind) {
  return kind == SiluKind::saves_input ? ops::silu(x) : ops::mul(x, ops::sigmoid(x));
}

// B0's stages: (expand, kernel, stride, channels, repeats).
std::vector<MBConvStage> EfficientNetConfig::b0_stages() {
  return {{1, 3, 1, 16, 1}, {6, 3, 2, 24, 2}, {6, 5, 2, 40, 2}, {6, 3, 2, 80, 3},
          {6, 5, 1, 112, 3}, {6, 5, 2, 192, 4}, {6, 3, 1, 320, 1}};
}

void EfficientNetConfig::validate() const {
  MT_CHECK(in_channels > 0 && num_classes > 0 && stem_channels > 0 && head_channels > 0, kWhere,
           "sizes must be positive: in_channels {} num_classes {} stem_channels {} head_channels {}", in_channels,
           num_classes, stem_channels, head_channels);
  MT_CHECK(width_mult > 0 && depth_mult > 0 && std::isfinite(width_mult) && std::isfinite(depth_mult), kWhere,
           "width_mult {} and depth_mult {} must be positive", width_mult, depth_mult);
  MT_CHECK(stem_stride >= 1 && min_feature_size >= 1 && image_size >= min_feature_size, kWhere,
           "needs stem_stride >= 1 and image_size >= min_feature_size >= 1, got {}, {} and {}", stem_stride,
           image_size, min_feature_size);
  MT_CHECK(se_ratio > 0 && se_ratio <= 1, kWhere, "se_ratio must be in (0, 1], got {}", se_ratio);
  MT_CHECK(dropout >= 0 && dropout < 1, kWhere, "dropout must be in [0, 1), got {}", dropout);
  MT_CHECK(!stages.empty(), kWhere, "needs at least one stage");
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const MBConvStage& s = stages[i];
    MT_CHECK(s.expand >= 1 && s.kernel >= 1 && s.kernel % 2 == 1 && (s.stride == 1 || s.stride == 2) &&
                 s.channels > 0 && s.repeats > 0,
             kWhere, "stage {}: needs expand >= 1, an odd kernel, stride 1 or 2, channels and repeats > 0; got "
             "expand {} kernel {} stride {} channels {} repeats {}", i + 1, s.expand, s.kernel, s.stride,
             s.channels, s.repeats);
  }
}

std::int64_t EfficientNetConfig::scaled_channels(std::int64_t channels) const {
  const double scaled = static_cast<double>(channels) * width_mult;
  constexpr std::int64_t divisor = 8;
  std::int64_t rounded = std::max(divisor, static_cast<std::int64_t>(scaled + divisor / 2.0) / divisor * divisor);
  if (static_cast<double>(rounded) < 0.9 * scaled) rounded += divisor;
  return rounded;
}

std::int64_t EfficientNetConfig::scaled_repeats(std::int64_t repeats) const {
  return static_cast<std::int64_t>(std::ceil(depth_mult * static_cast<double>(repeats)));
}

SqueezeExcite::SqueezeExcite(std::int64_t channels, std::int64_t squeezed, SiluKind silu, DType dtype)
    : silu_(silu) {
  reduce_ = register_module("reduce", std::make_shared<Conv2d>(channels, squeezed, 1, 1, 0, true, dtype));
  expand_ = register_module("expand", std::make_shared<Conv2d>(squeezed, channels, 1, 1, 0, true, dtype));
}

Tensor SqueezeExcite::forward(const Tensor& x) const {
  const Tensor pooled = ops::mean(x, {2, 3}, /*keepdim=*/true);  // [B, C, 1, 1]
  const Tensor gate = ops::sigmoid(expand_->forward(silu(reduce_->forward(pooled), silu_)));
  return ops::mul(x, gate);
}

MBConv::MBConv(std::int64_t in, std::int64_t out, std::int64_t expand, std::int64_t kernel, std::int64_t stride,
               std::int64_t squeezed, SiluKind silu, DType dtype)
    : silu_(silu), residual_(stride == 1 && in == out) {
  const std::int64_t mid = in * expand;
  if (expand != 1) {
    expand_ = register_module("expand_conv", std::make_shared<Conv2d>(in, mid, 1, 1, 0, false, dtype));
    expand_bn_ = register_module("expand_bn", std::make_shared<BatchNorm2d>(mid, 1e-5, 0.1, dtype));
  }
  depthwise_ = register_module(
      "depthwise_conv", std::make_shared<Conv2d>(mid, mid, kernel, stride, kernel / 2, false, dtype, /*groups=*/mid));
  depthwise_bn_ = register_module("depthwise_bn", std::make_shared<BatchNorm2d>(mid, 1e-5, 0.1, dtype));
  se_ = register_module("se", std::make_shared<SqueezeExcite>(mid, squeezed, silu, dtype));
  project_ = register_module("project_conv", std::make_shared<Conv2d>(mid, out, 1, 1, 0, false, dtype));
  project_bn_ = register_module("project_bn", std::make_shared<BatchNorm2d>(out, 1e-5, 0.1, dtype));
}

Tensor MBConv::forward(const Tensor& x) {
  Tensor h = x;
  if (expand_) h = silu(expand_bn_->forward(expand_->forward(h)), silu_);
  h = silu(depthwise_bn_->forward(depthwise_->forward(h)), silu_);
  h = project_bn_->forward(project_->forward(se_->forward(h)));
  return residual_ ? ops::add(h, x) : h;
}

EfficientNet::EfficientNet(const EfficientNetConfig& config, DType dtype) : config_(config) {
  config_.validate();
  const auto& c = config_;
  const std::int64_t stem = c.scaled_channels(c.stem_channels);
  stem_ = register_module("stem_conv", std::make_shared<Conv2d>(c.in_channels, stem, 3, c.stem_stride, 1, false, dtype));
  stem_bn_ = register_module("stem_bn", std::make_shared<BatchNorm2d>(stem, 1e-5, 0.1, dtype));
  blocks_ = register_module("blocks", std::make_shared<ModuleList>());
  std::int64_t side = conv_side(c.image_size, 3, c.stem_stride), in = stem;
  for (std::size_t i = 0; i < c.stages.size(); ++i) {
    const MBConvStage& s = c.stages[i];
    const std::int64_t out = c.scaled_channels(s.channels), repeats = c.scaled_repeats(s.repeats);
    // A stride that would take the map below min_feature_size is dropped: small inputs keep a spatial map.
    const std::int64_t stride = conv_side(side, s.kernel, s.stride) >= c.min_feature_size ? s.stride : 1;
    const std::int64_t in_first = in;
    for (std::int64_t r = 0; r < repeats; ++r) {
      const std::int64_t squeezed = std::max<std::int64_t>(1, static_cast<std::int64_t>(in * c.se_ratio));
      blocks_->append(std::make_shared<MBConv>(in, out, s.expand, s.kernel, r == 0 ? stride : 1, squeezed, c.silu,
                                               dtype));
      in = out;
    }
    side = conv_side(side, s.kernel, stride);
    stage_lines_.push_back(fmt::format("stage {}: {} x MBConv{} k{} s{} {} -> {}, {}x{}", i + 1, repeats, s.expand,
                                       s.kernel, stride, in_first, out, side, side));
  }
  head_ = register_module("head_conv", std::make_shared<Conv2d>(in, c.head_channels, 1, 1, 0, false, dtype));
  head_bn_ = register_module("head_bn", std::make_shared<BatchNorm2d>(c.head_channels, 1e-5, 0.1, dtype));
  dropout_ = register_module("dropout", std::make_shared<Dropout>(c.dropout));
  classifier_ = register_module("classifier", std::make_shared<Linear>(c.head_channels, c.num_classes, true, dtype));
  init_torch_default_(*classifier_);
}

Tensor EfficientNet::forward(const Tensor& x) {
  const auto& c = config_;
  MT_CHECK(x.dim() == 4 && x.size(1) == c.in_channels && x.size(2) >= c.min_feature_size &&
               x.size(3) >= c.min_feature_size,
           "nn::EfficientNet", "expected x [B, {}, H, W] with H, W >= {}, got {}", c.in_channels, c.min_feature_size,
           shape_str(x.shape()));
  Tensor h = silu(stem_bn_->forward(stem_->forward(x)), c.silu);
  const std::int64_t n = num_blocks();
  for (std::int64_t i = 0; i < n; ++i) {
    MBConv& block = *blocks_->get<MBConv>(static_cast<std::size_t>(i));
    h = run_block(i, n, [&block](const Tensor& in) { return block.forward(in); }, h);
  }
  h = silu(head_bn_->forward(head_->forward(h)), c.silu);
  h = ops::mean(h, {2, 3});  // global average pooling: [B, head_channels]
  return classifier_->forward(dropout_->forward(h));
}

Tensor EfficientNet::loss(const Tensor& x, const Tensor& targets) {
  MT_CHECK(targets.dim() == 1 && x.dim() >= 1 && targets.size(0) == x.size(0), "nn::EfficientNet::loss",
           "targets {} must be [B] for x {}", shape_str(targets.shape()), shape_str(x.shape()));
  return ops::cross_entropy(forward(x), targets, ops::Reduction::mean, -100);
}

std::string EfficientNet::describe() const {
  std::string out = fmt::format("EfficientNet (width {}, depth {}), {} MBConv blocks, {} parameters\n",
                                config_.width_mult, config_.depth_mult, num_blocks(), num_parameters());
  for (const std::string& line : stage_lines_) out += "  " + line + "\n";
  return out;
}

}  // namespace memtrain::nn

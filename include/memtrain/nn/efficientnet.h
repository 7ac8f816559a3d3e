// EfficientNet (Tan & Le, 2019): a stem convolution, stages of MBConv blocks (inverted residuals with a
// depthwise convolution and squeeze-and-excitation), a 1x1 head convolution, global average pooling and a
// linear classifier. Stages follow B0's table, scaled by a width and a depth multiplier (B0's rounding: channels
// to a multiple of 8, never below 90% of the scaled width; repeats rounded up) and by the input: a stage's stride
// 2 becomes 1 once the feature map would fall below min_feature_size, so small images (28x28) keep a spatial map.
//
//   MBConv(in, out, expand e, kernel k, stride s):
//     [expand: conv1x1 in -> e*in, BN, SiLU]  (absent when e == 1)
//     depthwise conv kxk, stride s, padding k/2, BN, SiLU
//     squeeze-and-excitation: mean over H, W -> conv1x1 -> SiLU -> conv1x1 -> sigmoid, scaling each channel
//     project: conv1x1 -> out, BN
//     + x when s == 1 and in == out
//
// SiLU saves only its input for the backward (ops::silu; its derivative is recomputed from x). SiluKind::
// saves_output instead computes x * sigmoid(x) from two differentiable ops, which keep sigmoid(x) as well:
// what an autograd without a SiLU rule stores, kept for the memory comparison of the example.
//
// Parameter names: stem_conv, stem_bn, blocks.<i>.{expand_conv, expand_bn, depthwise_conv, depthwise_bn,
// se.reduce, se.expand, project_conv, project_bn} (blocks numbered across stages), head_conv, head_bn,
// classifier. Each MBConv block is one checkpoint region (Module::set_checkpointing). Convolutions and the
// classifier use PyTorch's default init (nn::Conv2d, nn::init_torch_default_).
#pragma once

#include "memtrain/nn/batch_norm.h"
#include "memtrain/nn/block_checkpointed_module.h"
#include "memtrain/nn/containers.h"
#include "memtrain/nn/conv2d.h"
#include "memtrain/nn/dropout.h"
#include "memtrain/nn/linear.h"

#include <memory>
#include <string>
#include <vector>

namespace memtrain::nn {

enum class SiluKind { saves_input, saves_output };
SiluKind silu_kind_from_name(const std::string& name);  // "input" or "output"
// SiLU as `kind` records it for the backward.
Tensor silu(const Tensor& x, SiluKind kind);

struct MBConvStage {
  std::int64_t expand = 6;
  std::int64_t kernel = 3;
  std::int64_t stride = 1;
  std::int64_t channels = 16;  // output channels before the width multiplier
  std::int64_t repeats = 1;    // before the depth multiplier
};

struct EfficientNetConfig {
  std::int64_t in_channels = 1;
  std::int64_t image_size = 28;  // the training resolution; forward takes any size >= min_feature_size
  std::int64_t num_classes = 10;
  double width_mult = 0.5;
  double depth_mult = 0.5;
  std::int64_t stem_channels = 32;  // before the width multiplier
  std::int64_t stem_stride = 1;     // B0: 2 at 224x224
  std::int64_t head_channels = 256; // after the last stage (B0: 1280; not scaled)
  double se_ratio = 0.25;           // squeeze width = block input channels * se_ratio (at least 1)
  std::int64_t min_feature_size = 7;  // Fashion-MNIST: 28 -> 14 -> 7, then 7x7 (4x4 lost 1.6 points of accuracy)
  double dropout = 0.2;             // before the classifier
  SiluKind silu = SiluKind::saves_input;
  std::vector<MBConvStage> stages = b0_stages();

  static std::vector<MBConvStage> b0_stages();
  void validate() const;
  // Channels after the width multiplier and B0's rounding.
  std::int64_t scaled_channels(std::int64_t channels) const;
  std::int64_t scaled_repeats(std::int64_t repeats) const;
};

class SqueezeExcite : public Module {
 public:
  SqueezeExcite(std::int64_t channels, std::int64_t squeezed, SiluKind silu, DType dtype = DType::f32);
  // x [B, C, H, W] -> x * sigmoid(expand(silu(reduce(mean_HW(x))))), the gate broadcast over H, W.
  Tensor forward(const Tensor& x) const;

 private:
  SiluKind silu_;
  std::shared_ptr<Conv2d> reduce_;
  std::shared_ptr<Conv2d> expand_;
};

class MBConv : public Module {
 public:
  MBConv(std::int64_t in, std::int64_t out, std::int64_t expand, std::int64_t kernel, std::int64_t stride,
         std::int64_t squeezed, SiluKind silu, DType dtype = DType::f32);
  Tensor forward(const Tensor& x);  // not const: batch norm updates its running statistics
  bool has_residual() const { return residual_; }

 private:
  SiluKind silu_;
  bool residual_;
  std::shared_ptr<Conv2d> expand_;  // null when expand == 1
  std::shared_ptr<BatchNorm2d> expand_bn_;
  std::shared_ptr<Conv2d> depthwise_;
  std::shared_ptr<BatchNorm2d> depthwise_bn_;
  std::shared_ptr<SqueezeExcite> se_;
  std::shared_ptr<Conv2d> project_;
  std::shared_ptr<BatchNorm2d> project_bn_;
};

// Checkpointable blocks (BlockCheckpointedModule): the MBConv blocks, one region each.
class EfficientNet : public BlockCheckpointedModule {
 public:
  explicit EfficientNet(const EfficientNetConfig& config = {}, DType dtype = DType::f32);
  // x [B, in_channels, H, W], H and W at least min_feature_size -> logits [B, num_classes].
  Tensor forward(const Tensor& x);
  Tensor loss(const Tensor& x, const Tensor& targets);  // mean cross entropy, -100 ignored
  const EfficientNetConfig& config() const { return config_; }
  std::int64_t num_blocks() const { return static_cast<std::int64_t>(blocks_->size()); }
  // One line per stage: "stage 2: 2 x MBConv6 k3 s2 16 -> 24, 14x14".
  std::string describe() const;

 private:
  EfficientNetConfig config_;
  std::shared_ptr<Conv2d> stem_;
  std::shared_ptr<BatchNorm2d> stem_bn_;
  std::shared_ptr<ModuleList> blocks_;
  std::vector<std::string> stage_lines_;
  std::shared_ptr<Conv2d> head_;
  std::shared_ptr<BatchNorm2d> head_bn_;
  std::shared_ptr<Dropout> dropout_;
  std::shared_ptr<Linear> classifier_;
};

}  // namespace memtrain::nn

// CNN: a small convolutional classifier for 28x28 grey images (Fashion-MNIST, MNIST).
//   x [B, 1, 28, 28] -> conv1 (3x3, pad 1) -> bn1 -> relu -> max-pool 2   [B, 32, 14, 14]
//                    -> conv2 (3x3, pad 1) -> bn2 -> relu -> max-pool 2   [B, 64, 7, 7]
//                    -> flatten -> fc1 -> relu -> dropout -> fc2           [B, 10] logits
// Parameter names: conv{1,2}.{weight,bias}, bn{1,2}.{weight,bias}, fc{1,2}.{weight,bias}; buffers
// bn{1,2}.{running_mean,running_var,num_batches_tracked} (the names of the same nn.Module in PyTorch).
// Init is PyTorch's default for every layer (uniform +-1/sqrt(fan_in) for conv and linear weights and biases,
// BatchNorm weight 1 and bias 0), drawn from the default RNG stream in registration order.
// Default sizes: 421,834 parameters (fc1 holds 401,536 of them).
#pragma once

#include "memtrain/nn/batch_norm.h"
#include "memtrain/nn/block_checkpointed_module.h"
#include "memtrain/nn/conv2d.h"
#include "memtrain/nn/dropout.h"
#include "memtrain/nn/linear.h"

#include <array>
#include <memory>

namespace memtrain::nn {

struct CNNConfig {
  std::int64_t in_channels = 1;
  std::int64_t image_size = 28;  // square images; must be divisible by 4 (two 2x2 pools)
  std::int64_t conv1_channels = 32;
  std::int64_t conv2_channels = 64;
  std::int64_t hidden = 128;  // fc1 width
  std::int64_t num_classes = 10;
  double dropout = 0.0;       // after fc1's relu
  void validate() const;
};

// Checkpointable blocks (BlockCheckpointedModule): the two conv stages (conv, batch norm, relu, pool), one
// region each.
class CNN : public BlockCheckpointedModule {
 public:
  explicit CNN(const CNNConfig& config = {}, DType dtype = DType::f32);
  // x [B, in_channels, image_size, image_size] -> logits [B, num_classes]. Not const: batch norm updates its
  // running statistics in training mode.
  Tensor forward(const Tensor& x);
  // Mean cross entropy of forward(x) against integer targets [B] (-100 ignored).
  Tensor loss(const Tensor& x, const Tensor& targets);
  const CNNConfig& config() const { return config_; }

 private:
  // conv (3x3, pad 1) -> batch norm -> relu -> max-pool 2, one checkpoint block.
  struct ConvStage {
    std::shared_ptr<Conv2d> conv;
    std::shared_ptr<BatchNorm2d> bn;
    Tensor forward(const Tensor& x) const;  // [B, Cin, S, S] -> [B, Cout, S/2, S/2]
  };

  CNNConfig config_;
  std::array<ConvStage, 2> stages_;  // conv1 and bn1, conv2 and bn2
  std::shared_ptr<Linear> fc1_;
  std::shared_ptr<Dropout> dropout_;
  std::shared_ptr<Linear> fc2_;
};

}  // namespace memtrain::nn

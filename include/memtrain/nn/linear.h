// Linear: y = x W^T + b with weight [out, in] and bias [out] (PyTorch layout; Hugging Face GPT-2's Conv1D
// stores [in, out], so a checkpoint loader transposes). Init as GPT-2: weight normal(0, init_std), bias zero.
#pragma once

#include "memtrain/nn/module.h"

namespace memtrain::nn {

class Linear : public Module {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, bool bias = true, DType dtype = DType::f32,
         double init_std = 0.02);
  Tensor forward(const Tensor& x) const;  // x [..., in] -> [..., out]
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }  // undefined without bias

 private:
  Tensor weight_;
  Tensor bias_;
};

}  // namespace memtrain::nn

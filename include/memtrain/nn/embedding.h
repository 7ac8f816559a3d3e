// Embedding: a lookup table weight [num_embeddings, dim], init normal(0, init_std) as GPT-2.
#pragma once

#include "memtrain/nn/module.h"

namespace memtrain::nn {

class Embedding : public Module {
 public:
  Embedding(std::int64_t num_embeddings, std::int64_t dim, DType dtype = DType::f32, double init_std = 0.02);
  Tensor forward(const Tensor& indices) const;  // integer [...] -> [..., dim]
  const Tensor& weight() const { return weight_; }

 private:
  Tensor weight_;
};

}  // namespace memtrain::nn

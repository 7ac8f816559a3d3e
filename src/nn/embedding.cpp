#include "memtrain/nn/embedding.h"

#include "memtrain/core/error.h"
#include "memtrain/ops/nn.h"

namespace memtrain::nn {

Embedding::Embedding(std::int64_t num_embeddings, std::int64_t dim, DType dtype, double init_std) {
  MT_CHECK(num_embeddings > 0 && dim > 0, "nn::Embedding", "sizes must be positive, got [{}, {}]", num_embeddings,
           dim);
  Tensor w = new_parameter({num_embeddings, dim}, dtype);
  init_normal_(w, init_std);
  weight_ = register_parameter("weight", w);
}

Tensor Embedding::forward(const Tensor& indices) const { return ops::embedding(weight_, indices); }

}  // namespace memtrain::nn

#include "memtrain/nn/mlp.h"

#include "memtrain/ckpt/op_label.h"
#include "memtrain/core/error.h"
#include "memtrain/ops/elementwise.h"

#include <cmath>

namespace memtrain::nn {

MLP::MLP(std::int64_t n_embd, std::int64_t n_layer, bool bias, double dropout, DType dtype, const TensorShard& shard)
    : shard_(shard) {
  MT_CHECK(n_layer > 0, "nn::MLP", "n_layer must be positive, got {}", n_layer);
  const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(n_layer));
  if (!shard.split()) {
    c_fc_ = register_module("c_fc", std::make_shared<Linear>(n_embd, 4 * n_embd, bias, dtype));
    c_proj_ = register_module("c_proj", std::make_shared<Linear>(4 * n_embd, n_embd, bias, dtype, proj_std));
  } else {
    const Range units = shard.even_part(4 * n_embd);  // this rank's hidden units
    c_fc_ = register_module("c_fc", make_linear_part(n_embd, 4 * n_embd, bias, dtype, 0.02, {units}, {0, n_embd}));
    c_proj_ = register_module("c_proj",
                              make_linear_part(4 * n_embd, n_embd, bias, dtype, proj_std, {{0, n_embd}}, units));
  }
  dropout_ = register_module("dropout", std::make_shared<Dropout>(dropout));
}

Tensor MLP::forward(const Tensor& x) const {
  const Tensor in = column_parallel_input(x, shard_);
  // Labelled so that selective checkpointing can keep one projection and recompute the other (op_label.h).
  const Tensor fc = ckpt::labelled("mlp.fc", [&] { return c_fc_->forward(in); });  // (B,T,4C)
  const Tensor h = ops::gelu(fc, ops::GeluApproximation::tanh);                     // (B,T,4C)
  return dropout_->forward(ckpt::labelled("mlp.proj", [&] { return row_parallel_forward(*c_proj_, h, shard_); }));
}

}  // namespace memtrain::nn

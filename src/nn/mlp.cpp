#include "memtrain/nn/mlp.h"

#include "memtrain/ckpt/op_label.h"
#include "memtrain/core/error.h"
#include "memtrain/ops/elementwise.h"

#include <cmath>

namespace memtrain::nn {

MLP::MLP(std::int64_t n_embd, std::int64_t n_layer, bool bias, double dropout, DType dtype) {
  MT_CHECK(n_layer > 0, "nn::MLP", "n_layer must be positive, got {}", n_layer);
  c_fc_ = register_module("c_fc", std::make_shared<Linear>(n_embd, 4 * n_embd, bias, dtype));
  c_proj_ = register_module("c_proj", std::make_shared<Linear>(4 * n_embd, n_embd, bias, dtype,
                                                               0.02 / std::sqrt(2.0 * static_cast<double>(n_layer))));
  dropout_ = register_module("dropout", std::make_shared<Dropout>(dropout));
}

Tensor MLP::forward(const Tensor& x) const {
  // Labelled so that selective checkpointing can keep one projection and recompute the other (op_label.h).
  const Tensor fc = ckpt::labelled("mlp.fc", [&] { return c_fc_->forward(x); });  // (B,T,4C)
  const Tensor h = ops::gelu(fc, ops::GeluApproximation::tanh);                    // (B,T,4C)
  return dropout_->forward(ckpt::labelled("mlp.proj", [&] { return c_proj_->forward(h); }));  // (B,T,C)
}

}  // namespace memtrain::nn

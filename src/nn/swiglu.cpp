#include "memtrain/nn/swiglu.h"

#include "memtrain/ckpt/op_label.h"
#include "memtrain/core/error.h"
#include "memtrain/ops/elementwise.h"

namespace memtrain::nn {

SwiGLU::SwiGLU(std::int64_t n_embd, std::int64_t intermediate_size, DType dtype) {
  MT_CHECK(n_embd > 0 && intermediate_size > 0, "nn::SwiGLU", "sizes must be positive, got n_embd {} intermediate {}",
           n_embd, intermediate_size);
  // Registration order is HF's: gate_proj, up_proj, down_proj.
  gate_proj_ = register_module("gate_proj", std::make_shared<Linear>(n_embd, intermediate_size, false, dtype));
  up_proj_ = register_module("up_proj", std::make_shared<Linear>(n_embd, intermediate_size, false, dtype));
  down_proj_ = register_module("down_proj", std::make_shared<Linear>(intermediate_size, n_embd, false, dtype));
}

Tensor SwiGLU::forward(const Tensor& x) const {
  // Labelled so that selective checkpointing can tell the projections apart (op_label.h).
  const Tensor gate = ckpt::labelled("mlp.gate", [&] { return gate_proj_->forward(x); });  // (..., I)
  const Tensor up = ckpt::labelled("mlp.up", [&] { return up_proj_->forward(x); });        // (..., I)
  const Tensor h = ops::silu(gate) * up;                                                   // (..., I)
  return ckpt::labelled("mlp.down", [&] { return down_proj_->forward(h); });               // (..., C)
}

}  // namespace memtrain::nn

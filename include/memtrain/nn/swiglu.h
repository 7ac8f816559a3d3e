// SwiGLU MLP (LLaMA): down_proj(silu(gate_proj(x)) * up_proj(x)), all three Linear layers without bias,
// gate/up [I, C] and down [C, I]; weights normal(0, 0.02) as HF LLaMA initialises every Linear.
#pragma once

#include "memtrain/nn/linear.h"

#include <memory>

namespace memtrain::nn {

class SwiGLU : public Module {
 public:
  SwiGLU(std::int64_t n_embd, std::int64_t intermediate_size, DType dtype = DType::f32);
  Tensor forward(const Tensor& x) const;  // x [..., C] -> [..., C]

 private:
  std::shared_ptr<Linear> gate_proj_;
  std::shared_ptr<Linear> up_proj_;
  std::shared_ptr<Linear> down_proj_;
};

}  // namespace memtrain::nn

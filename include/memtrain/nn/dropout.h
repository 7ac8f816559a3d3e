// Dropout(p): active only in training mode (Module::train / eval); identity when p == 0.
#pragma once

#include "memtrain/nn/module.h"

namespace memtrain::nn {

class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.0);
  Tensor forward(const Tensor& x) const;
  double p() const { return p_; }

 private:
  double p_;
};

}  // namespace memtrain::nn

// Runs backward over the tape: dependency-counted, newest node first, gradients summed per node before it
// runs, saved tensors released right after each node unless retain_graph. All allocations made while
// backward runs are accounted as MemoryCategory::gradients.
#pragma once

#include "memtrain/core/tensor.h"

#include <vector>

namespace memtrain::autograd {

// roots[i] gets gradient grads[i] (same shape). Leaves that require grad receive .grad.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph = false);

// Clears the gradients of `params`: frees them (set_to_none, the default) or fills them with zeros.
void zero_grad(const std::vector<Tensor>& params, bool set_to_none = true);

}  // namespace memtrain::autograd

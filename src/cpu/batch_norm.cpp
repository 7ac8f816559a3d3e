// batch_norm on the CPU (and so on meta): no fused kernels. ops::batch_norm composes differentiable ops there
// (mean, sub, mul, rsqrt: nn::BatchNorm2d's rule, pinned by its golden tests against PyTorch), each of which
// runs through this backend; autograd derives the backward from them, which no backend entry can record.
#include "cpu/cpu_backend.h"

#include "memtrain/core/error.h"

namespace memtrain::cpu {

bool CpuBackend::has_batch_norm_kernels() const { return false; }

void CpuBackend::batch_norm_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                    const Tensor&, const Tensor&, const Tensor&, bool, double, double) const {
  ::memtrain::detail::throw_error("batch_norm",
                                  "the CPU backend has no fused kernel: ops::batch_norm composes ops here "
                                  "(has_batch_norm_kernels() is false)");
}

void CpuBackend::batch_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                     const Tensor&, const Tensor&, const Tensor&, bool) const {
  ::memtrain::detail::throw_error("batch_norm_backward",
                                  "the CPU backend has no fused kernel: autograd differentiates ops::batch_norm's "
                                  "composition here (has_batch_norm_kernels() is false)");
}

}  // namespace memtrain::cpu

// The CUDA backend's optimizer-step and gradient-utility entries (src/cuda/cuda_backend_entries.h) over the
// raw launchers of cuda/optim.h and reduce.h. The steps read an f32 contiguous gradient; any other
// gradient is converted through the host, as the optimizers did before their steps moved here.
#include "cuda/cuda_backend_entries.h"

#include "cuda/optim.h"
#include "cuda/reduce.h"

#include <algorithm>
#include <cstdint>

namespace memtrain::cuda {
namespace {

// grad as the f32 contiguous tensor on its device that the step kernels read: itself when it is one, else a
// converted copy (made on the CPU, then copied back).
Tensor grad_f32(const Tensor& grad) {
  if (grad.dtype() == DType::f32 && grad.is_contiguous()) return grad;
  return grad.to(Device::cpu()).to(DType::f32).contiguous().to(grad.device());
}

}  // namespace

// The gradient is finite (the optimizer checked it), so the kernels skip their own non-finite gate.
void CudaBackend::adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                             double lr, double beta1, double beta2, double eps, double weight_decay,
                             std::int64_t step) const {
  const Tensor g32 = grad_f32(grad);
  const AdamWHyper hyper{lr, weight_decay, beta1, beta2, eps, step, /*skip_nonfinite=*/false};
  cuda::adamw_step(param.data<float>(), g32.data<float>(), exp_avg.data<float>(), exp_avg_sq.data<float>(),
                   static_cast<std::size_t>(param.numel()), hyper, param.device().index);
}

void CudaBackend::sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, double lr,
                           double momentum, double weight_decay, bool nesterov, std::int64_t step) const {
  const Tensor g32 = grad_f32(grad);
  const SgdHyper hyper{lr, weight_decay, momentum, nesterov, step, /*skip_nonfinite=*/false};
  float* buf = momentum > 0.0 ? momentum_buffer.data<float>() : nullptr;
  cuda::sgd_step(param.data<float>(), g32.data<float>(), buf, static_cast<std::size_t>(param.numel()), hyper,
                 param.device().index);
}

void CudaBackend::lion_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, double lr, double beta1,
                            double beta2, double weight_decay) const {
  const Tensor g32 = grad_f32(grad);
  const LionHyper hyper{lr, weight_decay, beta1, beta2, /*skip_nonfinite=*/false};
  cuda::lion_step(param.data<float>(), g32.data<float>(), exp_avg.data<float>(),
                  static_cast<std::size_t>(param.numel()), hyper, param.device().index);
}

// f32 contiguous gradients are checked on the device; others as the CPU reads them, after one copy there.
bool CudaBackend::all_finite(const Tensor& g) const {
  if (g.dtype() == DType::f32 && g.is_contiguous())
    return grad_is_finite(g.data<float>(), static_cast<std::size_t>(g.numel()), g.device().index);
  const Tensor f = g.to(Device::cpu()).to(DType::f32).contiguous();
  return ::memtrain::detail::backend_for(Device::cpu()).all_finite(f);
}

// One f64 per tensor from cuda::sum_of_squares (squared and added in f64, as the CPU does), read back in one
// copy and added on the host in order.
double CudaBackend::sum_of_squares(const std::vector<Tensor>& tensors) const {
  std::vector<Tensor> nonempty;
  for (const Tensor& t : tensors)
    if (t.numel() > 0) nonempty.push_back(t);
  if (nonempty.empty()) return 0.0;
  const Device device = nonempty.front().device();
  const Tensor sums = Tensor::empty({static_cast<std::int64_t>(nonempty.size())}, DType::f64, device);
  for (std::size_t i = 0; i < nonempty.size(); ++i) {
    const Tensor g = nonempty[i].detach().contiguous();
    cuda::sum_of_squares(g.data_ptr(), g.dtype(), static_cast<std::size_t>(g.numel()), sums.data<double>() + i,
                         device.index);
  }
  const Tensor host = sums.to(Device::cpu());
  double total = 0.0;
  for (std::size_t i = 0; i < nonempty.size(); ++i) total += host.data<double>()[i];
  return total;
}

// The blocks reduced on the device, then read back in one copy.
void CudaBackend::block_sums_of_squares(const Tensor& x, double* out) const {
  constexpr std::int64_t kBlock = 256;
  if (x.numel() == 0) return;
  const Tensor sums = Tensor::empty({(x.numel() + kBlock - 1) / kBlock}, DType::f64, x.device());
  cuda::block_sums_of_squares(x.data_ptr(), x.dtype(), static_cast<std::size_t>(x.numel()), kBlock,
                              sums.data<double>(), x.device().index);
  const Tensor host = sums.to(Device::cpu());
  std::copy(host.data<double>(), host.data<double>() + host.numel(), out);
}

}  // namespace memtrain::cuda

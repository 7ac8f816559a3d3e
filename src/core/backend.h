// The backend contract: what a device kind must provide so that tensors and ops run on it. An op's
// front-end (src/ops/) checks shapes and dtypes once, allocates its outputs on the operands' device,
// records autograd, and then calls the one entry of the backend registered for that device:
//
//   detail::backend_for(x.device()).layer_norm_forward(out, mean, rstd, x, weight, bias, eps);
//
// Backends implement kernels only: no autograd, no policy, no shape rules beyond what their kernels
// need (a kernel's own layout limits, e.g. "contiguous", are checked by the backend that has them).
//
// The backends (docs/architecture.md):
// - cpu  (src/cpu/cpu_backend.h): the reference. Always registered.
// - meta (src/meta/): the CPU backend with every kernel skipped. It allocates exactly what the CPU
//   backend allocates (outputs, converted copies, workspace), so a step on meta accounts the same bytes
//   as the step on the CPU; it reads as zeros (item() is 0), the documented answer for data-dependent
//   branches. Always registered.
// - cuda (src/cuda/): registered when the build has CUDA; backend_for() names why a device is unusable.
//
// Entries still to move here call the raw functions of memtrain/cuda/ from the op front-ends; the
// migration is tracked in docs/adding_an_op.md.
#pragma once

#include "memtrain/core/allocator.h"
#include "memtrain/core/device.h"
#include "memtrain/core/rng.h"
#include "memtrain/core/tensor.h"

#include <memory>
#include <string>

namespace memtrain::detail {

class Backend {
 public:
  virtual ~Backend() = default;

  // ---- memory and tensor core ----
  // Where the device's bytes come from (one source per device index; the Allocator owns it).
  virtual std::unique_ptr<MemorySource> make_memory_source(int index) const = 0;
  // dst[...] = value over any view. value converts like cpu::write_from_double.
  virtual void fill(const Tensor& dst, double value) const = 0;
  // dst = src, both on this backend's device, same shape; dtypes and strides may differ.
  virtual void copy(const Tensor& dst, const Tensor& src) const = 0;
  // Bytes between this backend's device and the CPU (the other side): dst and src contiguous, same
  // dtype and shape, exactly one of them on this device. Never called on the CPU backend.
  virtual void transfer(const Tensor& dst, const Tensor& src) const = 0;
  // The one element of t as a double (the caller checked numel() == 1).
  virtual double read_scalar(const Tensor& t) const = 0;
  // dst (contiguous, floating) = normal or uniform (0, 1] floats of the Philox stream at `state`; the
  // caller reserved the stream's blocks, so every backend draws the same numbers.
  virtual void fill_random(const Tensor& dst, const RngState& state, bool normal) const = 0;

  // ---- normalisation over the last dim (src/ops/nn_norm.cpp) ----
  // x [..., C]; weight, bias [C] or undefined. out like x; mean, rstd [...] in the dtype the backend
  // keeps statistics in (stats_dtype). Backward: dx like x, dw/db [C] (undefined: not wanted).
  virtual DType norm_stats_dtype(DType x) const = 0;
  virtual void layer_norm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                                  const Tensor& weight, const Tensor& bias, double eps) const = 0;
  virtual void layer_norm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dout,
                                   const Tensor& x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& rstd) const = 0;
  virtual void rms_norm_forward(const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                                double eps) const = 0;
  virtual void rms_norm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dout, const Tensor& x,
                                 const Tensor& weight, const Tensor& rstd) const = 0;

  // ---- elementwise, reductions, selection (src/ops/binary.cpp, unary.cpp, reduce.cpp, select.cpp) ----

  // ---- matmul, attention, softmax, losses, embedding, dropout, conv, pool (src/ops/linalg.cpp, nn_*.cpp) ----

  // ---- optimizer steps and gradient utilities (src/optim/, src/train/grad_clip.cpp, src/amp/) ----
  // Fused optimizer steps on one parameter, in place (src/optim/: the optimizer allocates the state and
  // keeps the step count). param f32, contiguous; its state tensors f32, param's shape, contiguous, on
  // param's device, zeros before the first step (SGD's momentum buffer is written, not read, at step 1).
  // grad: param's shape, finite (the optimizer checked it), any float dtype and layout: the backend makes
  // the f32 contiguous copy its kernel reads. step: 1-based, counting this step. The update rules are
  // those of optim::AdamW, SGD, Lion (memtrain/optim/*.h).
  virtual void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                          double lr, double beta1, double beta2, double eps, double weight_decay,
                          std::int64_t step) const = 0;
  // momentum_buffer: undefined for plain SGD (momentum == 0).
  virtual void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, double lr,
                        double momentum, double weight_decay, bool nesterov, std::int64_t step) const = 0;
  virtual void lion_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, double lr, double beta1,
                         double beta2, double weight_decay) const = 0;
  // True when no element of g (any float dtype, any layout) is NaN or Inf, as read in f32: the optimizers'
  // gate. On meta always true (it reads as zeros).
  virtual bool all_finite(const Tensor& g) const = 0;
  // The sum over `tensors` (defined, all on this device, any float dtype and layout) of their squared
  // elements, in double: the gradient norm's reduction. On meta 0.
  virtual double sum_of_squares(const std::vector<Tensor>& tensors) const = 0;
};

// The backend of a device kind; throws naming the device and why when none can serve it (a build
// without CUDA, no usable GPU).
const Backend& backend_for(Device device);

}  // namespace memtrain::detail

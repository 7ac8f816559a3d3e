// The CUDA backend object: the contract of src/core/backend.h over the raw launchers of src/cuda/ and
// kernels/. Entries are defined beside their family's host code (cuda_tensor_backend.cpp: memory, the
// tensor core, normalisation). Each entry checks what its kernels cannot take (dtype set, one dtype for
// every operand, contiguity), naming the op, then launches on the device's current stream.
#pragma once

#include "core/backend.h"

#include <initializer_list>
#include <utility>

namespace memtrain::cuda {

class CudaBackend final : public ::memtrain::detail::Backend {
 public:
  std::unique_ptr<MemorySource> make_memory_source(int index) const override;
  void fill(const Tensor& dst, double value) const override;
  void copy(const Tensor& dst, const Tensor& src) const override;
  void transfer(const Tensor& dst, const Tensor& src) const override;
  double read_scalar(const Tensor& t) const override;
  void fill_random(const Tensor& dst, const RngState& state, bool normal) const override;

  DType norm_stats_dtype(DType x) const override;
  void layer_norm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                          const Tensor& weight, const Tensor& bias, double eps) const override;
  void layer_norm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dout, const Tensor& x,
                           const Tensor& weight, const Tensor& mean, const Tensor& rstd) const override;
  void rms_norm_forward(const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                        double eps) const override;
  void rms_norm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dout, const Tensor& x,
                         const Tensor& weight, const Tensor& rstd) const override;

  // ---- elementwise, reductions, selection (src/ops/binary.cpp, unary.cpp, reduce.cpp, select.cpp) ----

  // ---- matmul, attention, softmax, losses, embedding, dropout, conv, pool (src/ops/linalg.cpp, nn_*.cpp) ----

  // ---- optimizer steps and gradient utilities (src/optim/, src/train/grad_clip.cpp, src/amp/) ----
  void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq, double lr,
                  double beta1, double beta2, double eps, double weight_decay, std::int64_t step) const override;
  void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, double lr, double momentum,
                double weight_decay, bool nesterov, std::int64_t step) const override;
  void lion_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, double lr, double beta1, double beta2,
                 double weight_decay) const override;
  bool all_finite(const Tensor& g) const override;
  double sum_of_squares(const std::vector<Tensor>& tensors) const override;
};

// ---- helpers of the entries ----

inline const void* ptr_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
inline void* out_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// The nn kernels' contract: x f32, bf16 or f16, contiguous; every other defined operand in x's dtype and
// contiguous. Throws naming the op and the operand.
void check_nn_operands(const char* op, const Tensor& x,
                       std::initializer_list<std::pair<const char*, const Tensor*>> others);

}  // namespace memtrain::cuda

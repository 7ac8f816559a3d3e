// The CUDA backend object: the contract of src/core/backend.h over the raw launchers of src/cuda/ and
// kernels/. Entries are defined beside their family's host code: cuda_tensor_backend.cpp (memory, the
// tensor core, normalisation), cuda_elementwise.cpp (elementwise, selection), cuda_reduce.cpp. Each entry checks what its kernels cannot take (dtype set, one dtype for
// every operand, contiguity), naming the op, then launches on the device's current stream.
#pragma once

#include "core/backend.h"

#include <initializer_list>
#include <utility>

namespace memtrain::cuda {

class CudaBackend final : public ::memtrain::detail::Backend {
 public:
  int device_count() const override;
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
  void unary(const Tensor& out, const Tensor& a, UnaryOp op, double p0, double p1) const override;
  void binary(const Tensor& out, const Tensor& a, const Tensor& b, BinaryOp op, double p0,
              double p1) const override;
  void sum(const Tensor& out, const Tensor& a) const override;
  void max(const Tensor& values, const Tensor& indices, const Tensor& a, std::int64_t dim) const override;
  void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) const override;
  void compare_scalar(const Tensor& out, const Tensor& a, CompareOp op, double s) const override;
  void eq(const Tensor& out, const Tensor& a, const Tensor& b) const override;

  // ---- matmul, attention, softmax, losses, embedding, dropout, conv, pool (src/ops/linalg.cpp, nn_*.cpp) ----
  void matmul(const Tensor& out, const Tensor& a, const Tensor& b) const override;
  void linear_forward(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias) const override;
  void embedding_forward(const Tensor& out, const Tensor& weight, const Tensor& indices) const override;
  void embedding_backward(const Tensor& dweight, const Tensor& dout, const Tensor& indices) const override;
  void softmax_forward(const Tensor& out, const Tensor& x, std::int64_t dim, bool log) const override;
  void softmax_backward(const Tensor& dx, const Tensor& dout, const Tensor& out, std::int64_t dim,
                        bool log) const override;
  DType loss_stats_dtype(DType logits) const override;
  std::int64_t cross_entropy_forward(const Tensor& out, const Tensor& lse, const Tensor& logits, const Tensor& targets,
                                     std::int64_t ignore_index, bool mean) const override;
  void cross_entropy_backward(const Tensor& dlogits, const Tensor& dloss, const Tensor& logits, const Tensor& targets,
                              const Tensor& lse, std::int64_t ignore_index, bool per_row,
                              std::int64_t divisor) const override;
  DType attention_stats_dtype(DType q) const override;
  bool attention_fused_grads(const Tensor& q, const Tensor& k, const Tensor& v) const override;
  void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                         bool causal) const override;
  void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                          const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                          bool causal) const override;
  void dropout_forward(const Tensor& out, const Tensor& x, double p, const RngState& state) const override;
  void dropout_backward(const Tensor& dx, const Tensor& dout, double p, const RngState& state) const override;
  void pool2d_forward(const Tensor& out, const Tensor& x, std::int64_t kernel, std::int64_t stride,
                      std::int64_t padding, bool is_max) const override;
  void pool2d_backward(const Tensor& dx, const Tensor& dout, const Tensor& x, std::int64_t kernel, std::int64_t stride,
                       std::int64_t padding, bool is_max) const override;
  void conv2d_forward(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                      std::int64_t stride, std::int64_t padding, std::int64_t groups) const override;
  void conv2d_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dout, const Tensor& x,
                       const Tensor& weight, const Shape& x_shape, const Shape& w_shape, std::int64_t stride,
                       std::int64_t padding, std::int64_t groups) const override;
  // ---- gemm_f32 (src/ops/fused_linear_cross_entropy.cpp) ----
  void gemm_f32(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha,
                double beta) const override;

  // ---- fp8 scaling, batch norm (task B) ----
  float amax(const Tensor& x) const override;
  Fp8Counts quantize_fp8(const Tensor& codes, const Tensor& x, float scale, float* amax_out) const override;
  void dequantize_fp8(const Tensor& out, const Tensor& codes, float inv_scale) const override;
  Fp8Counts quantize_fp8_blockwise(const Tensor& codes, const Tensor& inv_scales, const Tensor& x,
                                   Fp8Tiling tiling) const override;
  void dequantize_fp8_blockwise(const Tensor& out, const Tensor& codes, const Tensor& inv_scales,
                                Fp8Tiling tiling) const override;
  void column_sums(const Tensor& out, const Tensor& g) const override;
  bool unscale_grads(const std::vector<Tensor>& grads, double scale) const override;
  bool has_batch_norm_kernels() const override;
  void batch_norm_forward(const Tensor& y, const Tensor& save_mean, const Tensor& save_invstd,
                          const Tensor& running_mean, const Tensor& running_var, const Tensor& x, const Tensor& weight,
                          const Tensor& bias, bool training, double momentum, double eps) const override;
  void batch_norm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dout, const Tensor& x,
                           const Tensor& weight, const Tensor& save_mean, const Tensor& save_invstd,
                           bool training) const override;

  // ---- optimizer steps and gradient utilities (src/optim/, src/train/grad_clip.cpp, src/amp/) ----
  void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq, double lr,
                  double beta1, double beta2, double eps, double weight_decay, std::int64_t step) const override;
  void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, double lr, double momentum,
                double weight_decay, bool nesterov, std::int64_t step) const override;
  void lion_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, double lr, double beta1, double beta2,
                 double weight_decay) const override;
  bool all_finite(const Tensor& g) const override;
  double sum_of_squares(const std::vector<Tensor>& tensors) const override;

  // ---- optimizer state kinds: 8-bit, factored, low-rank (task A) ----
  bool blockwise_block_size_ok(std::int64_t block_size) const override;
  void adamw8bit_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_absmax,
                      const Tensor& exp_avg_sq, const Tensor& exp_avg_sq_absmax, std::int64_t block_size, double lr,
                      double beta1, double beta2, double eps, double weight_decay, std::int64_t step) const override;
  void lion8bit_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_absmax,
                     std::int64_t block_size, double lr, double beta1, double beta2,
                     double weight_decay) const override;
  void adafactor_step(const Tensor& param, const Tensor& grad, const Tensor& row, const Tensor& col,
                      const Tensor& exp_avg_sq, const Tensor& exp_avg, double lr, double weight_decay, double beta1,
                      double decay_rate, double eps1, double clip_threshold, std::int64_t step) const override;
  void galore_refresh(const Tensor& u, const Tensor& v, const Tensor& G, bool transposed, bool randomized,
                      int power_iterations, int oversample, const Tensor& prev, RngState& rng) const override;
  void galore_project(const Tensor& out, const Tensor& G, const Tensor& left, const Tensor& right,
                      bool accumulate) const override;
  void galore_project_back(const Tensor& W, const Tensor& N, const Tensor& left, const Tensor& right, double scale,
                           bool accumulate, float decay) const override;
};

// ---- helpers of the entries ----

inline const void* ptr_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
inline void* out_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// The nn kernels' contract: x f32, bf16 or f16, contiguous; every other defined operand in x's dtype and
// contiguous. Throws naming the op and the operand.
void check_nn_operands(const char* op, const Tensor& x,
                       std::initializer_list<std::pair<const char*, const Tensor*>> others);

}  // namespace memtrain::cuda

// The meta backend: tensors with shape, dtype and accounted storage but no data. It is the CPU backend
// with every kernel skipped (src/cpu/cpu_backend.h), so each op allocates on meta exactly the bytes it
// allocates on the CPU, and a training step on meta gives the CPU step's memory to the byte without
// computing anything (the planner's dry run).
//
// Data-dependent branches take one documented answer: a meta tensor reads as zeros. item() is 0, a copy
// from meta to the CPU writes zeros, so a loss is 0, a gradient norm is 0 (no clipping), every value is
// finite (no loss-scaler overflow). Random fills draw nothing but still reserve their Philox blocks, so
// the RNG stream after a meta step is the one after the CPU step.
//
// With a work counter installed (core/work_counter.h) the entries that carry a step's arithmetic count it: the
// matmul family's FLOPs by operand precision, and the bytes the optimizer steps stream.
#include "cpu/cpu_backend.h"

#include "core/work_counter.h"

#include <atomic>
#include <cstdint>
#include <cstring>

namespace memtrain::meta {

namespace {

// Hands out distinct, aligned, never-mapped addresses: nothing is reserved, and a read through one
// would fault at once (Tensor::data_ptr() refuses meta tensors before that can happen). 256-byte aligned, as
// cudaMalloc's are: a prediction of a device run carves them into segments (CachePolicy::segments).
class MetaMemorySource final : public MemorySource {
 public:
  void* raw_allocate(std::size_t nbytes) override {
    const std::uintptr_t step = (std::max<std::size_t>(nbytes, 1) + 255) & ~std::uintptr_t{255};
    return reinterpret_cast<void*>(next_.fetch_add(step));
  }
  void raw_free(void*, std::size_t) override {}

 private:
  // Above any user-space mapping on x86-64 and AArch64 (47/48-bit), so never a real address.
  std::atomic<std::uintptr_t> next_{std::uintptr_t{1} << 56};
};

double numel(const Tensor& t) { return t.defined() ? static_cast<double>(t.numel()) : 0.0; }
double bytes(const Tensor& t) { return t.defined() ? static_cast<double>(t.nbytes()) : 0.0; }

// Adds `flops` in the precision of `operand` to the thread's counter, if one is installed.
void count_flops(const Tensor& operand, double flops) {
  detail::WorkCounts* c = detail::current_work_counter();
  if (c == nullptr) return;
  const DType d = operand.dtype();
  (d == DType::bf16 || d == DType::f16 ? c->flops_narrow : c->flops_f32) += flops;
}

// An optimizer step reads the gradient and reads and writes the parameter and each state tensor.
void count_optimizer_step(const Tensor& grad, std::initializer_list<const Tensor*> read_written) {
  detail::WorkCounts* c = detail::current_work_counter();
  if (c == nullptr) return;
  c->optimizer_bytes += bytes(grad);
  for (const Tensor* t : read_written) c->optimizer_bytes += 2.0 * bytes(*t);
}

// Attention over q [B, H, T, D]: QK^T and PV, 2 T^2 D multiply-adds per head, half of them under a causal mask.
double attention_flops(const Tensor& q, bool causal) {
  const double t = static_cast<double>(q.size(-2)), d = static_cast<double>(q.size(-1));
  return 4.0 * numel(q) / d * t * d * (causal ? 0.5 : 1.0);
}

class MetaBackend final : public cpu::CpuBackend {
 public:
  bool runs_kernels() const override { return false; }

  // ---- counted work (then the CPU entry, which allocates what the CPU allocates) ----
  void matmul(const Tensor& out, const Tensor& a, const Tensor& b) const override {
    count_flops(a, 2.0 * numel(out) * static_cast<double>(a.size(-1)));
    CpuBackend::matmul(out, a, b);
  }
  void linear_forward(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias) const override {
    count_flops(x, 2.0 * numel(out) * static_cast<double>(weight.size(1)));
    CpuBackend::linear_forward(out, x, weight, bias);
  }
  void gemm_f32(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha,
                double beta) const override {
    count_flops(a, 2.0 * numel(out) * static_cast<double>(a.size(trans_a ? 0 : 1)));
    CpuBackend::gemm_f32(out, a, b, trans_a, trans_b, alpha, beta);
  }
  void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                         bool causal) const override {
    count_flops(q, attention_flops(q, causal));
    CpuBackend::attention_forward(out, lse, q, k, v, causal);
  }
  // The backward recomputes the scores and makes dQ, dK, dV: 2.5 times the forward's products.
  void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                          const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                          bool causal) const override {
    count_flops(q, 2.5 * attention_flops(q, causal));
    CpuBackend::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, causal);
  }
  void conv2d_forward(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                      std::int64_t stride, std::int64_t padding, std::int64_t groups) const override {
    count_flops(x, 2.0 * numel(out) * numel(weight) / static_cast<double>(weight.size(0)));
    CpuBackend::conv2d_forward(out, x, weight, bias, stride, padding, groups);
  }
  void conv2d_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dout, const Tensor& x,
                       const Tensor& weight, const Shape& x_shape, const Shape& w_shape, std::int64_t stride,
                       std::int64_t padding, std::int64_t groups) const override {
    // dx and dw each cost what the forward did.
    double w_numel = 1.0;
    for (const std::int64_t d : w_shape) w_numel *= static_cast<double>(d);
    const double forward = 2.0 * numel(dout) * w_numel / static_cast<double>(w_shape[0]);
    count_flops(dout, forward * ((dx.defined() ? 1.0 : 0.0) + (dw.defined() ? 1.0 : 0.0)));
    CpuBackend::conv2d_backward(dx, dw, db, dout, x, weight, x_shape, w_shape, stride, padding, groups);
  }
  void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq, double lr,
                  double beta1, double beta2, double eps, double weight_decay, std::int64_t step) const override {
    count_optimizer_step(grad, {&param, &exp_avg, &exp_avg_sq});
    CpuBackend::adamw_step(param, grad, exp_avg, exp_avg_sq, lr, beta1, beta2, eps, weight_decay, step);
  }
  void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, double lr, double momentum,
                double weight_decay, bool nesterov, std::int64_t step) const override {
    count_optimizer_step(grad, {&param, &momentum_buffer});
    CpuBackend::sgd_step(param, grad, momentum_buffer, lr, momentum, weight_decay, nesterov, step);
  }
  void lion_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, double lr, double beta1, double beta2,
                 double weight_decay) const override {
    count_optimizer_step(grad, {&param, &exp_avg});
    CpuBackend::lion_step(param, grad, exp_avg, lr, beta1, beta2, weight_decay);
  }
  void adamw8bit_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_absmax,
                      const Tensor& exp_avg_sq, const Tensor& exp_avg_sq_absmax, std::int64_t block_size, double lr,
                      double beta1, double beta2, double eps, double weight_decay, std::int64_t step) const override {
    count_optimizer_step(grad, {&param, &exp_avg, &exp_avg_absmax, &exp_avg_sq, &exp_avg_sq_absmax});
    CpuBackend::adamw8bit_step(param, grad, exp_avg, exp_avg_absmax, exp_avg_sq, exp_avg_sq_absmax, block_size, lr,
                               beta1, beta2, eps, weight_decay, step);
  }
  void lion8bit_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_absmax,
                     std::int64_t block_size, double lr, double beta1, double beta2,
                     double weight_decay) const override {
    count_optimizer_step(grad, {&param, &exp_avg, &exp_avg_absmax});
    CpuBackend::lion8bit_step(param, grad, exp_avg, exp_avg_absmax, block_size, lr, beta1, beta2, weight_decay);
  }
  void adafactor_step(const Tensor& param, const Tensor& grad, const Tensor& row, const Tensor& col,
                      const Tensor& exp_avg_sq, const Tensor& exp_avg, double lr, double weight_decay, double beta1,
                      double decay_rate, double eps1, double clip_threshold, std::int64_t step) const override {
    count_optimizer_step(grad, {&param, &row, &col, &exp_avg_sq, &exp_avg});
    CpuBackend::adafactor_step(param, grad, row, col, exp_avg_sq, exp_avg, lr, weight_decay, beta1, decay_rate, eps1,
                               clip_threshold, step);
  }
  void adafactor_step_bf16(const Tensor& param, const Tensor& grad, const Tensor& row, const Tensor& col,
                           const Tensor& exp_avg_sq, const Tensor& exp_avg, double lr, double weight_decay,
                           double beta1, double decay_rate, double eps1, double clip_threshold, std::int64_t step,
                           const Tensor& compensation, std::uint64_t seed, std::uint64_t stream,
                           std::int64_t slice_elements) const override {
    count_optimizer_step(grad, {&param, &row, &col, &exp_avg_sq, &exp_avg, &compensation});
    CpuBackend::adafactor_step_bf16(param, grad, row, col, exp_avg_sq, exp_avg, lr, weight_decay, beta1, decay_rate,
                                    eps1, clip_threshold, step, compensation, seed, stream, slice_elements);
  }

  std::unique_ptr<MemorySource> make_memory_source(int) const override {
    return std::make_unique<MetaMemorySource>();
  }
  // Meta <-> CPU: nothing moves; a CPU destination reads zeros (the meta answer for data).
  void transfer(const Tensor& dst, const Tensor&) const override {
    if (dst.device().is_cpu()) std::memset(dst.data_ptr(), 0, dst.nbytes());
  }
  double read_scalar(const Tensor&) const override { return 0.0; }
  Device host_side() const override { return Device::meta(); }
};

}  // namespace

}  // namespace memtrain::meta

namespace memtrain::detail {

const Backend& meta_backend() {
  static const meta::MetaBackend backend;
  return backend;
}

}  // namespace memtrain::detail

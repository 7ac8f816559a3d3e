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
#include "memtrain/core/elementwise_ops.h"
#include "memtrain/core/fp8_tiling.h"
#include "memtrain/core/rng.h"
#include "memtrain/core/tensor.h"

#include <memory>
#include <string>

namespace memtrain::detail {

class Backend {
 public:
  virtual ~Backend() = default;

  // ---- memory and tensor core ----
  // Devices of this kind on this machine (indices 0..n-1); the CPU and meta have one.
  virtual int device_count() const { return 1; }
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
  // Where small host-side values that go with this device's tensors live (fp8_linear's delayed scale): the CPU,
  // except on meta, whose host side is meta itself so a meta run accounts those bytes where the CPU run does.
  virtual Device host_side() const { return Device::cpu(); }
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
  // The elementwise maps, named since a lambda cannot run on every device. out = f(x; p0, p1); p0/p1
  // are rounded to the compute type first (x + p0, not x + (double)p0).
  using UnaryOp = ::memtrain::elementwise::UnaryOp;
  // out = f(a, b; p0, p1). The *_backward rules are dx = f(a = dy, b = saved), with b the forward's input
  // x (abs, pow [p0 = exponent], clamp [p0, p1 = bounds], gelu_erf, gelu_tanh, silu) or its output y
  // (tanh, sigmoid, relu, sqrt, rsqrt), as in src/ops/unary.cpp.
  using BinaryOp = ::memtrain::elementwise::BinaryOp;
  // out = op(a) elementwise; a floating, any strides; out of a's shape and dtype, on a's device. out may be
  // a itself (in place) when a is contiguous.
  virtual void unary(const Tensor& out, const Tensor& a, UnaryOp op, double p0, double p1) const = 0;
  // out = op(a, b) with a and b broadcast to out's shape; a, b, out one floating dtype on one device. out
  // may be a itself (in place); b must not overlap out.
  virtual void binary(const Tensor& out, const Tensor& a, const Tensor& b, BinaryOp op, double p0,
                      double p1) const = 0;
  // out = the sum of a over the dims where out has size 1; out has a's rank and dtype (keepdim). f32 and
  // narrower inputs accumulate in f64 on the CPU.
  virtual void sum(const Tensor& out, const Tensor& a) const = 0;
  // The first maximum of a along dim (a's size there > 0; NaN counts as the largest): values in a's dtype
  // (undefined: not wanted, argmax) and indices i64, both shaped like a with dim set to 1.
  virtual void max(const Tensor& values, const Tensor& indices, const Tensor& a, std::int64_t dim) const = 0;
  // out = cond ? a : b, element bits copied (any dtype), with cond (bool) and a, b broadcast to out's shape;
  // a, b and out share one dtype.
  virtual void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) const = 0;
  enum class CompareOp { gt, lt };
  // out (bool, a's shape) = a > s or a < s; a numeric, not bool: floats in their compute type, integers
  // widened to double.
  virtual void compare_scalar(const Tensor& out, const Tensor& a, CompareOp op, double s) const = 0;
  // out (bool) = a == b broadcast to out's shape; a and b one dtype: floats in their compute type,
  // integers as themselves, bools by truth.
  virtual void eq(const Tensor& out, const Tensor& a, const Tensor& b) const = 0;

  // ---- matmul, attention, softmax, losses, embedding, dropout, conv, pool (src/ops/linalg.cpp, nn_*.cpp) ----
  // out [batch..., m, n] = a [batch..., m, k] x b [batch..., k, n] or b [k, n] (shared by the batch); one dtype
  // for a, b and out; a and b in any strides. Narrow dtypes accumulate in f32 and round once.
  virtual void matmul(const Tensor& out, const Tensor& a, const Tensor& b) const = 0;
  // out [N, out] = x [N, in] weight[out, in]^T + bias [out]; one dtype for all four; the bias is added to the
  // product before it is rounded where the backend can (CPU: in the f32 accumulator).
  virtual void linear_forward(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias) const = 0;
  // out [..., C] (weight's dtype) = rows of weight [V, C] gathered by indices [...] (i32 or i64); dweight [V, C]
  // = dout rows scattered by index (summed). Indices are range-checked where their data is (not on meta).
  virtual void embedding_forward(const Tensor& out, const Tensor& weight, const Tensor& indices) const = 0;
  virtual void embedding_backward(const Tensor& dweight, const Tensor& dout, const Tensor& indices) const = 0;
  // softmax (log: log_softmax) of x over `dim`; out like x (contiguous). Backward: dx like out from the output
  // gradient and the forward output.
  virtual void softmax_forward(const Tensor& out, const Tensor& x, std::int64_t dim, bool log) const = 0;
  virtual void softmax_backward(const Tensor& dx, const Tensor& dout, const Tensor& out, std::int64_t dim,
                                bool log) const = 0;
  // Fused log-softmax + NLL over logits [N, V] with targets [N] (i32 or i64; ignore_index rows count 0). lse [N]
  // in loss_stats_dtype. out [N] (logits' dtype): the per-row losses; out []: their sum in double, divided by
  // the count of non-ignored targets when `mean` (NaN when that is 0). Returns that count (meta: the targets
  // read as zeros). Targets are range-checked where their data is. Backward: dlogits like logits from dloss
  // ([N] when per_row, else [] divided by `divisor`).
  virtual DType loss_stats_dtype(DType logits) const = 0;
  virtual std::int64_t cross_entropy_forward(const Tensor& out, const Tensor& lse, const Tensor& logits,
                                             const Tensor& targets, std::int64_t ignore_index, bool mean) const = 0;
  virtual void cross_entropy_backward(const Tensor& dlogits, const Tensor& dloss, const Tensor& logits,
                                      const Tensor& targets, const Tensor& lse, std::int64_t ignore_index,
                                      bool per_row, std::int64_t divisor) const = 0;
  // Flash attention over q, k, v [B, H, T, D] (one dtype; any strides the backend reads, checked there), scale
  // 1/sqrt(D). out [B, H, T, D] (any strides, e.g. a [B, T, H, D] buffer's transpose); lse [B, H, T] in
  // attention_stats_dtype. Backward: dq, dk, dv like q; attention_fused_grads says whether the backend wants
  // them as the [B, H, T, D] slices of one [B, T, 3, H, D] buffer (else three contiguous tensors).
  virtual DType attention_stats_dtype(DType q) const = 0;
  virtual bool attention_fused_grads(const Tensor& q, const Tensor& k, const Tensor& v) const = 0;
  virtual void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                                 const Tensor& v, bool causal) const = 0;
  virtual void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                                  const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& lse, bool causal) const = 0;
  // Dropout with the mask of cpu/dropout.h drawn from the Philox blocks the caller reserved at `state`
  // (cpu::dropout_rng_blocks(numel)): out like x. Backward: dx like dout, the same mask and scale.
  virtual void dropout_forward(const Tensor& out, const Tensor& x, double p, const RngState& state) const = 0;
  virtual void dropout_backward(const Tensor& dx, const Tensor& dout, double p, const RngState& state) const = 0;
  // Max (is_max) or average pooling over the last two dims of x [..., H, W] with square windows: out
  // [..., OH, OW] in x's dtype. Backward: dx like x from dout like out (x: the forward input for max,
  // undefined for avg).
  virtual void pool2d_forward(const Tensor& out, const Tensor& x, std::int64_t kernel, std::int64_t stride,
                              std::int64_t padding, bool is_max) const = 0;
  virtual void pool2d_backward(const Tensor& dx, const Tensor& dout, const Tensor& x, std::int64_t kernel,
                               std::int64_t stride, std::int64_t padding, bool is_max) const = 0;
  // conv2d (NCHW): out [B, Cout, OH, OW] = conv(x [B, Cin, H, W], weight [Cout, Cin/groups, KH, KW]) + bias
  // [Cout] (undefined: none). Backward: dx, dw, db (undefined: not wanted) from dout; x is defined when dw is
  // wanted, weight when dx is; x_shape / w_shape give the geometry whatever is saved.
  virtual void conv2d_forward(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                              std::int64_t stride, std::int64_t padding, std::int64_t groups) const = 0;
  virtual void conv2d_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dout,
                               const Tensor& x, const Tensor& weight, const Shape& x_shape, const Shape& w_shape,
                               std::int64_t stride, std::int64_t padding, std::int64_t groups) const = 0;
  // ---- gemm_f32 (src/ops/fused_linear_cross_entropy.cpp, fp8_linear's emulated product in src/amp/) ----
  // out [m, n] = alpha op(a) op(b) + beta out, op(t) = t^T when trans_*: a [m, k] ([k, m] when trans_a), b [k, n]
  // ([n, k] when trans_b); 2-D f32 tensors on this device, out allocated by the caller, row-major (unit column
  // stride); a and b in any strides (transposed views read in place). beta == 0: out is not read; beta == 1
  // accumulates (dW summed over chunks). f32 products and sums (CUDA: cuBLAS in full f32, never TF32).
  virtual void gemm_f32(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                        double alpha, double beta) const = 0;

  // ---- fp8 scaling, batch norm (task B) ----
  // FP8 (the element rules of memtrain/amp/fp8.h; src/amp/fp8_quantize.cpp checks the operands). x: contiguous
  // f32 or bf16 with >= 1 dim; codes: contiguous f8_e4m3 or f8_e5m2 of x's shape; out: contiguous f32 or bf16 of
  // the codes' shape; all allocated by the caller on x's device. Blockwise views x as (rows, cols = last dim)
  // and inv_scales is the contiguous f32 (fp8_scale_rows(rows, tiling), fp8_scale_cols(cols)) grid.
  // What a quantize pass counted (amp::QuantStats): the CPU counts (counted = true); CUDA and meta count
  // nothing and leave counted false, so a caller that asked for counts is refused instead of reading zeros.
  struct Fp8Counts {
    std::int64_t saturated = 0, underflowed = 0, nonfinite = 0;
    bool counted = false;
  };
  // max |x| (0 when empty, NaN when any element is NaN), read back to the host. Meta: 0.
  virtual float amax(const Tensor& x) const = 0;
  // codes = fp8(x * scale) (scale finite, > 0). amax_out: null, or where max |x| goes (as amax()); on CUDA it
  // comes from the same pass.
  virtual Fp8Counts quantize_fp8(const Tensor& codes, const Tensor& x, float scale, float* amax_out) const = 0;
  // out = fp8_value(codes) * inv_scale (finite, > 0).
  virtual void dequantize_fp8(const Tensor& out, const Tensor& codes, float inv_scale) const = 0;
  virtual Fp8Counts quantize_fp8_blockwise(const Tensor& codes, const Tensor& inv_scales, const Tensor& x,
                                           Fp8Tiling tiling) const = 0;
  virtual void dequantize_fp8_blockwise(const Tensor& out, const Tensor& codes, const Tensor& inv_scales,
                                        Fp8Tiling tiling) const = 0;
  // out [cols] (f32 or bf16, allocated by the caller) = the column sums of g [rows, cols] (contiguous f32 or
  // bf16), accumulated in f64 (CPU: row order, one rounding; CUDA: a fixed order, rounded to f32 and then to
  // out's dtype): fp8_linear's bias gradient. Its accumulator is workspace on g's device.
  virtual void column_sums(const Tensor& out, const Tensor& g) const = 0;
  // The loss scaler's unscale: every tensor of grads (defined, on this device, f64/f32/f16/bf16, any layout) is
  // divided by scale in place (rounded once to its dtype; CUDA multiplies by 1 / scale, equal whenever scale is a
  // power of two). Returns true when any result is NaN or Inf. Meta: false, the documented "no overflow" branch.
  virtual bool unscale_grads(const std::vector<Tensor>& grads, double scale) const = 0;
  // batch_norm over NCHW (ops::batch_norm holds the rule, nn::BatchNorm2d's). Where a backend has no fused
  // kernels (CPU, meta) ops::batch_norm composes differentiable ops instead: that composition is the reference,
  // and its backward is autograd's, which no backend entry can record. The fused entries: x [B, C, H, W]
  // contiguous; weight, bias [C] (undefined: none); running_mean, running_var [C] (undefined: neither read nor
  // written); all one dtype. y like x; save_mean, save_invstd [C] f32: the statistics y was normalised with.
  // training: the batch's statistics, and the running ones (when given) updated with momentum, the variance
  // unbiased; else the running ones. Backward: dx like x, dw, db [C] in x's dtype (undefined: not wanted) from
  // dout (contiguous, like x).
  virtual bool has_batch_norm_kernels() const = 0;
  virtual void batch_norm_forward(const Tensor& y, const Tensor& save_mean, const Tensor& save_invstd,
                                  const Tensor& running_mean, const Tensor& running_var, const Tensor& x,
                                  const Tensor& weight, const Tensor& bias, bool training, double momentum,
                                  double eps) const = 0;
  virtual void batch_norm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dout,
                                   const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                                   const Tensor& save_invstd, bool training) const = 0;

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

  // ---- optimizer state kinds: 8-bit, factored, low-rank (task A) ----
  // The steps of optim::AdamW8bit, Lion8bit, Adafactor and the linear algebra of GaLoreProjector, in place;
  // the optimizer allocates the state, keeps the step count and checks shapes and dtypes first. param f32,
  // contiguous; grad as for adamw_step (the backend makes the f32 contiguous copy its kernel reads).
  //
  // Block-wise 8-bit moments (optim/quantized_state.h): codes u8 [n] + absmax f32 [ceil(n / block_size)],
  // n = param.numel(), contiguous on param's device, a fresh state as QuantizedState makes it; the first
  // moment uses the signed dynamic map, the second the unsigned one. A moment given as an f32 tensor of
  // param's shape with its absmax undefined is full-precision state (the optimizers keep small tensors so);
  // the step then follows the same rule on f32 state. Meta allocates the gradient copy and skips the kernel.
  // Whether the 8-bit kernels take this block size (CPU: any positive size; CUDA: a power of two in
  // [32, 4096]).
  virtual bool blockwise_block_size_ok(std::int64_t block_size) const = 0;
  virtual void adamw8bit_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                              const Tensor& exp_avg_absmax, const Tensor& exp_avg_sq,
                              const Tensor& exp_avg_sq_absmax, std::int64_t block_size, double lr, double beta1,
                              double beta2, double eps, double weight_decay, std::int64_t step) const = 0;
  virtual void lion8bit_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                             const Tensor& exp_avg_absmax, std::int64_t block_size, double lr, double beta1,
                             double beta2, double weight_decay) const = 0;
  // Adafactor (optim::Adafactor). Factored when param has rank >= 2, [..., rows, cols]: row [..., rows] and
  // col [..., cols] f32 (exp_avg_sq undefined); else unfactored: exp_avg_sq f32 of param's shape (row, col
  // undefined). exp_avg f32 of param's shape, or undefined (no first moment). The update is built in a
  // workspace the backend allocates on param's device (CPU: param's size in f32; CUDA: its kernels'
  // scratch), in the caller's category. step: 1-based. Meta allocates the same and skips the kernels.
  virtual void adafactor_step(const Tensor& param, const Tensor& grad, const Tensor& row, const Tensor& col,
                              const Tensor& exp_avg_sq, const Tensor& exp_avg, double lr, double weight_decay,
                              double beta1, double decay_rate, double eps1, double clip_threshold,
                              std::int64_t step) const = 0;
  // GaLore's basis refresh: u (rows_a, r) and v (cols_a, r), row-major f32 allocated by the caller, get the
  // top-r left and right singular vectors of A = G (m x n), or A = G^T when `transposed`; G [m, n] f32
  // contiguous; v undefined: not wanted. Exact SVD, or (randomized) the range finder of
  // memtrain/optim/galore_projector.h with k = min(r + oversample, m, n) columns and power_iterations,
  // warm-started from prev (rows_a, r) when it is defined. rng: the projector's own Philox stream, advanced
  // past the Gaussian draws, which every backend makes on the host in the same order. Meta: u and v read as
  // zeros (there is no data to decompose; the documented answer), rng advances as on the CPU.
  virtual void galore_refresh(const Tensor& u, const Tensor& v, const Tensor& G, bool transposed,
                              bool randomized, int power_iterations, int oversample, const Tensor& prev,
                              RngState& rng) const = 0;
  // out = P^T G (r, n) | G Q (m, r) | P^T G Q (r, r) as left = P (m, r), right = Q (n, r) or both are
  // defined; accumulate: out += instead. G [m, n], out contiguous f32.
  virtual void galore_project(const Tensor& out, const Tensor& G, const Tensor& left, const Tensor& right,
                              bool accumulate) const = 0;
  // W [m, n] = scale * (P N | N Q^T | P N Q^T), N of the projected shape; with accumulate W = W * decay +
  // that (W read). Contiguous f32. The CPU builds the product in an (m, n) workspace first; CUDA does not.
  virtual void galore_project_back(const Tensor& W, const Tensor& N, const Tensor& left, const Tensor& right,
                                   double scale, bool accumulate, float decay) const = 0;
};

// ---- helpers of the backends' entries ----

// t without autograd history, contiguous (no copy when it already is); an undefined t stays undefined.
inline Tensor dense(const Tensor& t) {
  if (!t.defined()) return t;
  const Tensor d = t.detach();
  return d.is_contiguous() ? d : d.contiguous();
}

// Scratch of `elems` elements on `device`, counted as workspace; freed when the returned tensor dies.
inline Tensor workspace_on(Device device, std::int64_t elems, DType dtype) {
  CategoryGuard guard(MemoryCategory::workspace);
  return Tensor::empty({elems}, dtype, device);
}

// The backend of a device; throws naming the device and why when none can serve it (a build without CUDA,
// no usable GPU, an index past the machine's devices).
const Backend& backend_for(Device device);

}  // namespace memtrain::detail

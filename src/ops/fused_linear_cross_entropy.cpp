// fused_linear_cross_entropy: linear + cross-entropy walked in chunks of rows, so the [N, V] logits are
// never alive at once. Forward, per chunk: logits = x_chunk W^T (+ b) into one workspace buffer
// (chunk_rows x V), then per-row loss and log-sum-exp with the CPU cross-entropy kernel; only lse ([N]) is
// kept. Backward, per chunk: recompute the logits into the buffer, turn them in place into
// dlogits = dloss * (softmax - onehot) with the same kernel cross_entropy's backward uses, then
// dx_chunk = dlogits W, dW += dlogits^T x_chunk, db += column sums of dlogits (in double).
// Reductions, ignore_index and the mean's count follow ops::cross_entropy exactly.
// bf16/f16 rows of x (mixed precision) are widened to f32 a chunk at a time and dx is rounded back to x's
// dtype, so the saved x stays narrow while the head and the loss are computed in f32.
// On a CUDA device the same walk runs with cuda::gemm (f32) and the CUDA cross-entropy kernels (x f32, bf16 or f16):
// the per-row losses stay on the device and only the [N] targets (checked and counted on the host, as
// ops::cross_entropy does) and the [N] losses (summed in double) cross to the host. The bias rides on two
// rank-1 GEMMs (ones x bias into the logits, ones^T x dlogits into db), so no extra kernel is needed; db is
// accumulated in f32 there (double on the CPU).
#include "memtrain/ops/fused_loss.h"

#include "cpu/convert.h"
#include "cpu/cross_entropy.h"
#include "cpu/gemm.h"
#include "memtrain/cuda/convert.h"
#include "memtrain/cuda/cuda.h"
#include "memtrain/cuda/nn.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "ops/nn_common.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace memtrain::ops {

using autograd::SavedTensor;

namespace {

constexpr const char* kOp = "fused_linear_cross_entropy";

// t without history, contiguous (no copy when it already is).
Tensor dense(const Tensor& t) {
  const Tensor d = t.detach();
  return d.is_contiguous() ? d : d.contiguous();
}

void check_f32_cpu(const char* what, const Tensor& t) {
  MT_CHECK(t.dtype() == DType::f32 && t.device().is_cpu(), kOp,
           "{} must be an f32 tensor on the CPU (only f32 CPU is supported), got {} {} on {}", what,
           dtype_name(t.dtype()), shape_str(t.shape()), t.device().str());
}

void check_rows_cpu(const Tensor& x) {
  const DType t = x.dtype();
  MT_CHECK((t == DType::f32 || t == DType::bf16 || t == DType::f16) && x.device().is_cpu(), kOp,
           "x must be an f32, bf16 or f16 tensor on the CPU, got {} {} on {}", dtype_name(t), shape_str(x.shape()),
           x.device().str());
}

// Rows [n0, n0 + r) of the contiguous (N, C) matrix x as f32: in place for f32, else widened into `wide`
// (at least r x C floats).
const float* rows_f32(const Tensor& x, std::int64_t n0, std::int64_t r, const Tensor& wide) {
  const std::int64_t C = x.size(1);
  if (x.dtype() == DType::f32) return x.data<float>() + n0 * C;
  const auto* src = static_cast<const unsigned char*>(x.data_ptr()) + n0 * C * static_cast<std::int64_t>(x.element_size());
  cpu::convert(src, x.dtype(), wide.data_ptr(), DType::f32, static_cast<std::size_t>(r * C));
  return wide.data<float>();
}

// A (chunk, C) f32 scratch for widening narrow rows; undefined when x is f32 already.
Tensor widening_buffer(const Tensor& x, std::int64_t chunk) {
  return x.dtype() == DType::f32 ? Tensor() : detail::workspace(chunk * x.size(1), DType::f32);
}

// logits (r, V) = x (r, C) W^T (+ b): the bias is written into the rows and the GEMM adds onto it, as
// ops::linear does on the CPU.
void chunk_logits(float* logits, const float* x, const float* w, const float* b, std::int64_t r, std::int64_t V,
                  std::int64_t C) {
  if (b != nullptr) {
    for (std::int64_t i = 0; i < r; ++i) std::copy(b, b + V, logits + i * V);
  }
  cpu::gemm_f32(false, true, r, V, C, 1.0f, x, C, w, C, b != nullptr ? 1.0f : 0.0f, logits, V);
}

struct Saved {
  SavedTensor x, weight, bias, targets, lse;
};

// Gradients of x, weight and (when defined) bias from the loss gradient g (scalar for mean/sum, [N] for
// none). Undefined where not wanted.
std::vector<Tensor> fused_backward(const Tensor& g, const Saved& s, Reduction reduction, std::int64_t ignore_index,
                                   std::int64_t count, std::int64_t chunk_rows, bool want_dx, bool want_dw,
                                   bool want_db) {
  const Tensor x = dense(s.x.unpack()), w = dense(s.weight.unpack()), t = s.targets.unpack(), lse = s.lse.unpack();
  const Tensor b = s.bias.defined() ? dense(s.bias.unpack()) : Tensor();
  const std::int64_t N = x.size(0), C = x.size(1), V = w.size(0);

  float scale = 0.0f;
  Tensor gc;  // [N] f32 for none
  const float* dloss = &scale;
  std::int64_t dloss_stride = 0;
  if (reduction == Reduction::none) {
    MT_CHECK(g.dim() == 1 && g.size(0) == N, kOp, "loss gradient {} does not match {} rows", shape_str(g.shape()), N);
    gc = detail::compute_input(g);
    MT_CHECK(gc.dtype() == DType::f32, kOp, "loss gradient must be f32, got {}", dtype_name(gc.dtype()));
    dloss = gc.data<float>();
    dloss_stride = 1;
  } else {
    MT_CHECK(g.numel() == 1, kOp, "loss gradient {} is not a scalar", shape_str(g.shape()));
    scale = static_cast<float>(g.item());
    if (reduction == Reduction::mean) scale /= static_cast<float>(count);
  }

  Tensor dx, dw, db;
  if (want_dx) dx = Tensor::empty({N, C}, x.dtype());  // (N, C), every row written below
  if (want_dw) dw = zeros({V, C}, DType::f32);           // (V, C), accumulated over chunks
  Tensor db_acc;                                         // (V) in double
  if (want_db) {
    db_acc = detail::workspace(V, DType::f64);
    db_acc.zero_();
  }
  const std::int64_t chunk = std::min(chunk_rows, N);
  if (chunk > 0 && (want_dx || want_dw || want_db)) {
    Tensor buf = detail::workspace(chunk * V, DType::f32);  // (chunk, V): logits, then dlogits
    float* dl = buf.data<float>();
    const Tensor wide = widening_buffer(x, chunk);
    // dx rows of a narrow x are computed in f32 here and rounded once into dx.
    const Tensor dx_wide = want_dx ? widening_buffer(x, chunk) : Tensor();
    const float* wp = w.data<float>();
    const float* bp = b.defined() ? b.data<float>() : nullptr;
    double* acc = want_db ? db_acc.data<double>() : nullptr;
    detail::dispatch_index(t.dtype(), [&](auto izero) {
      using I = decltype(izero);
      const I* tp = t.data<I>();
      for (std::int64_t n0 = 0; n0 < N; n0 += chunk) {
        const std::int64_t r = std::min(chunk, N - n0);
        const float* xp = rows_f32(x, n0, r, wide);
        chunk_logits(dl, xp, wp, bp, r, V, C);
        // In place: each element of a row is read once before it is overwritten.
        cpu::cross_entropy_backward<float, I>(dl, dloss + n0 * dloss_stride, dloss_stride, dl, lse.data<float>() + n0,
                                              tp + n0, r, V, ignore_index);
        if (want_dx) {
          float* out = dx_wide.defined() ? dx_wide.data<float>() : dx.data<float>() + n0 * C;
          cpu::gemm_f32(false, false, r, C, V, 1.0f, dl, V, wp, C, 0.0f, out, C);
          if (dx_wide.defined()) {
            cpu::convert(out, DType::f32, static_cast<unsigned char*>(dx.data_ptr()) + n0 * C * dx.element_size(),
                         dx.dtype(), static_cast<std::size_t>(r * C));
          }
        }
        if (want_dw) cpu::gemm_f32(true, false, V, C, r, 1.0f, dl, V, xp, C, 1.0f, dw.data<float>(), C);
        if (want_db) {
          for (std::int64_t i = 0; i < r; ++i) {
            const float* row = dl + i * V;
            for (std::int64_t v = 0; v < V; ++v) acc[v] += static_cast<double>(row[v]);
          }
        }
      }
    });
  }
  if (want_db) db = db_acc.to(DType::f32);
  std::vector<Tensor> grads{dx, dw};
  if (s.bias.defined()) grads.push_back(db);
  return grads;
}

// ---- CUDA: the same chunked walk on the device ----

// Scratch on the device: freed when the returned tensor dies, counted as workspace.
Tensor device_workspace(std::int64_t elems, DType dtype, Device device) {
  CategoryGuard guard(MemoryCategory::workspace);
  return Tensor::empty({elems}, dtype, device);
}

// n f32 ones on the device (workspace): the left factor of the bias GEMMs.
Tensor device_ones(std::int64_t n, Device device) {
  Tensor t = device_workspace(n, DType::f32, device);
  t.fill_(1.0);
  return t;
}

// Device pointer to row n0 of a contiguous (N, C) tensor.
const void* row_ptr(const Tensor& t, std::int64_t n0, std::int64_t C) {
  return static_cast<const unsigned char*>(t.data_ptr()) + n0 * C * static_cast<std::int64_t>(t.element_size());
}
void* row_ptr_mut(const Tensor& t, std::int64_t n0, std::int64_t C) {
  return static_cast<unsigned char*>(t.data_ptr()) + n0 * C * static_cast<std::int64_t>(t.element_size());
}

// Rows [n0, n0 + r) of the contiguous (N, C) device matrix x as f32: in place for f32, else cast into `wide`.
const float* rows_f32_cuda(const Tensor& x, std::int64_t n0, std::int64_t r, const Tensor& wide) {
  const std::int64_t C = x.size(1);
  if (x.dtype() == DType::f32) return static_cast<const float*>(row_ptr(x, n0, C));
  cuda::cast(row_ptr(x, n0, C), x.dtype(), wide.data_ptr(), DType::f32, static_cast<std::size_t>(r * C),
             x.device().index);
  return wide.data<float>();
}

// logits (r, V) = x (r, C) W^T (+ ones (r, 1) b (1, V)), all f32 on the device.
void chunk_logits_cuda(float* logits, const float* x, const float* w, const float* b, const float* ones,
                       std::int64_t r, std::int64_t V, std::int64_t C, int device) {
  if (b != nullptr) cuda::gemm(DType::f32, false, false, r, V, 1, 1.0f, ones, 1, b, V, 0.0f, logits, V, device);
  cuda::gemm(DType::f32, false, true, r, V, C, 1.0f, x, C, w, C, b != nullptr ? 1.0f : 0.0f, logits, V, device);
}

// Targets rows [n0, ...) as the kernels' pointer.
const void* target_rows(const Tensor& t, std::int64_t n0) {
  return static_cast<const unsigned char*>(t.data_ptr()) + n0 * static_cast<std::int64_t>(t.element_size());
}

void check_cuda_operands(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& targets) {
  const Device dev = x.device();
  MT_CHECK(detail::is_cuda_kernel_dtype(x.dtype()), kOp,
           "x must be f32, bf16 or f16 on {} (the CUDA kernels' dtypes), got {} {}", dev.str(), dtype_name(x.dtype()),
           shape_str(x.shape()));
  MT_CHECK(weight.dtype() == DType::f32 && weight.device() == dev, kOp,
           "weight must be an f32 tensor on {} (x's device), got {} {} on {}", dev.str(), dtype_name(weight.dtype()),
           shape_str(weight.shape()), weight.device().str());
  MT_CHECK(!bias.defined() || (bias.dtype() == DType::f32 && bias.device() == dev), kOp,
           "bias must be an f32 tensor on {} (x's device), got {} {} on {}", dev.str(),
           bias.defined() ? dtype_name(bias.dtype()) : "undefined", bias.defined() ? shape_str(bias.shape()) : "",
           bias.defined() ? bias.device().str() : "");
  MT_CHECK(targets.device() == dev, kOp, "targets {} must be on {} (x's device), got {}", shape_str(targets.shape()),
           dev.str(), targets.device().str());
}

std::vector<Tensor> fused_backward_cuda(const Tensor& g, const Saved& s, Reduction reduction,
                                        std::int64_t ignore_index, std::int64_t count, std::int64_t chunk_rows,
                                        bool want_dx, bool want_dw, bool want_db) {
  const Tensor x = dense(s.x.unpack()), w = dense(s.weight.unpack()), t = s.targets.unpack(), lse = s.lse.unpack();
  const Tensor b = s.bias.defined() ? dense(s.bias.unpack()) : Tensor();
  const std::int64_t N = x.size(0), C = x.size(1), V = w.size(0);
  const Device dev = x.device();
  const int d = dev.index;

  Tensor dloss;  // f32 on the device: one scale (stride 0) or [N] (stride 1)
  std::int64_t dloss_stride = 0;
  if (reduction == Reduction::none) {
    MT_CHECK(g.dim() == 1 && g.size(0) == N, kOp, "loss gradient {} does not match {} rows", shape_str(g.shape()), N);
    MT_CHECK(g.device() == dev, kOp, "loss gradient is on {} but x is on {}", g.device().str(), dev.str());
    dloss = dense(g.dtype() == DType::f32 ? g : g.detach().to(DType::f32));
    dloss_stride = 1;
  } else {
    MT_CHECK(g.numel() == 1, kOp, "loss gradient {} is not a scalar", shape_str(g.shape()));
    // Formed on the host in f32, as the CPU path does.
    auto scale = static_cast<float>(g.item());
    if (reduction == Reduction::mean) scale /= static_cast<float>(count);
    dloss = full({1}, static_cast<double>(scale), DType::f32, dev);
  }

  Tensor dx, dw, db;
  if (want_dx) dx = Tensor::empty({N, C}, x.dtype(), dev);  // (N, C), every row written below
  if (want_dw) dw = zeros({V, C}, DType::f32, dev);           // (V, C), accumulated over chunks
  if (want_db) db = zeros({V}, DType::f32, dev);              // (V), accumulated over chunks
  const std::int64_t chunk = std::min(chunk_rows, N);
  if (chunk > 0 && (want_dx || want_dw || want_db)) {
    const Tensor buf = device_workspace(chunk * V, DType::f32, dev);  // (chunk, V): logits, then dlogits
    float* dl = buf.data<float>();
    const bool narrow = x.dtype() != DType::f32;
    const Tensor wide = narrow ? device_workspace(chunk * C, DType::f32, dev) : Tensor();
    const Tensor dx_wide = narrow && want_dx ? device_workspace(chunk * C, DType::f32, dev) : Tensor();
    const Tensor ones = b.defined() || want_db ? device_ones(chunk, dev) : Tensor();
    const float* wp = w.data<float>();
    const float* bp = b.defined() ? b.data<float>() : nullptr;
    const float* op = ones.defined() ? ones.data<float>() : nullptr;
    for (std::int64_t n0 = 0; n0 < N; n0 += chunk) {
      const std::int64_t r = std::min(chunk, N - n0);
      const float* xp = rows_f32_cuda(x, n0, r, wide);
      chunk_logits_cuda(dl, xp, wp, bp, op, r, V, C, d);
      // In place: the kernel reads each logit and writes its gradient from the same thread.
      cuda::cross_entropy_backward(dl, dloss.data<float>() + n0 * dloss_stride, dloss_stride, dl,
                                   lse.data<float>() + n0, DType::f32, target_rows(t, n0), t.dtype(), r, V,
                                   ignore_index, d);
      if (want_dx) {
        float* out = narrow ? dx_wide.data<float>() : static_cast<float*>(row_ptr_mut(dx, n0, C));
        cuda::gemm(DType::f32, false, false, r, C, V, 1.0f, dl, V, wp, C, 0.0f, out, C, d);
        if (narrow) cuda::cast(out, DType::f32, row_ptr_mut(dx, n0, C), dx.dtype(), static_cast<std::size_t>(r * C), d);
      }
      // dW (V, C) += dlogits^T (V, r) x (r, C); db (1, V) += ones (1, r) dlogits (r, V).
      if (want_dw) cuda::gemm(DType::f32, true, false, V, C, r, 1.0f, dl, V, xp, C, 1.0f, dw.data<float>(), C, d);
      if (want_db) cuda::gemm(DType::f32, false, false, 1, V, r, 1.0f, op, r, dl, V, 1.0f, db.data<float>(), V, d);
    }
  }
  std::vector<Tensor> grads{dx, dw};
  if (s.bias.defined()) grads.push_back(db);
  return grads;
}

Tensor fused_forward_cuda(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& targets,
                          Reduction reduction, std::int64_t ignore_index, std::int64_t chunk_rows) {
  check_cuda_operands(x, weight, bias, targets);
  const Device dev = x.device();
  const int d = dev.index;
  const std::int64_t N = x.size(0), C = x.size(1), V = weight.size(0);
  const Tensor t = dense(targets);
  const Tensor t_host = t.to(Device::cpu());  // [N] ids: range-checked and counted on the host
  std::int64_t count = 0;
  detail::dispatch_index(t_host.dtype(), [&](auto izero) {
    using I = decltype(izero);
    const I* tp = t_host.data<I>();
    detail::check_index_range(kOp, "target", tp, N, V, true, ignore_index, targets.shape());
    for (std::int64_t i = 0; i < N; ++i) count += static_cast<std::int64_t>(tp[i]) != ignore_index;
  });

  const Tensor xc = dense(x), wc = dense(weight), bc = bias.defined() ? dense(bias) : Tensor();
  const Tensor losses = Tensor::empty({N}, DType::f32, dev), lse = Tensor::empty({N}, DType::f32, dev);  // (N) each
  const std::int64_t chunk = std::min(chunk_rows, N);
  if (chunk > 0) {
    const Tensor buf = device_workspace(chunk * V, DType::f32, dev);  // (chunk, V) logits
    const Tensor wide = xc.dtype() != DType::f32 ? device_workspace(chunk * C, DType::f32, dev) : Tensor();
    const Tensor ones = bc.defined() ? device_ones(chunk, dev) : Tensor();
    for (std::int64_t n0 = 0; n0 < N; n0 += chunk) {
      const std::int64_t r = std::min(chunk, N - n0);
      chunk_logits_cuda(buf.data<float>(), rows_f32_cuda(xc, n0, r, wide), wc.data<float>(),
                        bc.defined() ? bc.data<float>() : nullptr, ones.defined() ? ones.data<float>() : nullptr, r,
                        V, C, d);
      cuda::cross_entropy_forward(losses.data<float>() + n0, lse.data<float>() + n0, buf.data<float>(), DType::f32,
                                  target_rows(t, n0), t.dtype(), r, V, ignore_index, d);
    }
  }

  Tensor out;
  if (reduction == Reduction::none) {
    out = losses;
  } else {
    const Tensor host = losses.to(Device::cpu());
    double total = 0;  // in row order, in double, as cross_entropy sums
    for (std::int64_t i = 0; i < N; ++i) total += static_cast<double>(host.data<float>()[i]);
    const double v = reduction == Reduction::sum ? total
                     : count > 0                 ? total / static_cast<double>(count)
                                                 : std::numeric_limits<double>::quiet_NaN();
    out = full({}, v, DType::f32, dev);
  }

  if (autograd::needs_grad({&x, &weight, &bias})) {
    Saved s{SavedTensor(x), SavedTensor(weight), bias.defined() ? SavedTensor(bias) : SavedTensor(), SavedTensor(t),
            SavedTensor(lse)};
    const bool want_dx = x.requires_grad(), want_dw = weight.requires_grad();
    const bool want_db = bias.defined() && bias.requires_grad();
    std::vector<Tensor> inputs{x, weight};
    if (bias.defined()) inputs.push_back(bias);
    autograd::record(kOp, inputs, {out},
                     [s, reduction, ignore_index, count, chunk_rows, want_dx, want_dw,
                      want_db](const std::vector<Tensor>& g) {
                       return fused_backward_cuda(g[0], s, reduction, ignore_index, count, chunk_rows, want_dx,
                                                  want_dw, want_db);
                     });
  }
  return out;
}

}  // namespace

Tensor fused_linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& targets,
                                  Reduction reduction, std::int64_t ignore_index, std::int64_t chunk_rows) {
  detail::check_defined(kOp, x);
  detail::check_defined(kOp, weight);
  detail::check_index(kOp, "targets", targets);
  const bool on_cuda = x.device().is_cuda();
  if (!on_cuda) {
    check_rows_cpu(x);
    check_f32_cpu("weight", weight);
    if (bias.defined()) check_f32_cpu("bias", bias);
    MT_CHECK(targets.device().is_cpu(), kOp, "targets {} must be on the CPU, got {}", shape_str(targets.shape()),
             targets.device().str());
  }
  MT_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), kOp,
           "expects x [N, C] and weight [V, C], got x {} and weight {}", shape_str(x.shape()),
           shape_str(weight.shape()));
  MT_CHECK(weight.size(0) > 0, kOp, "weight {} has no classes", shape_str(weight.shape()));
  MT_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)), kOp,
           "bias {} does not match weight {} (expects [V])", shape_str(bias.shape()), shape_str(weight.shape()));
  MT_CHECK(targets.dim() == 1 && targets.size(0) == x.size(0), kOp, "expects targets [N] for x {}, got {}",
           shape_str(x.shape()), shape_str(targets.shape()));
  MT_CHECK(chunk_rows > 0, kOp, "chunk_rows must be positive, got {}", chunk_rows);
  if (on_cuda) return fused_forward_cuda(x, weight, bias, targets, reduction, ignore_index, chunk_rows);

  const std::int64_t N = x.size(0), C = x.size(1), V = weight.size(0);
  const Tensor t = dense(targets);
  std::int64_t count = 0;
  detail::dispatch_index(t.dtype(), [&](auto izero) {
    using I = decltype(izero);
    const I* tp = t.data<I>();
    detail::check_index_range(kOp, "target", tp, N, V, true, ignore_index, targets.shape());
    for (std::int64_t i = 0; i < N; ++i) count += static_cast<std::int64_t>(tp[i]) != ignore_index;
  });

  const Tensor xc = dense(x), wc = dense(weight), bc = bias.defined() ? dense(bias) : Tensor();
  Tensor losses = Tensor::empty({N}, DType::f32), lse = Tensor::empty({N}, DType::f32);  // (N) each
  const std::int64_t chunk = std::min(chunk_rows, N);
  if (chunk > 0) {
    Tensor buf = detail::workspace(chunk * V, DType::f32);  // (chunk, V) logits
    float* logits = buf.data<float>();
    const Tensor wide = widening_buffer(xc, chunk);
    detail::dispatch_index(t.dtype(), [&](auto izero) {
      using I = decltype(izero);
      const I* tp = t.data<I>();
      for (std::int64_t n0 = 0; n0 < N; n0 += chunk) {
        const std::int64_t r = std::min(chunk, N - n0);
        chunk_logits(logits, rows_f32(xc, n0, r, wide), wc.data<float>(), bc.defined() ? bc.data<float>() : nullptr, r,
                     V, C);
        cpu::cross_entropy_forward<float, I>(losses.data<float>() + n0, lse.data<float>() + n0, logits, tp + n0, r, V,
                                             ignore_index);
      }
    });
  }

  Tensor out;
  if (reduction == Reduction::none) {
    out = losses;
  } else {
    double total = 0;  // in row order, in double, as cross_entropy sums
    for (std::int64_t i = 0; i < N; ++i) total += static_cast<double>(losses.data<float>()[i]);
    const double v = reduction == Reduction::sum ? total
                     : count > 0                 ? total / static_cast<double>(count)
                                                 : std::numeric_limits<double>::quiet_NaN();
    out = full({}, v, DType::f32);
  }

  if (autograd::needs_grad({&x, &weight, &bias})) {
    Saved s{SavedTensor(x), SavedTensor(weight), bias.defined() ? SavedTensor(bias) : SavedTensor(), SavedTensor(t),
            SavedTensor(lse)};
    const bool want_dx = x.requires_grad(), want_dw = weight.requires_grad();
    const bool want_db = bias.defined() && bias.requires_grad();
    std::vector<Tensor> inputs{x, weight};
    if (bias.defined()) inputs.push_back(bias);
    autograd::record(kOp, inputs, {out},
                     [s, reduction, ignore_index, count, chunk_rows, want_dx, want_dw,
                      want_db](const std::vector<Tensor>& g) {
                       return fused_backward(g[0], s, reduction, ignore_index, count, chunk_rows, want_dx, want_dw,
                                             want_db);
                     });
  }
  return out;
}

}  // namespace memtrain::ops

// The CPU backend's fused linear + cross-entropy entries (src/core/backend.h): per chunk of rows,
// logits = x_chunk W^T (+ b) into one workspace buffer (chunk_rows x V), then the per-row loss and lse with
// the cross-entropy kernel. Backward recomputes each chunk's logits, turns them in place into
// dlogits = dloss * (softmax - onehot), then dx_chunk = dlogits W, dW += dlogits^T x_chunk and
// db += column sums of dlogits in double. bf16/f16 rows of x are widened to f32 a chunk at a time and dx is
// rounded back once, so the saved x stays narrow while the head and the loss are computed in f32.
#include "core/operand_checks.h"
#include "cpu/convert.h"
#include "cpu/cpu_backend.h"
#include "cpu/cross_entropy.h"
#include "cpu/gemm.h"

#include <algorithm>

namespace memtrain::cpu {

namespace {

constexpr const char* kOp = "fused_linear_cross_entropy";

using ::memtrain::detail::dense;

// Scratch on `device`, counted as workspace.
Tensor scratch(std::int64_t elems, DType dtype, Device device) {
  return ::memtrain::detail::workspace_on(device, elems, dtype);
}

// A (chunk, C) f32 scratch for widening narrow rows; undefined when x is f32 already.
Tensor widening_buffer(const Tensor& x, std::int64_t chunk) {
  return x.dtype() == DType::f32 ? Tensor() : scratch(chunk * x.size(1), DType::f32, x.device());
}

// Rows [n0, n0 + r) of the contiguous (N, C) matrix x as f32: in place for f32, else widened into `wide`.
const float* rows_f32(const Tensor& x, std::int64_t n0, std::int64_t r, const Tensor& wide) {
  const std::int64_t C = x.size(1);
  if (x.dtype() == DType::f32) return x.data<float>() + n0 * C;
  const auto* src =
      static_cast<const unsigned char*>(x.data_ptr()) + n0 * C * static_cast<std::int64_t>(x.element_size());
  convert(src, x.dtype(), wide.data_ptr(), DType::f32, static_cast<std::size_t>(r * C));
  return wide.data<float>();
}

// logits (r, V) = x (r, C) W^T (+ b): the bias is written into the rows and the GEMM adds onto it, as
// ops::linear does on the CPU.
void chunk_logits(float* logits, const float* x, const float* w, const float* b, std::int64_t r, std::int64_t V,
                  std::int64_t C) {
  if (b != nullptr) {
    for (std::int64_t i = 0; i < r; ++i) std::copy(b, b + V, logits + i * V);
  }
  gemm_f32(false, true, r, V, C, 1.0f, x, C, w, C, b != nullptr ? 1.0f : 0.0f, logits, V);
}

}  // namespace

std::int64_t CpuBackend::fused_linear_ce_forward(const Tensor& losses, const Tensor& lse, const Tensor& x,
                                                 const Tensor& weight, const Tensor& bias, const Tensor& targets,
                                                 std::int64_t ignore_index, std::int64_t chunk_rows) const {
  const std::int64_t N = x.size(0), C = x.size(1), V = weight.size(0);
  const Tensor t = dense(targets), xc = dense(x), wc = dense(weight), bc = dense(bias);
  const std::int64_t chunk = std::min(chunk_rows, N);
  const Tensor buf = chunk > 0 ? scratch(chunk * V, DType::f32, x.device()) : Tensor();  // (chunk, V) logits
  const Tensor wide = chunk > 0 ? widening_buffer(xc, chunk) : Tensor();
  if (!runs_kernels()) return ignore_index == 0 ? 0 : N;  // meta targets read as class 0
  std::int64_t count = 0;
  ::memtrain::detail::dispatch_index(t.dtype(), [&](auto izero) {
    using I = decltype(izero);
    const I* tp = t.data<I>();
    ::memtrain::detail::check_index_range(kOp, "target", tp, N, V, true, ignore_index, targets.shape());
    for (std::int64_t i = 0; i < N; ++i) count += static_cast<std::int64_t>(tp[i]) != ignore_index;
  });
  if (chunk == 0) return count;
  float* logits = buf.data<float>();
  ::memtrain::detail::dispatch_index(t.dtype(), [&](auto izero) {
    using I = decltype(izero);
    const I* tp = t.data<I>();
    for (std::int64_t n0 = 0; n0 < N; n0 += chunk) {
      const std::int64_t r = std::min(chunk, N - n0);
      chunk_logits(logits, rows_f32(xc, n0, r, wide), wc.data<float>(), data_or_null<float>(bc), r, V, C);
      ::memtrain::cpu::cross_entropy_forward<float, I>(losses.data<float>() + n0, lse.data<float>() + n0, logits, tp + n0, r, V,
                                      ignore_index);
    }
  });
  return count;
}

void CpuBackend::fused_linear_ce_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dloss,
                                          std::int64_t dloss_stride, const Tensor& x, const Tensor& weight,
                                          const Tensor& bias, const Tensor& targets, const Tensor& lse,
                                          std::int64_t ignore_index, std::int64_t chunk_rows) const {
  const Tensor xc = dense(x), w = dense(weight), b = dense(bias), t = dense(targets);
  const std::int64_t N = xc.size(0), C = xc.size(1), V = w.size(0);
  const bool want_dx = dx.defined(), want_dw = dw.defined(), want_db = db.defined();
  const Tensor db_acc = want_db ? scratch(V, DType::f64, x.device()) : Tensor();  // (V) in double
  if (want_db) Tensor(db_acc).zero_();
  const std::int64_t chunk = std::min(chunk_rows, N);
  if (chunk > 0 && (want_dx || want_dw || want_db)) {
    const Tensor buf = scratch(chunk * V, DType::f32, x.device());  // (chunk, V): logits, then dlogits
    const Tensor wide = widening_buffer(xc, chunk);
    // dx rows of a narrow x are computed in f32 here and rounded once into dx.
    const Tensor dx_wide = want_dx ? widening_buffer(xc, chunk) : Tensor();
    if (runs_kernels()) {
      float* dl = buf.data<float>();
      const float* wp = w.data<float>();
      const float* bp = data_or_null<float>(b);
      const float* dlp = dloss.data<float>();
      double* acc = data_or_null<double>(db_acc);
      ::memtrain::detail::dispatch_index(t.dtype(), [&](auto izero) {
        using I = decltype(izero);
        const I* tp = t.data<I>();
        for (std::int64_t n0 = 0; n0 < N; n0 += chunk) {
          const std::int64_t r = std::min(chunk, N - n0);
          const float* xp = rows_f32(xc, n0, r, wide);
          chunk_logits(dl, xp, wp, bp, r, V, C);
          // In place: each element of a row is read once before it is overwritten.
          ::memtrain::cpu::cross_entropy_backward<float, I>(dl, dlp + n0 * dloss_stride, dloss_stride, dl, lse.data<float>() + n0,
                                           tp + n0, r, V, ignore_index);
          if (want_dx) {
            float* out = dx_wide.defined() ? dx_wide.data<float>() : dx.data<float>() + n0 * C;
            gemm_f32(false, false, r, C, V, 1.0f, dl, V, wp, C, 0.0f, out, C);
            if (dx_wide.defined()) {
              convert(out, DType::f32, static_cast<unsigned char*>(dx.data_ptr()) + n0 * C * dx.element_size(),
                      dx.dtype(), static_cast<std::size_t>(r * C));
            }
          }
          if (want_dw) gemm_f32(true, false, V, C, r, 1.0f, dl, V, xp, C, 1.0f, dw.data<float>(), C);
          if (want_db) {
            for (std::int64_t i = 0; i < r; ++i) {
              const float* row = dl + i * V;
              for (std::int64_t v = 0; v < V; ++v) acc[v] += static_cast<double>(row[v]);
            }
          }
        }
      });
    }
  }
  if (want_db) Tensor(db).copy_(db_acc);
}

}  // namespace memtrain::cpu

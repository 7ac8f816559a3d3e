// The CUDA backend's fused linear + cross-entropy entries (src/core/backend.h): the CPU entry's chunked walk
// with cuda::gemm (f32) and the CUDA cross-entropy kernels (x f32, bf16 or f16). The [N] targets are checked
// and counted on the host (as ops::cross_entropy does); the per-row losses stay on the device. The bias rides
// on two rank-1 GEMMs (ones x bias into the logits, ones^T x dlogits into db), so no extra kernel is needed;
// db is accumulated in f32 here (double on the CPU).
#include "cuda/cuda_backend_entries.h"

#include "memtrain/core/error.h"
#include "memtrain/cuda/convert.h"
#include "memtrain/cuda/cuda.h"
#include "memtrain/cuda/nn.h"
#include "ops/nn_common.h"

#include <algorithm>

namespace memtrain::cuda {

namespace {

constexpr const char* kOp = "fused_linear_cross_entropy";

using ::memtrain::detail::dense;

Tensor device_workspace(std::int64_t elems, DType dtype, Device device) {
  return ::memtrain::detail::workspace_on(device, elems, dtype);
}

// n f32 ones on the device (workspace): the left factor of the bias GEMMs.
Tensor device_ones(std::int64_t n, Device device) {
  Tensor t = device_workspace(n, DType::f32, device);
  t.fill_(1.0);
  return t;
}

// Device pointer to row n0 of a contiguous (N, C) tensor.
void* row_ptr(const Tensor& t, std::int64_t n0, std::int64_t C) {
  return static_cast<unsigned char*>(t.data_ptr()) + n0 * C * static_cast<std::int64_t>(t.element_size());
}

// Rows [n0, n0 + r) of the contiguous (N, C) device matrix x as f32: in place for f32, else cast into `wide`.
const float* rows_f32(const Tensor& x, std::int64_t n0, std::int64_t r, const Tensor& wide) {
  const std::int64_t C = x.size(1);
  if (x.dtype() == DType::f32) return static_cast<const float*>(row_ptr(x, n0, C));
  cast(row_ptr(x, n0, C), x.dtype(), wide.data_ptr(), DType::f32, static_cast<std::size_t>(r * C), x.device().index);
  return wide.data<float>();
}

// logits (r, V) = x (r, C) W^T (+ ones (r, 1) b (1, V)), all f32 on the device.
void chunk_logits(float* logits, const float* x, const float* w, const float* b, const float* ones, std::int64_t r,
                  std::int64_t V, std::int64_t C, int device) {
  if (b != nullptr) cuda::gemm(DType::f32, false, false, r, V, 1, 1.0f, ones, 1, b, V, 0.0f, logits, V, device);
  cuda::gemm(DType::f32, false, true, r, V, C, 1.0f, x, C, w, C, b != nullptr ? 1.0f : 0.0f, logits, V, device);
}

}  // namespace

std::int64_t CudaBackend::fused_linear_ce_forward(const Tensor& losses, const Tensor& lse, const Tensor& x,
                                                  const Tensor& weight, const Tensor& bias, const Tensor& targets,
                                                  std::int64_t ignore_index, std::int64_t chunk_rows) const {
  const Device dev = x.device();
  const int d = dev.index;
  const std::int64_t N = x.size(0), C = x.size(1), V = weight.size(0);
  const Tensor t = dense(targets);
  const Tensor t_host = t.to(Device::cpu());  // [N] ids: range-checked and counted on the host
  std::int64_t count = 0;
  ops::detail::dispatch_index(t_host.dtype(), [&](auto izero) {
    using I = decltype(izero);
    const I* tp = t_host.data<I>();
    ops::detail::check_index_range(kOp, "target", tp, N, V, true, ignore_index, targets.shape());
    for (std::int64_t i = 0; i < N; ++i) count += static_cast<std::int64_t>(tp[i]) != ignore_index;
  });
  const Tensor xc = dense(x), wc = dense(weight), bc = dense(bias);
  const std::int64_t chunk = std::min(chunk_rows, N);
  if (chunk == 0) return count;
  const Tensor buf = device_workspace(chunk * V, DType::f32, dev);  // (chunk, V) logits
  const Tensor wide = xc.dtype() != DType::f32 ? device_workspace(chunk * C, DType::f32, dev) : Tensor();
  const Tensor ones = bc.defined() ? device_ones(chunk, dev) : Tensor();
  for (std::int64_t n0 = 0; n0 < N; n0 += chunk) {
    const std::int64_t r = std::min(chunk, N - n0);
    chunk_logits(buf.data<float>(), rows_f32(xc, n0, r, wide), wc.data<float>(),
                 bc.defined() ? bc.data<float>() : nullptr, ones.defined() ? ones.data<float>() : nullptr, r, V, C, d);
    cuda::cross_entropy_forward(losses.data<float>() + n0, lse.data<float>() + n0, buf.data<float>(), DType::f32,
                          row_ptr(t, n0, 1), t.dtype(), r, V, ignore_index, d);
  }
  return count;
}

void CudaBackend::fused_linear_ce_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dloss,
                                           std::int64_t dloss_stride, const Tensor& x, const Tensor& weight,
                                           const Tensor& bias, const Tensor& targets, const Tensor& lse,
                                           std::int64_t ignore_index, std::int64_t chunk_rows) const {
  const Tensor xc = dense(x), w = dense(weight), b = dense(bias), t = dense(targets);
  const std::int64_t N = xc.size(0), C = xc.size(1), V = w.size(0);
  const Device dev = x.device();
  const int d = dev.index;
  const bool want_dx = dx.defined(), want_dw = dw.defined(), want_db = db.defined();
  const std::int64_t chunk = std::min(chunk_rows, N);
  if (chunk == 0 || !(want_dx || want_dw || want_db)) return;
  const Tensor buf = device_workspace(chunk * V, DType::f32, dev);  // (chunk, V): logits, then dlogits
  float* dl = buf.data<float>();
  const bool narrow = xc.dtype() != DType::f32;
  const Tensor wide = narrow ? device_workspace(chunk * C, DType::f32, dev) : Tensor();
  const Tensor dx_wide = narrow && want_dx ? device_workspace(chunk * C, DType::f32, dev) : Tensor();
  const Tensor ones = b.defined() || want_db ? device_ones(chunk, dev) : Tensor();
  const float* wp = w.data<float>();
  const float* bp = b.defined() ? b.data<float>() : nullptr;
  const float* op = ones.defined() ? ones.data<float>() : nullptr;
  for (std::int64_t n0 = 0; n0 < N; n0 += chunk) {
    const std::int64_t r = std::min(chunk, N - n0);
    const float* xp = rows_f32(xc, n0, r, wide);
    chunk_logits(dl, xp, wp, bp, op, r, V, C, d);
    // In place: the kernel reads each logit and writes its gradient from the same thread.
    cuda::cross_entropy_backward(dl, dloss.data<float>() + n0 * dloss_stride, dloss_stride, dl, lse.data<float>() + n0,
                           DType::f32, row_ptr(t, n0, 1), t.dtype(), r, V, ignore_index, d);
    if (want_dx) {
      float* out = narrow ? dx_wide.data<float>() : static_cast<float*>(row_ptr(dx, n0, C));
      gemm(DType::f32, false, false, r, C, V, 1.0f, dl, V, wp, C, 0.0f, out, C, d);
      if (narrow) cast(out, DType::f32, row_ptr(dx, n0, C), dx.dtype(), static_cast<std::size_t>(r * C), d);
    }
    // dW (V, C) += dlogits^T (V, r) x (r, C); db (1, V) += ones (1, r) dlogits (r, V).
    if (want_dw) gemm(DType::f32, true, false, V, C, r, 1.0f, dl, V, xp, C, 1.0f, dw.data<float>(), C, d);
    if (want_db) gemm(DType::f32, false, false, 1, V, r, 1.0f, op, r, dl, V, 1.0f, db.data<float>(), V, d);
  }
}

}  // namespace memtrain::cuda

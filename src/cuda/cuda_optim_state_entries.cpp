// The CUDA backend's optimizer-state entries (src/cuda/cuda_backend_entries.h, block "optimizer state kinds")
// over the raw host functions of cuda/optim.h and cuda.h, called with the arguments the optimizers
// passed them before their steps moved behind the contract: cuda::adamw8bit_step / lion8bit_step (and the
// fp32 adamw_step / lion_step for small tensors), adafactor_*_step with its workspace, and GaLore's
// projector on cuBLAS / cuSOLVER. Working matrices are column-major: the gradient's row-major (m, n) buffer
// is the column-major S = G^T (n x m, leading dimension n); bases are stored row-major (rows x r).
#include "cuda/cuda_backend_entries.h"

#include "memtrain/core/rng.h"
#include "cuda/device_ops.h"
#include "cuda/optim.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace memtrain::cuda {
namespace {

// grad as the f32 contiguous tensor on its device that the kernels read (converted through the host).
Tensor grad_f32(const Tensor& grad) {
  if (grad.dtype() == DType::f32 && grad.is_contiguous()) return grad;
  return grad.to(Device::cpu()).to(DType::f32).contiguous().to(grad.device());
}

// Column-major C (M x N, ld ldc) = alpha op(X) op(Y) + beta C through the row-major cuda::gemm: column-major
// C is row-major C^T = op(Y)^T op(X)^T, so the operands swap and each keeps its flag (see cuda_gemm.cpp).
void gemm_cm(bool tx, bool ty, std::int64_t M, std::int64_t N, std::int64_t K, const float* X, std::int64_t ldx,
             const float* Y, std::int64_t ldy, float* C, std::int64_t ldc, int device, float alpha = 1.0f,
             float beta = 0.0f) {
  cuda::gemm(DType::f32, ty, tx, N, M, K, alpha, Y, ldy, X, ldx, beta, C, ldc, device);
}

// The CPU's Gaussian draws (same Philox positions, column-major order), uploaded into dst.
void gaussian_to_device(float* dst, std::int64_t rows, std::int64_t cols, RngState& rng, Device device) {
  const std::int64_t n = rows * cols;
  std::vector<float> host(static_cast<std::size_t>(n));
  ::memtrain::cpu::fill_normal(host.data(), n, rng);
  rng.offset += static_cast<std::uint64_t>((n + 3) / 4);
  cuda::copy(dst, device, host.data(), Device::cpu(), static_cast<std::size_t>(n) * sizeof(float));
}

Tensor device_matrix(std::int64_t rows, std::int64_t cols, Device device) {
  return Tensor::empty({cols, rows}, DType::f32, device);  // column-major rows x cols = row-major (cols, rows)
}

}  // namespace

bool CudaBackend::blockwise_block_size_ok(std::int64_t block_size) const {
  return quant_block_size_supported(block_size);
}

// The gradient is finite (the optimizer checked it), so the kernels skip their own non-finite gate.
void CudaBackend::adamw8bit_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                                 const Tensor& exp_avg_absmax, const Tensor& exp_avg_sq,
                                 const Tensor& exp_avg_sq_absmax, std::int64_t block_size, double lr, double beta1,
                                 double beta2, double eps, double weight_decay, std::int64_t step) const {
  const Tensor g32 = grad_f32(grad);
  const AdamWHyper hyper{lr, weight_decay, beta1, beta2, eps, step, /*skip_nonfinite=*/false};
  const auto n = static_cast<std::size_t>(param.numel());
  const int device = param.device().index;
  if (!exp_avg_absmax.defined()) {
    cuda::adamw_step(param.data<float>(), g32.data<float>(), exp_avg.data<float>(), exp_avg_sq.data<float>(), n,
                     hyper, device);
    return;
  }
  cuda::adamw8bit_step(param.data<float>(), g32.data<float>(), exp_avg.data<std::uint8_t>(),
                       exp_avg_absmax.data<float>(), exp_avg_sq.data<std::uint8_t>(),
                       exp_avg_sq_absmax.data<float>(), n, block_size, hyper, device);
}

void CudaBackend::lion8bit_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                                const Tensor& exp_avg_absmax, std::int64_t block_size, double lr, double beta1,
                                double beta2, double weight_decay) const {
  const Tensor g32 = grad_f32(grad);
  const LionHyper hyper{lr, weight_decay, beta1, beta2, /*skip_nonfinite=*/false};
  const auto n = static_cast<std::size_t>(param.numel());
  const int device = param.device().index;
  if (!exp_avg_absmax.defined()) {
    cuda::lion_step(param.data<float>(), g32.data<float>(), exp_avg.data<float>(), n, hyper, device);
    return;
  }
  cuda::lion8bit_step(param.data<float>(), g32.data<float>(), exp_avg.data<std::uint8_t>(),
                      exp_avg_absmax.data<float>(), n, block_size, hyper, device);
}

void CudaBackend::adafactor_step(const Tensor& param, const Tensor& grad, const Tensor& row, const Tensor& col,
                                 const Tensor& exp_avg_sq, const Tensor& exp_avg, double lr, double weight_decay,
                                 double beta1, double decay_rate, double eps1, double clip_threshold,
                                 std::int64_t step) const {
  const Tensor g32 = grad_f32(grad);
  const AdafactorHyper hyper{lr, weight_decay, beta1, decay_rate, eps1, clip_threshold, step};
  const Shape& s = param.shape();
  const auto n = static_cast<std::size_t>(param.numel());
  float* m = exp_avg.defined() ? exp_avg.data<float>() : nullptr;
  const int device = param.device().index;
  std::int64_t batch = 0, rows = 0, cols = 0;
  if (row.defined()) {
    rows = s[s.size() - 2];
    cols = s.back();
    batch = rows * cols == 0 ? 0 : param.numel() / (rows * cols);
  }
  // Scratch for the update u and the reductions' partial sums, in the caller's category.
  const std::size_t ws_bytes = adafactor_workspace_bytes(n, batch, rows, cols);
  const Tensor workspace = Tensor::empty({static_cast<std::int64_t>(ws_bytes)}, DType::u8, param.device());
  if (row.defined()) {
    adafactor_factored_step(param.data<float>(), g32.data<float>(), row.data<float>(), col.data<float>(), m, batch,
                            rows, cols, hyper, workspace.data<std::uint8_t>(), device);
  } else {
    adafactor_vector_step(param.data<float>(), g32.data<float>(), exp_avg_sq.data<float>(), m, n, hyper,
                          workspace.data<std::uint8_t>(), device);
  }
}

// One slice: the whole parameter widened to f32 (plus its compensation), stepped, and rounded back.
void CudaBackend::adafactor_step_bf16(const Tensor& param, const Tensor& grad, const Tensor& row, const Tensor& col,
                                      const Tensor& exp_avg_sq, const Tensor& exp_avg, double lr, double weight_decay,
                                      double beta1, double decay_rate, double eps1, double clip_threshold,
                                      std::int64_t step, const Tensor& compensation, std::uint64_t seed,
                                      std::uint64_t stream, std::int64_t) const {
  MT_CHECK(param.dtype() == DType::bf16 && param.is_contiguous(), "cuda::adafactor_step_bf16",
           "param must be contiguous bf16, got {} {}", dtype_name(param.dtype()), shape_str(param.shape()));
  const Tensor value = param.to(DType::f32);
  if (compensation.defined()) {
    const Tensor c = compensation.to(DType::f32);
    add(value.data_ptr(), c.data_ptr(), value.data_ptr(), DType::f32, static_cast<std::size_t>(value.numel()),
        param.device().index);
  }
  adafactor_step(value, grad, row, col, exp_avg_sq, exp_avg, lr, weight_decay, beta1, decay_rate, eps1,
                 clip_threshold, step);
  round_into_bf16(param, value, compensation, seed, stream, 0);
}

// GaLore's refresh on the device: A (rows_a x cols_a) is S itself when `transposed` (A = G^T), else S^T: a
// transpose flag on every product, no copy. Scratch comes in the caller's category.
void CudaBackend::galore_refresh(const Tensor& u, const Tensor& v, const Tensor& G, bool transposed,
                                 bool randomized, int power_iterations, int oversample, const Tensor& prev,
                                 RngState& rng) const {
  const Device dev_id = G.device();
  const int dev = dev_id.index;
  const std::int64_t m = G.size(0), n = G.size(1), r = u.size(1);
  const float* S = G.data<float>();  // column-major n x m, leading dimension n
  const bool a_trans = !transposed;
  const std::int64_t rows_a = transposed ? n : m, cols_a = transposed ? m : n;
  const bool want_v = v.defined();
  if (!randomized) {
    // S = U_S Sigma V_S^T, so G = V_S Sigma U_S^T: G's left vectors are V_S, its right ones U_S.
    Tensor us = device_matrix(n, r, dev_id), vs = device_matrix(m, r, dev_id);
    cuda::top_singular_vectors(S, n, m, r, us.data<float>(), vs.data<float>(), dev);
    const Tensor& u_cm = transposed ? us : vs;  // rows_a x r, column-major = row-major (r, rows_a)
    cuda::transpose(u_cm.data<float>(), r, rows_a, u.data<float>(), dev);
    if (want_v) cuda::transpose(us.data<float>(), r, cols_a, v.data<float>(), dev);
    return;
  }
  // The randomized range finder: A * X and A^T * X are products with S under the flag.
  const auto times_a = [&](const float* X, std::int64_t k, float* out) {  // (rows_a x k) = A (cols_a x k)
    gemm_cm(a_trans, false, rows_a, k, cols_a, S, n, X, cols_a, out, rows_a, dev);
  };
  const auto times_at = [&](const float* X, std::int64_t k, float* out) {  // (cols_a x k) = A^T (rows_a x k)
    gemm_cm(!a_trans, false, cols_a, k, rows_a, S, n, X, rows_a, out, cols_a, dev);
  };
  const std::int64_t k = std::min<std::int64_t>(r + oversample, std::min(m, n));
  Tensor Q = device_matrix(rows_a, k, dev_id), Z = device_matrix(cols_a, k, dev_id);
  float* q = Q.data<float>();
  float* z = Z.data<float>();
  if (prev.defined()) {
    // Y0 = [previous basis | Gaussian columns], pushed once through A A^T.
    Tensor Y0 = device_matrix(rows_a, k, dev_id);
    cuda::transpose(prev.data<float>(), rows_a, r, Y0.data<float>(), dev);
    if (k > r) gaussian_to_device(Y0.data<float>() + rows_a * r, rows_a, k - r, rng, dev_id);
    times_at(Y0.data<float>(), k, z);
    cuda::orthonormalize_columns(z, cols_a, k, dev);
    times_a(z, k, q);
  } else {
    Tensor omega = device_matrix(cols_a, k, dev_id);
    gaussian_to_device(omega.data<float>(), cols_a, k, rng, dev_id);
    times_a(omega.data<float>(), k, q);
  }
  cuda::orthonormalize_columns(q, rows_a, k, dev);
  for (int i = 0; i < power_iterations; ++i) {
    times_at(q, k, z);
    cuda::orthonormalize_columns(z, cols_a, k, dev);
    times_a(z, k, q);
    cuda::orthonormalize_columns(q, rows_a, k, dev);
  }
  Tensor B = device_matrix(k, cols_a, dev_id);  // Q^T A
  gemm_cm(true, a_trans, k, cols_a, rows_a, q, rows_a, S, n, B.data<float>(), k, dev);
  Tensor ub = device_matrix(k, r, dev_id);
  Tensor vb = want_v ? device_matrix(cols_a, r, dev_id) : Tensor();
  cuda::top_singular_vectors(B.data<float>(), k, cols_a, r, ub.data<float>(), want_v ? vb.data<float>() : nullptr,
                             dev);
  // Row-major basis (rows_a, r) = Q U_B: stored Q is row-major (k, rows_a), U_B row-major (r, k).
  cuda::gemm(DType::f32, true, true, rows_a, r, k, 1.0f, q, rows_a, ub.data<float>(), k, 0.0f, u.data<float>(), r,
             dev);
  if (want_v) cuda::transpose(vb.data<float>(), r, cols_a, v.data<float>(), dev);
}

// Row-major products: out = P^T G (r, n) | G Q (m, r) | P^T G Q (r, r); beta 1 accumulates.
void CudaBackend::galore_project(const Tensor& out, const Tensor& G, const Tensor& left, const Tensor& right,
                                 bool accumulate) const {
  const std::int64_t m = G.size(0), n = G.size(1);
  const std::int64_t r = left.defined() ? left.size(1) : right.size(1);
  const int dev = G.device().index;
  const float beta = accumulate ? 1.0f : 0.0f;
  const float* g = G.data<float>();
  float* o = out.data<float>();
  if (!right.defined()) {
    cuda::gemm(DType::f32, true, false, r, n, m, 1.0f, left.data<float>(), r, g, n, beta, o, n, dev);
  } else if (!left.defined()) {
    cuda::gemm(DType::f32, false, false, m, r, n, 1.0f, g, n, right.data<float>(), r, beta, o, r, dev);
  } else {
    Tensor pg = Tensor::empty({r, n}, DType::f32, G.device());
    cuda::gemm(DType::f32, true, false, r, n, m, 1.0f, left.data<float>(), r, g, n, 0.0f, pg.data<float>(), n, dev);
    cuda::gemm(DType::f32, false, false, r, r, n, 1.0f, pg.data<float>(), n, right.data<float>(), r, beta, o, r,
               dev);
  }
}

// W = scale * (P N | N Q^T | P N Q^T) + beta W with beta = decay when accumulating (0: W is not read).
void CudaBackend::galore_project_back(const Tensor& W, const Tensor& N, const Tensor& left, const Tensor& right,
                                      double scale_d, bool accumulate, float decay) const {
  const std::int64_t m = W.size(0), n = W.size(1);
  const std::int64_t r = left.defined() ? left.size(1) : right.size(1);
  const int dev = W.device().index;
  const auto scale = static_cast<float>(scale_d);
  const float beta = accumulate ? decay : 0.0f;
  const float* nm = N.data<float>();
  float* w = W.data<float>();
  if (!right.defined()) {
    cuda::gemm(DType::f32, false, false, m, n, r, scale, left.data<float>(), r, nm, n, beta, w, n, dev);
  } else if (!left.defined()) {
    cuda::gemm(DType::f32, false, true, m, n, r, scale, nm, r, right.data<float>(), r, beta, w, n, dev);
  } else {
    Tensor pn = Tensor::empty({m, r}, DType::f32, W.device());
    cuda::gemm(DType::f32, false, false, m, r, r, 1.0f, left.data<float>(), r, nm, r, 0.0f, pn.data<float>(), r,
               dev);
    cuda::gemm(DType::f32, false, true, m, n, r, scale, pn.data<float>(), r, right.data<float>(), r, beta, w, n,
               dev);
  }
}

}  // namespace memtrain::cuda

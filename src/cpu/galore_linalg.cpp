// GaLore's projector on the CPU (the contract's galore_refresh, galore_project, galore_project_back; moved
// from optim/galore_projector.cpp, which keeps the basis, the shapes and the random stream): exact or
// randomized SVD and the projections, all through Eigen maps over the tensors' row-major data. A row-major
// (m, n) buffer read column-major as (n, m) is G^T, so the right side's SVD input needs no copy. Eigen's
// working matrices are not the allocator's: only the tensors the caller passes are accounted, on the CPU
// and on meta alike (meta skips the arithmetic and reads as zeros).
#include "cpu/cpu_backend.h"

#include "cpu/eigen.h"

#include <Eigen/QR>
#include <Eigen/SVD>

#include <algorithm>
#include <optional>

namespace memtrain::cpu {
namespace {

using MatF = Eigen::MatrixXf;  // column-major working matrices
using RowMatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowMap = Eigen::Map<RowMatF>;
using ConstRowMap = Eigen::Map<const RowMatF>;
using ConstRef = Eigen::Ref<const MatF>;

struct Bases {
  MatF u;  // top-r left singular vectors of A
  MatF v;  // top-r right singular vectors of A (when asked for)
};

// Philox blocks a draw of n normals takes (four per block), so meta can advance the stream without drawing.
std::uint64_t normal_blocks(std::int64_t n) { return static_cast<std::uint64_t>((n + 3) / 4); }

// Thin Q (rows x cols) of a Householder QR: an orthonormal basis of Y's range.
MatF orthonormal_basis(const MatF& Y) {
  Eigen::HouseholderQR<MatF> qr(Y);
  return qr.householderQ() * MatF::Identity(Y.rows(), Y.cols());
}

MatF gaussian(std::int64_t rows, std::int64_t cols, RngState& rng) {
  MatF out(rows, cols);
  const std::int64_t n = rows * cols;
  fill_normal(out.data(), n, rng);
  rng.offset += normal_blocks(n);
  return out;
}

Bases top_exact(const ConstRef& A, std::int64_t r, bool want_v) {
  const unsigned opts = Eigen::ComputeThinU | (want_v ? unsigned(Eigen::ComputeThinV) : 0u);
  Eigen::BDCSVD<MatF> svd(A, opts);
  Bases out;
  out.u = svd.matrixU().leftCols(r);
  if (want_v) out.v = svd.matrixV().leftCols(r);
  return out;
}

// Randomized range finder (Halko, Martinsson & Tropp 2011, algorithms 4.4 + 5.1) for the top-r left (and
// optionally right) singular vectors of A (rows x cols). `prev_u` (rows x r) warm-starts the range search.
Bases top_randomized(const ConstRef& A, std::int64_t r, int power_iterations, int oversample, RngState& rng,
                     const MatF* prev_u, bool want_v) {
  const std::int64_t k = std::min<std::int64_t>(r + oversample, std::min(A.rows(), A.cols()));
  MatF Q;
  if (prev_u != nullptr) {
    // Start from span(previous P) plus fresh directions, pushed once through A A^T.
    MatF Y0(A.rows(), k);
    Y0.leftCols(r) = *prev_u;
    if (k > r) Y0.rightCols(k - r) = gaussian(A.rows(), k - r, rng);
    const MatF Z = A.transpose() * Y0;
    Q = orthonormal_basis(A * orthonormal_basis(Z));
  } else {
    Q = orthonormal_basis(A * gaussian(A.cols(), k, rng));
  }
  for (int i = 0; i < power_iterations; ++i) {
    const MatF Z = orthonormal_basis(A.transpose() * Q);  // re-orthonormalise each half step
    Q = orthonormal_basis(A * Z);
  }
  const MatF B = Q.transpose() * A;  // (k, cols)
  const unsigned opts = Eigen::ComputeThinU | (want_v ? unsigned(Eigen::ComputeThinV) : 0u);
  Eigen::BDCSVD<MatF> svd(B, opts);
  Bases out;
  out.u = Q * svd.matrixU().leftCols(r);
  if (want_v) out.v = svd.matrixV().leftCols(r);
  return out;
}

// The Philox blocks top_randomized draws for A (rows x cols), without drawing them.
void skip_randomized_draws(std::int64_t rows, std::int64_t cols, std::int64_t r, int oversample, bool warm,
                           RngState& rng) {
  const std::int64_t k = std::min<std::int64_t>(r + oversample, std::min(rows, cols));
  if (warm) {
    if (k > r) rng.offset += normal_blocks(rows * (k - r));
  } else {
    rng.offset += normal_blocks(cols * k);
  }
}

MatF from_tensor(const Tensor& t) { return ConstRowMap(t.data<float>(), t.size(0), t.size(1)); }

}  // namespace

void CpuBackend::galore_refresh(const Tensor& u, const Tensor& v, const Tensor& G, bool transposed, bool randomized,
                                int power_iterations, int oversample, const Tensor& prev, RngState& rng) const {
  const std::int64_t m = G.size(0), n = G.size(1), r = u.size(1);
  if (!runs_kernels()) {
    if (randomized) {
      skip_randomized_draws(transposed ? n : m, transposed ? m : n, r, oversample, prev.defined(), rng);
    }
    return;
  }
  const float* g = G.data<float>();
  const bool want_v = v.defined();
  std::optional<MatF> prev_u;
  if (prev.defined()) prev_u = from_tensor(prev);
  const MatF* warm = prev_u ? &*prev_u : nullptr;
  Bases b;
  if (transposed) {
    const Eigen::Map<const MatF> At(g, n, m);  // G^T, no copy
    b = randomized ? top_randomized(At, r, power_iterations, oversample, rng, warm, want_v)
                   : top_exact(At, r, want_v);
  } else {
    const MatF A = ConstRowMap(g, m, n);
    b = randomized ? top_randomized(A, r, power_iterations, oversample, rng, warm, want_v)
                   : top_exact(A, r, want_v);
  }
  RowMap(u.data<float>(), b.u.rows(), b.u.cols()) = b.u;
  if (want_v) RowMap(v.data<float>(), b.v.rows(), b.v.cols()) = b.v;
}

void CpuBackend::galore_project(const Tensor& out, const Tensor& G, const Tensor& left, const Tensor& right,
                                bool accumulate) const {
  if (!runs_kernels()) return;
  const std::int64_t m = G.size(0), n = G.size(1);
  const std::int64_t r = left.defined() ? left.size(1) : right.size(1);
  const ConstRowMap g(G.data<float>(), m, n);
  const auto store = [accumulate](auto&& dst, const auto& value) {
    if (accumulate) {
      dst.noalias() += value;
    } else {
      dst.noalias() = value;
    }
  };
  if (!right.defined()) {
    store(RowMap(out.data<float>(), r, n), ConstRowMap(left.data<float>(), m, r).transpose() * g);
  } else if (!left.defined()) {
    store(RowMap(out.data<float>(), m, r), g * ConstRowMap(right.data<float>(), n, r));
  } else {
    const MatF pg = ConstRowMap(left.data<float>(), m, r).transpose() * g;  // (r, n)
    store(RowMap(out.data<float>(), r, r), pg * ConstRowMap(right.data<float>(), n, r));
  }
}

void CpuBackend::galore_project_back(const Tensor& W, const Tensor& N, const Tensor& left, const Tensor& right,
                                     double scale_d, bool accumulate, float decay) const {
  const std::int64_t m = W.size(0), n = W.size(1);
  if (accumulate) {
    // W * decay + the product: the product in an (m, n) workspace first, then one fused pass.
    const Tensor back = Tensor::empty({m, n}, DType::f32, W.device());
    galore_project_back(back, N, left, right, scale_d, /*accumulate=*/false, 0.0f);
    if (!runs_kernels()) return;
    const float* b = back.data<float>();
    float* p = W.data<float>();
    const std::int64_t total = W.numel();
#pragma omp parallel for simd if (total > 32768)
    for (std::int64_t i = 0; i < total; ++i) p[i] = p[i] * decay + b[i];
    return;
  }
  if (!runs_kernels()) return;
  const std::int64_t r = left.defined() ? left.size(1) : right.size(1);
  const ConstRowMap nm(N.data<float>(), N.size(0), N.size(1));
  const auto scale = static_cast<float>(scale_d);
  RowMap o(W.data<float>(), m, n);
  if (!right.defined()) {
    o.noalias() = scale * (ConstRowMap(left.data<float>(), m, r) * nm);
  } else if (!left.defined()) {
    o.noalias() = scale * (nm * ConstRowMap(right.data<float>(), n, r).transpose());
  } else {
    const MatF pn = ConstRowMap(left.data<float>(), m, r) * nm;  // (m, r)
    o.noalias() = scale * (pn * ConstRowMap(right.data<float>(), n, r).transpose());
  }
}

}  // namespace memtrain::cpu

// GaLore projector: basis refresh by exact or randomized SVD, and the projections, all through Eigen maps
// over the tensors' row-major data. A row-major (m, n) buffer read column-major as (n, m) is G^T, so the
// right side's SVD input needs no copy. CUDA tensors take the same steps through cuda::gemm and the cuSOLVER
// wrappers of cuda/optim.h (the device half is at the bottom of this file).
#include "memtrain/optim/galore_projector.h"

#include "memtrain/core/allocator.h"
#include "memtrain/cuda/cuda.h"
#include "memtrain/cuda/optim.h"

#include "cpu/eigen.h"

#include <Eigen/QR>
#include <Eigen/SVD>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

namespace memtrain::optim {
namespace {

constexpr const char* kWhere = "GaLoreProjector";

using MatF = Eigen::MatrixXf;  // column-major working matrices
using RowMatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowMap = Eigen::Map<RowMatF>;
using ConstRowMap = Eigen::Map<const RowMatF>;
using ConstRef = Eigen::Ref<const MatF>;

struct Bases {
  MatF u;  // top-r left singular vectors of A
  MatF v;  // top-r right singular vectors of A (when asked for)
};

// Thin Q (rows x cols) of a Householder QR: an orthonormal basis of Y's range.
MatF orthonormal_basis(const MatF& Y) {
  Eigen::HouseholderQR<MatF> qr(Y);
  return qr.householderQ() * MatF::Identity(Y.rows(), Y.cols());
}

MatF gaussian(std::int64_t rows, std::int64_t cols, RngState& rng) {
  MatF out(rows, cols);
  const std::int64_t n = rows * cols;
  cpu::fill_normal(out.data(), n, rng);
  rng.offset += static_cast<std::uint64_t>((n + 3) / 4);
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
Bases top_randomized(const ConstRef& A, std::int64_t r, const GaLoreProjectorOptions& o, RngState& rng,
                     const MatF* prev_u, bool want_v) {
  const std::int64_t k = std::min<std::int64_t>(r + o.oversample, std::min(A.rows(), A.cols()));
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
  for (int i = 0; i < o.power_iterations; ++i) {
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

Tensor to_tensor(const MatF& M) {
  Tensor t = Tensor::empty({M.rows(), M.cols()}, DType::f32);
  RowMap(t.data<float>(), M.rows(), M.cols()) = M;
  return t;
}

MatF from_tensor(const Tensor& t) { return ConstRowMap(t.data<float>(), t.size(0), t.size(1)); }

void check_gradient(const Tensor& G) {
  MT_CHECK(G.defined(), kWhere, "undefined gradient");
  MT_CHECK(G.dim() == 2, kWhere, "expected a 2-D gradient, got shape {}", shape_str(G.shape()));
  MT_CHECK(G.dtype() == DType::f32, kWhere, "expected an f32 gradient, got {} of shape {}", dtype_name(G.dtype()),
           shape_str(G.shape()));
  MT_CHECK(G.device().is_cpu() || G.device().is_cuda(), kWhere, "expected a CPU or CUDA gradient, got one on {}",
           G.device().str());
}

}  // namespace

const char* galore_proj_type_name(GaLoreProjType t) {
  switch (t) {
    case GaLoreProjType::std_side: return "std";
    case GaLoreProjType::reverse_std_side: return "reverse_std";
    case GaLoreProjType::left: return "left";
    case GaLoreProjType::right: return "right";
    case GaLoreProjType::full: return "full";
  }
  return "?";
}

const char* galore_svd_name(GaLoreSvd s) { return s == GaLoreSvd::exact ? "exact" : "randomized"; }

GaLoreProjType galore_proj_type_from_name(std::string_view name) {
  for (const GaLoreProjType t : {GaLoreProjType::std_side, GaLoreProjType::reverse_std_side, GaLoreProjType::left,
                                 GaLoreProjType::right, GaLoreProjType::full}) {
    if (name == galore_proj_type_name(t)) return t;
  }
  MT_CHECK(false, "GaLore", "galore_proj_type '{}' is not one of std, reverse_std, left, right, full", name);
  return GaLoreProjType::std_side;
}

GaLoreSvd galore_svd_from_name(std::string_view name) {
  for (const GaLoreSvd s : {GaLoreSvd::exact, GaLoreSvd::randomized}) {
    if (name == galore_svd_name(s)) return s;
  }
  MT_CHECK(false, "GaLore", "galore_svd '{}' is not one of exact, randomized", name);
  return GaLoreSvd::randomized;
}

GaLoreProjector::GaLoreProjector(GaLoreProjectorOptions options) : options_(options), rng_{options.seed, 0} {
  MT_CHECK(options_.rank > 0, kWhere, "rank must be positive, got {}", options_.rank);
  MT_CHECK(options_.update_gap > 0, kWhere, "update_gap must be positive, got {}", options_.update_gap);
  MT_CHECK(options_.power_iterations >= 0 && options_.oversample >= 0, kWhere,
           "power_iterations and oversample must be >= 0, got {} and {}", options_.power_iterations,
           options_.oversample);
}

GaLoreProjector::Side GaLoreProjector::side_for(GaLoreProjType proj_type, std::int64_t m, std::int64_t n) {
  switch (proj_type) {
    case GaLoreProjType::std_side: return m <= n ? Side::left : Side::right;
    case GaLoreProjType::reverse_std_side: return m <= n ? Side::right : Side::left;
    case GaLoreProjType::left: return Side::left;
    case GaLoreProjType::right: return Side::right;
    case GaLoreProjType::full: return Side::both;
  }
  return Side::unset;
}

Shape GaLoreProjector::projected_shape(Side side, std::int64_t m, std::int64_t n, std::int64_t r) {
  switch (side) {
    case Side::left: return {r, n};
    case Side::right: return {m, r};
    case Side::both: return {r, r};
    case Side::unset: break;
  }
  MT_CHECK(false, kWhere, "projected_shape of an unset side");
  return {};
}

void GaLoreProjector::init_shape(std::int64_t m, std::int64_t n, Device device) {
  MT_CHECK(options_.rank <= std::min(m, n), kWhere, "rank {} exceeds min(m, n) = {} of the gradient of shape {}",
           options_.rank, std::min(m, n), shape_str({m, n}));
  side_ = side_for(options_.proj_type, m, n);
  m_ = m;
  n_ = n;
  device_ = device;
}

void GaLoreProjector::check_same_device(const Tensor& t, const char* what) const {
  MT_CHECK(t.device() == device_, kWhere, "{} of shape {} is on {}, but this projector's basis lives on {}", what,
           shape_str(t.shape()), t.device().str(), device_.str());
}

void GaLoreProjector::restore(std::int64_t m, std::int64_t n, const Tensor& left, const Tensor& right, RngState rng,
                              std::int64_t refresh_count, Device device) {
  MT_CHECK(refresh_count > 0, kWhere, "restore needs a refreshed basis, got refresh_count {}", refresh_count);
  init_shape(m, n, device);
  const std::int64_t r = options_.rank;
  auto take = [&](const Tensor& src, bool wanted, std::int64_t rows, const char* what) {
    if (!wanted) {
      MT_CHECK(!src.defined(), kWhere, "restore: the {} side keeps no {} matrix, got shape {}",
               galore_proj_type_name(options_.proj_type), what, shape_str(src.shape()));
      return Tensor();
    }
    MT_CHECK(src.defined() && src.shape() == Shape({rows, r}) && src.dtype() == DType::f32, kWhere,
             "restore: the {} matrix of a ({}, {}) gradient should be f32 of shape {}, got {}", what, m, n,
             shape_str({rows, r}), src.defined() ? shape_str(src.shape()) + " " + std::string(dtype_name(src.dtype())) : std::string("undefined"));
    CategoryGuard category(MemoryCategory::optimizer_state);
    Tensor out = Tensor::empty({rows, r}, DType::f32, device_);
    out.copy_(src);
    return out;
  };
  left_ = take(left, side_ != Side::right, m, "left");
  right_ = take(right, side_ != Side::left, n, "right");
  rng_ = rng;
  refresh_count_ = refresh_count;
  refreshed_last_ = false;
}

void GaLoreProjector::refresh(const Tensor& G) {
  if (device_.is_cuda()) {
    refresh_cuda(G);
    return;
  }
  const std::int64_t r = options_.rank;
  const float* g = G.data<float>();
  const bool randomized = options_.svd == GaLoreSvd::randomized;
  Bases b;
  if (side_ == Side::right) {
    const Eigen::Map<const MatF> At(g, n_, m_);  // G^T, no copy
    std::optional<MatF> prev;
    if (randomized && options_.warm_start && right_.defined()) prev = from_tensor(right_);
    b = randomized ? top_randomized(At, r, options_, rng_, prev ? &*prev : nullptr, false) : top_exact(At, r, false);
  } else {
    const MatF A = ConstRowMap(g, m_, n_);
    std::optional<MatF> prev;
    if (randomized && options_.warm_start && left_.defined()) prev = from_tensor(left_);
    const bool want_v = side_ == Side::both;
    b = randomized ? top_randomized(A, r, options_, rng_, prev ? &*prev : nullptr, want_v) : top_exact(A, r, want_v);
  }
  CategoryGuard category(MemoryCategory::optimizer_state);
  if (side_ == Side::right) {
    right_ = to_tensor(b.u);
  } else {
    left_ = to_tensor(b.u);
    if (side_ == Side::both) right_ = to_tensor(b.v);
  }
  ++refresh_count_;
}

Tensor GaLoreProjector::project(const Tensor& G_in, std::int64_t step) {
  check_gradient(G_in);
  if (side_ == Side::unset) init_shape(G_in.size(0), G_in.size(1), G_in.device());
  MT_CHECK(G_in.size(0) == m_ && G_in.size(1) == n_, kWhere, "gradient shape changed from {} to {}",
           shape_str({m_, n_}), shape_str(G_in.shape()));
  check_same_device(G_in, "the gradient");
  const Tensor G = G_in.is_contiguous() ? G_in.detach() : G_in.detach().contiguous();
  refreshed_last_ = refresh_count_ == 0 || step % options_.update_gap == 0;
  if (refreshed_last_) refresh(G);

  Tensor out = Tensor::empty(projected_shape(side_, m_, n_, options_.rank), DType::f32, device_);
  project_into(G, out, /*accumulate=*/false);
  return out;
}

void GaLoreProjector::project_add(const Tensor& G_in, Tensor& acc) const {
  MT_CHECK(side_ != Side::unset, kWhere, "project_add before the first project()");
  check_gradient(G_in);
  MT_CHECK(G_in.size(0) == m_ && G_in.size(1) == n_, kWhere, "gradient shape changed from {} to {}",
           shape_str({m_, n_}), shape_str(G_in.shape()));
  check_same_device(G_in, "the gradient");
  MT_CHECK(acc.shape() == projected_shape(side_, m_, n_, options_.rank) && acc.dtype() == DType::f32 &&
               acc.is_contiguous() && acc.device() == device_,
           kWhere, "project_add: the accumulator must be a contiguous f32 tensor of shape {} on {}, got {} on {}",
           shape_str(projected_shape(side_, m_, n_, options_.rank)), device_.str(), shape_str(acc.shape()),
           acc.device().str());
  project_into(G_in.is_contiguous() ? G_in.detach() : G_in.detach().contiguous(), acc, /*accumulate=*/true);
}

void GaLoreProjector::project_into(const Tensor& G, Tensor& out, bool accumulate) const {
  if (device_.is_cuda()) {
    project_into_cuda(G, out, accumulate);
    return;
  }
  const std::int64_t r = options_.rank;
  const ConstRowMap g(G.data<float>(), m_, n_);
  const auto store = [accumulate](auto&& dst, const auto& value) {
    if (accumulate) {
      dst.noalias() += value;
    } else {
      dst.noalias() = value;
    }
  };
  if (side_ == Side::left) {
    store(RowMap(out.data<float>(), r, n_), ConstRowMap(left_.data<float>(), m_, r).transpose() * g);
  } else if (side_ == Side::right) {
    store(RowMap(out.data<float>(), m_, r), g * ConstRowMap(right_.data<float>(), n_, r));
  } else {
    const MatF pg = ConstRowMap(left_.data<float>(), m_, r).transpose() * g;  // (r, n)
    store(RowMap(out.data<float>(), r, r), pg * ConstRowMap(right_.data<float>(), n_, r));
  }
}

Tensor GaLoreProjector::checked_projected(const Tensor& N_in, const char* who) const {
  MT_CHECK(side_ != Side::unset, kWhere, "{} before the first project()", who);
  const Shape want = projected_shape(side_, m_, n_, options_.rank);
  MT_CHECK(N_in.defined() && N_in.shape() == want && N_in.dtype() == DType::f32 && N_in.device() == device_,
           kWhere, "{} expects an f32 tensor of shape {} on {} (gradient {}), got {}", who, shape_str(want),
           device_.str(), shape_str({m_, n_}),
           N_in.defined() ? fmt::format("{} {} on {}", shape_str(N_in.shape()), dtype_name(N_in.dtype()),
                                        N_in.device().str())
                          : std::string("undefined"));
  return N_in.is_contiguous() ? N_in.detach() : N_in.detach().contiguous();
}

Tensor GaLoreProjector::project_back(const Tensor& N_in) const {
  const Tensor N = checked_projected(N_in, "project_back");
  const std::int64_t r = options_.rank;
  const Shape want = N.shape();
  if (device_.is_cuda()) {
    Tensor out = Tensor::empty({m_, n_}, DType::f32, device_);
    project_back_cuda(N, out, 0.0f);
    return out;
  }
  const ConstRowMap nm(N.data<float>(), want[0], want[1]);
  const float scale = static_cast<float>(options_.scale);
  Tensor out = Tensor::empty({m_, n_}, DType::f32);
  RowMap o(out.data<float>(), m_, n_);
  if (side_ == Side::left) {
    o.noalias() = scale * (ConstRowMap(left_.data<float>(), m_, r) * nm);
  } else if (side_ == Side::right) {
    o.noalias() = scale * (nm * ConstRowMap(right_.data<float>(), n_, r).transpose());
  } else {
    const MatF pn = ConstRowMap(left_.data<float>(), m_, r) * nm;  // (m, r)
    o.noalias() = scale * (pn * ConstRowMap(right_.data<float>(), n_, r).transpose());
  }
  return out;
}

void GaLoreProjector::project_back_add(const Tensor& N_in, Tensor& W, float decay) const {
  const Tensor N = checked_projected(N_in, "project_back_add");
  MT_CHECK(W.defined() && W.shape() == Shape({m_, n_}) && W.dtype() == DType::f32 && W.is_contiguous() &&
               W.device() == device_,
           kWhere, "project_back_add: W must be a contiguous f32 tensor of shape {} on {}, got {}", shape_str({m_, n_}),
           device_.str(),
           W.defined() ? fmt::format("{} {} on {}", shape_str(W.shape()), dtype_name(W.dtype()), W.device().str())
                       : std::string("undefined"));
  if (device_.is_cuda()) {
    project_back_cuda(N, W, decay);
    return;
  }
  const Tensor back = project_back(N);
  const float* b = back.data<float>();
  float* p = W.data<float>();
  const std::int64_t n = W.numel();
#pragma omp parallel for simd if (n > 32768)
  for (std::int64_t i = 0; i < n; ++i) p[i] = p[i] * decay + b[i];
}

std::size_t GaLoreProjector::bytes() const {
  return (left_.defined() ? left_.nbytes() : 0) + (right_.defined() ? right_.nbytes() : 0);
}

// ---- CUDA: the same algorithm on the device ----
// Working matrices are column-major, as Eigen's above. The gradient's row-major (m, n) buffer is the
// column-major S = G^T (n x m, leading dimension n), so A (the matrix whose left singular vectors the side
// keeps) is S itself for the right side and S^T for left / both: a transpose flag on every product, no copy.
// Bases are stored row-major (rows x r) like the CPU's tensors.

namespace {

// Column-major C (M x N, ld ldc) = alpha op(X) op(Y) + beta C through the row-major cuda::gemm: column-major
// C is row-major C^T = op(Y)^T op(X)^T, so the operands swap and each keeps its flag (see cuda_gemm.cpp).
void gemm_cm(bool tx, bool ty, std::int64_t M, std::int64_t N, std::int64_t K, const float* X, std::int64_t ldx,
             const float* Y, std::int64_t ldy, float* C, std::int64_t ldc, int device, float alpha = 1.0f,
             float beta = 0.0f) {
  cuda::gemm(DType::f32, ty, tx, N, M, K, alpha, Y, ldy, X, ldx, beta, C, ldc, device);
}

// The CPU's gaussian() draws (same Philox positions, same column-major order), uploaded into dst.
void gaussian_to_device(float* dst, std::int64_t rows, std::int64_t cols, RngState& rng, Device device) {
  const MatF host = gaussian(rows, cols, rng);
  cuda::copy(dst, device, host.data(), Device::cpu(), static_cast<std::size_t>(rows * cols) * sizeof(float));
}

Tensor device_matrix(std::int64_t rows, std::int64_t cols, Device device) {
  return Tensor::empty({cols, rows}, DType::f32, device);  // column-major rows x cols = row-major (cols, rows)
}

}  // namespace

void GaLoreProjector::refresh_cuda(const Tensor& G) {
  const std::int64_t r = options_.rank;
  const int dev = device_.index;
  const float* S = G.data<float>();  // column-major n x m, leading dimension n
  const bool right = side_ == Side::right;
  const bool a_trans = !right;  // A = S^T for left / both
  const std::int64_t rows_a = right ? n_ : m_, cols_a = right ? m_ : n_;
  const bool want_v = side_ == Side::both;
  Tensor u_rm, v_rm;  // the new basis, row-major (rows_a x r) and (cols_a x r)
  {
    CategoryGuard category(MemoryCategory::optimizer_state);
    u_rm = Tensor::empty({rows_a, r}, DType::f32, device_);
    if (want_v) v_rm = Tensor::empty({cols_a, r}, DType::f32, device_);
  }
  // Scratch for the rest: the caller (GaLore::update) runs under the workspace category.
  if (options_.svd == GaLoreSvd::exact) {
    // S = U_S Sigma V_S^T, so G = V_S Sigma U_S^T: G's left vectors are V_S, its right ones U_S.
    Tensor us = device_matrix(n_, r, device_), vs = device_matrix(m_, r, device_);
    cuda::top_singular_vectors(S, n_, m_, r, us.data<float>(), vs.data<float>(), dev);
    const Tensor& u_cm = right ? us : vs;  // rows_a x r, column-major = row-major (r, rows_a)
    cuda::transpose(u_cm.data<float>(), r, rows_a, u_rm.data<float>(), dev);
    if (want_v) cuda::transpose(us.data<float>(), r, cols_a, v_rm.data<float>(), dev);
  } else {
    // top_randomized on the device: A * X and A^T * X are products with S under the flag.
    const auto times_a = [&](const float* X, std::int64_t k, float* out) {  // (rows_a x k) = A (cols_a x k)
      gemm_cm(a_trans, false, rows_a, k, cols_a, S, n_, X, cols_a, out, rows_a, dev);
    };
    const auto times_at = [&](const float* X, std::int64_t k, float* out) {  // (cols_a x k) = A^T (rows_a x k)
      gemm_cm(!a_trans, false, cols_a, k, rows_a, S, n_, X, rows_a, out, cols_a, dev);
    };
    const std::int64_t k = std::min<std::int64_t>(r + options_.oversample, std::min(m_, n_));
    Tensor Q = device_matrix(rows_a, k, device_), Z = device_matrix(cols_a, k, device_);
    float* q = Q.data<float>();
    float* z = Z.data<float>();
    const bool warm = options_.warm_start && (right ? right_.defined() : left_.defined());
    if (warm) {
      // Y0 = [previous basis | Gaussian columns], pushed once through A A^T.
      Tensor Y0 = device_matrix(rows_a, k, device_);
      const Tensor& prev = right ? right_ : left_;  // row-major (rows_a, r)
      cuda::transpose(prev.data<float>(), rows_a, r, Y0.data<float>(), dev);
      if (k > r) gaussian_to_device(Y0.data<float>() + rows_a * r, rows_a, k - r, rng_, device_);
      times_at(Y0.data<float>(), k, z);
      cuda::orthonormalize_columns(z, cols_a, k, dev);
      times_a(z, k, q);
    } else {
      Tensor omega = device_matrix(cols_a, k, device_);
      gaussian_to_device(omega.data<float>(), cols_a, k, rng_, device_);
      times_a(omega.data<float>(), k, q);
    }
    cuda::orthonormalize_columns(q, rows_a, k, dev);
    for (int i = 0; i < options_.power_iterations; ++i) {
      times_at(q, k, z);
      cuda::orthonormalize_columns(z, cols_a, k, dev);
      times_a(z, k, q);
      cuda::orthonormalize_columns(q, rows_a, k, dev);
    }
    Tensor B = device_matrix(k, cols_a, device_);  // Q^T A
    gemm_cm(true, a_trans, k, cols_a, rows_a, q, rows_a, S, n_, B.data<float>(), k, dev);
    Tensor ub = device_matrix(k, r, device_);
    Tensor vb = want_v ? device_matrix(cols_a, r, device_) : Tensor();
    cuda::top_singular_vectors(B.data<float>(), k, cols_a, r, ub.data<float>(), want_v ? vb.data<float>() : nullptr,
                               dev);
    // Row-major basis (rows_a, r) = Q U_B: stored Q is row-major (k, rows_a), U_B row-major (r, k).
    cuda::gemm(DType::f32, true, true, rows_a, r, k, 1.0f, q, rows_a, ub.data<float>(), k, 0.0f, u_rm.data<float>(),
               r, dev);
    if (want_v) cuda::transpose(vb.data<float>(), r, cols_a, v_rm.data<float>(), dev);
  }
  if (right) {
    right_ = std::move(u_rm);
  } else {
    left_ = std::move(u_rm);
    if (want_v) right_ = std::move(v_rm);
  }
  ++refresh_count_;
}

// Row-major products, as project_into: R = P^T G (r, n) | G Q (m, r) | P^T G Q (r, r); beta 1 accumulates.
void GaLoreProjector::project_into_cuda(const Tensor& G, Tensor& out, bool accumulate) const {
  const std::int64_t r = options_.rank;
  const int dev = device_.index;
  const float beta = accumulate ? 1.0f : 0.0f;
  const float* g = G.data<float>();
  float* o = out.data<float>();
  if (side_ == Side::left) {
    cuda::gemm(DType::f32, true, false, r, n_, m_, 1.0f, left_.data<float>(), r, g, n_, beta, o, n_, dev);
  } else if (side_ == Side::right) {
    cuda::gemm(DType::f32, false, false, m_, r, n_, 1.0f, g, n_, right_.data<float>(), r, beta, o, r, dev);
  } else {
    Tensor pg = Tensor::empty({r, n_}, DType::f32, device_);
    cuda::gemm(DType::f32, true, false, r, n_, m_, 1.0f, left_.data<float>(), r, g, n_, 0.0f, pg.data<float>(), n_,
               dev);
    cuda::gemm(DType::f32, false, false, r, r, n_, 1.0f, pg.data<float>(), n_, right_.data<float>(), r, beta, o, r,
               dev);
  }
}

void GaLoreProjector::project_back_cuda(const Tensor& N, Tensor& W, float beta) const {
  const std::int64_t r = options_.rank;
  const int dev = device_.index;
  const auto scale = static_cast<float>(options_.scale);
  const float* nm = N.data<float>();
  float* w = W.data<float>();
  if (side_ == Side::left) {
    cuda::gemm(DType::f32, false, false, m_, n_, r, scale, left_.data<float>(), r, nm, n_, beta, w, n_, dev);
  } else if (side_ == Side::right) {
    cuda::gemm(DType::f32, false, true, m_, n_, r, scale, nm, r, right_.data<float>(), r, beta, w, n_, dev);
  } else {
    Tensor pn = Tensor::empty({m_, r}, DType::f32, device_);
    cuda::gemm(DType::f32, false, false, m_, r, r, 1.0f, left_.data<float>(), r, nm, r, 0.0f, pn.data<float>(), r,
               dev);
    cuda::gemm(DType::f32, false, true, m_, n_, r, scale, pn.data<float>(), r, right_.data<float>(), r, beta, w, n_,
               dev);
  }
}

}  // namespace memtrain::optim

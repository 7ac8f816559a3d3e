// GaLore projector: basis refresh by exact or randomized SVD, and the projections, all through Eigen maps
// over the tensors' row-major data. A row-major (m, n) buffer read column-major as (n, m) is G^T, so the
// right side's SVD input needs no copy.
#include "memtrain/optim/galore_projector.h"

#include "memtrain/core/allocator.h"

#include <Eigen/Core>
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
  MT_CHECK(G.device().is_cpu(), kWhere, "expected a CPU gradient, got one on {} of shape {}", G.device().str(),
           shape_str(G.shape()));
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

void GaLoreProjector::init_shape(std::int64_t m, std::int64_t n) {
  MT_CHECK(options_.rank <= std::min(m, n), kWhere, "rank {} exceeds min(m, n) = {} of the gradient of shape {}",
           options_.rank, std::min(m, n), shape_str({m, n}));
  side_ = side_for(options_.proj_type, m, n);
  m_ = m;
  n_ = n;
}

void GaLoreProjector::restore(std::int64_t m, std::int64_t n, const Tensor& left, const Tensor& right, RngState rng,
                              std::int64_t refresh_count) {
  MT_CHECK(refresh_count > 0, kWhere, "restore needs a refreshed basis, got refresh_count {}", refresh_count);
  init_shape(m, n);
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
    Tensor out = Tensor::empty({rows, r}, DType::f32);
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
  if (side_ == Side::unset) init_shape(G_in.size(0), G_in.size(1));
  MT_CHECK(G_in.size(0) == m_ && G_in.size(1) == n_, kWhere, "gradient shape changed from {} to {}",
           shape_str({m_, n_}), shape_str(G_in.shape()));
  const Tensor G = G_in.is_contiguous() ? G_in.detach() : G_in.detach().contiguous();
  refreshed_last_ = refresh_count_ == 0 || step % options_.update_gap == 0;
  if (refreshed_last_) refresh(G);

  Tensor out = Tensor::empty(projected_shape(side_, m_, n_, options_.rank), DType::f32);
  project_into(G, out, /*accumulate=*/false);
  return out;
}

void GaLoreProjector::project_add(const Tensor& G_in, Tensor& acc) const {
  MT_CHECK(side_ != Side::unset, kWhere, "project_add before the first project()");
  check_gradient(G_in);
  MT_CHECK(G_in.size(0) == m_ && G_in.size(1) == n_, kWhere, "gradient shape changed from {} to {}",
           shape_str({m_, n_}), shape_str(G_in.shape()));
  MT_CHECK(acc.shape() == projected_shape(side_, m_, n_, options_.rank) && acc.dtype() == DType::f32 &&
               acc.is_contiguous() && acc.device().is_cpu(),
           kWhere, "project_add: the accumulator must be a contiguous f32 CPU tensor of shape {}, got {}",
           shape_str(projected_shape(side_, m_, n_, options_.rank)), shape_str(acc.shape()));
  project_into(G_in.is_contiguous() ? G_in.detach() : G_in.detach().contiguous(), acc, /*accumulate=*/true);
}

void GaLoreProjector::project_into(const Tensor& G, Tensor& out, bool accumulate) const {
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

Tensor GaLoreProjector::project_back(const Tensor& N_in) const {
  MT_CHECK(side_ != Side::unset, kWhere, "project_back before the first project()");
  const std::int64_t r = options_.rank;
  const Shape want = side_ == Side::left ? Shape{r, n_} : side_ == Side::right ? Shape{m_, r} : Shape{r, r};
  MT_CHECK(N_in.defined() && N_in.shape() == want && N_in.dtype() == DType::f32 && N_in.device().is_cpu(), kWhere,
           "project_back expects an f32 CPU tensor of shape {} (gradient {}), got {}", shape_str(want),
           shape_str({m_, n_}), N_in.defined() ? shape_str(N_in.shape()) + " " + std::string(dtype_name(N_in.dtype()))
                                               : std::string("undefined"));
  const Tensor N = N_in.is_contiguous() ? N_in.detach() : N_in.detach().contiguous();
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

std::size_t GaLoreProjector::bytes() const {
  return (left_.defined() ? left_.nbytes() : 0) + (right_.defined() ? right_.nbytes() : 0);
}

}  // namespace memtrain::optim

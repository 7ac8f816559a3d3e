// GaLore projector: the basis, its shapes and its random stream; the linear algebra (exact or randomized SVD,
// the projections) is the backend's galore_refresh / galore_project / galore_project_back (CPU:
// src/cpu/galore_linalg.cpp on Eigen; CUDA: src/cuda/cuda_optim_state_entries.cpp on cuBLAS / cuSOLVER;
// meta: the same tensors, the basis reads as zeros).
#include "memtrain/optim/galore_projector.h"

#include "core/backend.h"
#include "memtrain/core/allocator.h"
#include "memtrain/ops/elementwise.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>
#include <utility>

namespace memtrain::optim {
namespace {

constexpr const char* kWhere = "GaLoreProjector";

}  // namespace

// Decided on the host (r signs from a rare refresh); meta holds no data to decide.
void apply_canonical_signs(Tensor& basis, const Tensor& previous) {
  if (basis.device().is_meta()) return;
  const Tensor b = basis.to(Device::cpu());  // itself when already there
  const Tensor p = previous.defined() ? previous.to(Device::cpu()) : Tensor();
  const std::int64_t rows = b.size(0), r = b.size(1);
  const float* x = b.data<float>();
  std::vector<float> sign(static_cast<std::size_t>(r), 1.0f);
  bool any = false;
  for (std::int64_t c = 0; c < r; ++c) {
    bool flip = false;
    if (p.defined()) {
      const float* y = p.data<float>();
      double dot = 0.0;
      for (std::int64_t i = 0; i < rows; ++i) dot += static_cast<double>(x[i * r + c]) * y[i * r + c];
      flip = dot < 0.0;
    } else {
      std::int64_t top = 0;
      for (std::int64_t i = 1; i < rows; ++i)
        if (std::fabs(x[i * r + c]) > std::fabs(x[top * r + c])) top = i;
      flip = x[top * r + c] < 0.0f;
    }
    if (flip) sign[static_cast<std::size_t>(c)] = -1.0f;
    any |= flip;
  }
  if (!any) return;
  const Tensor signs = from_buffer(sign.data(), {1, r}, DType::f32, DType::f32, basis.device());
  basis.copy_(ops::mul(basis, signs));
}

namespace {

void check_gradient(const Tensor& G) {
  MT_CHECK(G.defined(), kWhere, "undefined gradient");
  MT_CHECK(G.dim() == 2, kWhere, "expected a 2-D gradient, got shape {}", shape_str(G.shape()));
  MT_CHECK(G.dtype() == DType::f32, kWhere, "expected an f32 gradient, got {} of shape {}", dtype_name(G.dtype()),
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

const char* galore_decay_order_name(GaLoreDecayOrder o) { return o == GaLoreDecayOrder::after ? "after" : "before"; }

GaLoreDecayOrder galore_decay_order_from_name(std::string_view name) {
  if (name == "before") return GaLoreDecayOrder::before;
  MT_CHECK(name == "after", "GaLore", "galore_decay_order '{}' is not one of before, after", name);
  return GaLoreDecayOrder::after;
}

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
  const std::int64_t r = options_.rank;
  const bool right = side_ == Side::right;  // A = G^T: its left singular vectors are G's right ones
  const std::int64_t rows_a = right ? n_ : m_, cols_a = right ? m_ : n_;
  const bool randomized = options_.svd == GaLoreSvd::randomized;
  const Tensor& prev = right ? right_ : left_;
  const Tensor warm = randomized && options_.warm_start && prev.defined() ? prev : Tensor();
  Tensor u, v;  // the new basis, row-major (rows_a, r) and (cols_a, r)
  {
    CategoryGuard category(MemoryCategory::optimizer_state);
    u = Tensor::empty({rows_a, r}, DType::f32, device_);
    if (side_ == Side::both) v = Tensor::empty({cols_a, r}, DType::f32, device_);
  }
  // Scratch of the decomposition: the caller's category (GaLore::update runs under workspace).
  ::memtrain::detail::backend_for(device_).galore_refresh(u, v, G, right, randomized, options_.power_iterations,
                                                          options_.oversample, warm, rng_);
  apply_canonical_signs(u, right ? right_ : left_);
  if (side_ == Side::both) apply_canonical_signs(v, right_);
  if (right) {
    right_ = std::move(u);
  } else {
    left_ = std::move(u);
    if (side_ == Side::both) right_ = std::move(v);
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
  ::memtrain::detail::backend_for(device_).galore_project(out, G, side_ == Side::right ? Tensor() : left_,
                                                          side_ == Side::left ? Tensor() : right_, accumulate);
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
  Tensor out = Tensor::empty({m_, n_}, DType::f32, device_);
  project_back_into(N, out, /*accumulate=*/false, 0.0f);
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
  project_back_into(N, W, /*accumulate=*/true, decay);
}

void GaLoreProjector::project_back_into(const Tensor& N, Tensor& W, bool accumulate, float decay) const {
  ::memtrain::detail::backend_for(device_).galore_project_back(W, N, side_ == Side::right ? Tensor() : left_,
                                                               side_ == Side::left ? Tensor() : right_,
                                                               options_.scale, accumulate, decay);
}

std::size_t GaLoreProjector::bytes() const {
  return (left_.defined() ? left_.nbytes() : 0) + (right_.defined() ? right_.nbytes() : 0);
}

}  // namespace memtrain::optim

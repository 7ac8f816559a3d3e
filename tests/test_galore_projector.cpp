// GaLore projector: orthonormal bases for every proj type and SVD kind, exact vs randomized subspace on a
// matrix with a clear spectral gap, projections against a float64 reference, the refresh schedule, bytes,
// and argument errors. References are computed in double from the float inputs and bases.
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <Eigen/QR>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "memtrain/core/tensor.h"
#include "memtrain/optim/galore_projector.h"

namespace {

using namespace memtrain;
using namespace memtrain::optim;
using MatD = Eigen::MatrixXd;
using RowMatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

const GaLoreProjType kTypes[] = {GaLoreProjType::std_side, GaLoreProjType::reverse_std_side, GaLoreProjType::left,
                                 GaLoreProjType::right, GaLoreProjType::full};
const GaLoreSvd kSvds[] = {GaLoreSvd::exact, GaLoreSvd::randomized};

MatD to_mat(const Tensor& t) {
  return Eigen::Map<const RowMatF>(t.data<float>(), t.size(0), t.size(1)).cast<double>();
}

Tensor to_tensor(const MatD& m) {
  Tensor t = Tensor::empty({m.rows(), m.cols()}, DType::f32);
  Eigen::Map<RowMatF>(t.data<float>(), m.rows(), m.cols()) = m.cast<float>();
  return t;
}

MatD random_mat(std::int64_t rows, std::int64_t cols, std::mt19937& gen) {
  std::normal_distribution<double> nd;
  MatD m(rows, cols);
  for (std::int64_t i = 0; i < m.size(); ++i) m.data()[i] = nd(gen);
  return m;
}

MatD random_orthonormal(std::int64_t rows, std::int64_t cols, std::mt19937& gen) {
  Eigen::HouseholderQR<MatD> qr(random_mat(rows, cols, gen));
  return qr.householderQ() * MatD::Identity(rows, cols);
}

// U diag(s) V^T with s = 10, 9, ... (linearly down to 3) for the first r and 0.01 after.
MatD gapped(std::int64_t m, std::int64_t n, std::int64_t r, std::mt19937& gen) {
  const std::int64_t k = std::min(m, n);
  Eigen::VectorXd s = Eigen::VectorXd::Constant(k, 0.01);
  for (std::int64_t i = 0; i < r; ++i) s[i] = r == 1 ? 10.0 : 10.0 - 7.0 * static_cast<double>(i) / (r - 1);
  return random_orthonormal(m, k, gen) * s.asDiagonal() * random_orthonormal(n, k, gen).transpose();
}

double ortho_error(const Tensor& P) {
  const MatD p = to_mat(P);
  return (p.transpose() * p - MatD::Identity(p.cols(), p.cols())).norm();
}

double subspace_distance(const Tensor& a, const Tensor& b) {
  const MatD pa = to_mat(a), pb = to_mat(b);
  return (pa * pa.transpose() - pb * pb.transpose()).norm();
}

GaLoreProjectorOptions opts(std::int64_t rank, GaLoreProjType type, GaLoreSvd svd) {
  GaLoreProjectorOptions o;
  o.rank = rank;
  o.proj_type = type;
  o.svd = svd;
  o.update_gap = 10;
  o.scale = 0.25;
  return o;
}

struct Shape2 {
  std::int64_t m, n, r;
};
const Shape2 kShapes[] = {{1, 1, 1}, {3, 5, 2}, {40, 24, 8}, {17, 127, 5}, {64, 64, 16}, {130, 33, 33}};

TEST(GaLoreProjector, BasesAreOrthonormalForEveryTypeAndSvd) {
  std::mt19937 gen(1);
  for (const Shape2& s : kShapes) {
    const Tensor G = to_tensor(random_mat(s.m, s.n, gen));
    for (GaLoreProjType type : kTypes) {
      for (GaLoreSvd svd : kSvds) {
        SCOPED_TRACE(fmt::format("{}x{} r={} {} {}", s.m, s.n, s.r, galore_proj_type_name(type),
                                 svd == GaLoreSvd::exact ? "exact" : "randomized"));
        GaLoreProjector proj(opts(s.r, type, svd));
        const Tensor R = proj.project(G, 0);
        using Side = GaLoreProjector::Side;
        const Side side = proj.side();
        if (type == GaLoreProjType::std_side) {
          EXPECT_EQ(side, s.m <= s.n ? Side::left : Side::right);
        }
        if (type == GaLoreProjType::reverse_std_side) {
          EXPECT_EQ(side, s.m <= s.n ? Side::right : Side::left);
        }
        if (side != Side::right) {
          EXPECT_EQ(proj.left_matrix().shape(), (Shape{s.m, s.r}));
          EXPECT_LT(ortho_error(proj.left_matrix()), 1e-5);
        }
        if (side != Side::left) {
          EXPECT_EQ(proj.right_matrix().shape(), (Shape{s.n, s.r}));
          EXPECT_LT(ortho_error(proj.right_matrix()), 1e-5);
        }
        const Shape want = side == Side::left ? Shape{s.r, s.n} : side == Side::right ? Shape{s.m, s.r} : Shape{s.r, s.r};
        EXPECT_EQ(R.shape(), want);
      }
    }
  }
}

TEST(GaLoreProjector, ExactAndRandomizedAgreeOnGappedSpectrum) {
  std::mt19937 gen(2);
  const Shape2 shapes[] = {{60, 100, 8}, {100, 60, 8}, {127, 127, 12}, {40, 300, 1}};
  for (const Shape2& s : shapes) {
    const Tensor G = to_tensor(gapped(s.m, s.n, s.r, gen));
    for (GaLoreProjType type : kTypes) {
      SCOPED_TRACE(fmt::format("{}x{} r={} {}", s.m, s.n, s.r, galore_proj_type_name(type)));
      GaLoreProjector exact(opts(s.r, type, GaLoreSvd::exact));
      GaLoreProjector rnd(opts(s.r, type, GaLoreSvd::randomized));
      exact.project(G, 0);
      rnd.project(G, 0);
      if (exact.left_matrix().defined()) {
        EXPECT_LT(subspace_distance(exact.left_matrix(), rnd.left_matrix()), 1e-3);
      }
      if (exact.right_matrix().defined()) {
        EXPECT_LT(subspace_distance(exact.right_matrix(), rnd.right_matrix()), 1e-3);
      }
    }
  }
}

TEST(GaLoreProjector, WarmStartTracksSlowlyChangingGradient) {
  std::mt19937 gen(3);
  MatD g = gapped(80, 50, 6, gen);
  GaLoreProjectorOptions o = opts(6, GaLoreProjType::std_side, GaLoreSvd::randomized);
  o.update_gap = 1;
  o.power_iterations = 1;
  GaLoreProjector rnd(o);
  for (int step = 0; step < 4; ++step) {
    g += 0.01 * random_mat(80, 50, gen);
    const Tensor G = to_tensor(g);
    GaLoreProjector exact(opts(6, GaLoreProjType::std_side, GaLoreSvd::exact));
    exact.project(G, 0);
    rnd.project(G, step);
    EXPECT_TRUE(rnd.refreshed_last());
    EXPECT_LT(ortho_error(rnd.matrix()), 1e-5);
    EXPECT_LT(subspace_distance(exact.matrix(), rnd.matrix()), 1e-2) << "step " << step;
  }
}

TEST(GaLoreProjector, ProjectionsMatchFloat64Reference) {
  std::mt19937 gen(4);
  for (const Shape2& s : kShapes) {
    const MatD g = random_mat(s.m, s.n, gen);
    const Tensor G = to_tensor(g);
    const MatD gf = to_mat(G);
    for (GaLoreProjType type : kTypes) {
      for (GaLoreSvd svd : kSvds) {
        SCOPED_TRACE(fmt::format("{}x{} r={} {} {}", s.m, s.n, s.r, galore_proj_type_name(type),
                                 svd == GaLoreSvd::exact ? "exact" : "randomized"));
        GaLoreProjector proj(opts(s.r, type, svd));
        const Tensor R = proj.project(G, 0);
        const bool has_p = proj.left_matrix().defined(), has_q = proj.right_matrix().defined();
        const MatD P = has_p ? to_mat(proj.left_matrix()) : MatD(), Q = has_q ? to_mat(proj.right_matrix()) : MatD();
        MatD r_ref = gf;
        if (has_p) r_ref = P.transpose() * r_ref;
        if (has_q) r_ref = r_ref * Q;
        // f32 products of length <= 130: relative error well under 1e-5 of the largest entry.
        const double tol_r = 1e-5 * std::max(1.0, r_ref.cwiseAbs().maxCoeff());
        EXPECT_LT((to_mat(R) - r_ref).cwiseAbs().maxCoeff(), tol_r);

        Tensor N = to_tensor(random_mat(R.size(0), R.size(1), gen));
        const MatD n = to_mat(N);
        MatD back_ref = n;
        if (has_p) back_ref = P * back_ref;
        if (has_q) back_ref = back_ref * Q.transpose();
        back_ref *= 0.25;
        Tensor back = proj.project_back(N);
        ASSERT_EQ(back.shape(), (Shape{s.m, s.n}));
        const double tol_b = 1e-5 * std::max(1.0, back_ref.cwiseAbs().maxCoeff());
        EXPECT_LT((to_mat(back) - back_ref).cwiseAbs().maxCoeff(), tol_b);

        // The round trip is scale * P P^T G (Q Q^T): the orthogonal projection of G onto the subspace.
        MatD rt_ref = gf;
        if (has_p) rt_ref = P * (P.transpose() * rt_ref);
        if (has_q) rt_ref = (rt_ref * Q) * Q.transpose();
        rt_ref *= 0.25;
        const MatD rt = to_mat(proj.project_back(R));
        EXPECT_LT((rt - rt_ref).cwiseAbs().maxCoeff(), 1e-5 * std::max(1.0, rt_ref.cwiseAbs().maxCoeff()));
      }
    }
  }
}

TEST(GaLoreProjector, RefreshesExactlyEveryUpdateGap) {
  for (GaLoreSvd svd : kSvds) {
    std::mt19937 gen(5);
    GaLoreProjectorOptions o = opts(3, GaLoreProjType::std_side, svd);
    o.update_gap = 4;
    GaLoreProjector proj(o);
    Tensor prev;
    for (std::int64_t step = 0; step < 13; ++step) {
      const Tensor G = to_tensor(random_mat(12, 20, gen));  // a different gradient every step
      proj.project(G, step);
      const bool due = step % 4 == 0;
      EXPECT_EQ(proj.refreshed_last(), due) << "step " << step;
      EXPECT_EQ(proj.refresh_count(), step / 4 + 1);
      if (step > 0) {
        const double moved = (to_mat(proj.matrix()) - to_mat(prev)).cwiseAbs().maxCoeff();
        if (due) {
          EXPECT_GT(moved, 1e-3) << "step " << step;
        } else {
          EXPECT_EQ(moved, 0.0) << "step " << step;
        }
      }
      prev = proj.matrix().clone();
    }
  }
  // The first call refreshes whatever its step (as the reference implementation does).
  GaLoreProjector late(opts(2, GaLoreProjType::left, GaLoreSvd::exact));
  std::mt19937 gen(6);
  late.project(to_tensor(random_mat(5, 6, gen)), 7);
  EXPECT_TRUE(late.refreshed_last());
  late.project(to_tensor(random_mat(5, 6, gen)), 8);
  EXPECT_FALSE(late.refreshed_last());
  late.project(to_tensor(random_mat(5, 6, gen)), 10);
  EXPECT_TRUE(late.refreshed_last());
}

TEST(GaLoreProjector, SameSeedSameBasis) {
  std::mt19937 gen(7);
  const Tensor G = to_tensor(random_mat(30, 45, gen));
  GaLoreProjector a(opts(5, GaLoreProjType::full, GaLoreSvd::randomized));
  GaLoreProjector b(opts(5, GaLoreProjType::full, GaLoreSvd::randomized));
  a.project(G, 0);
  b.project(G, 0);
  EXPECT_EQ((to_mat(a.left_matrix()) - to_mat(b.left_matrix())).cwiseAbs().maxCoeff(), 0.0);
  EXPECT_EQ((to_mat(a.right_matrix()) - to_mat(b.right_matrix())).cwiseAbs().maxCoeff(), 0.0);
}

TEST(GaLoreProjector, BytesExact) {
  std::mt19937 gen(8);
  const Tensor wide = to_tensor(random_mat(30, 50, gen)), tall = to_tensor(random_mat(50, 30, gen));
  struct Case {
    GaLoreProjType type;
    const Tensor* g;
    std::size_t bytes;
  };
  const Case cases[] = {{GaLoreProjType::std_side, &wide, 4 * 30 * 4},  {GaLoreProjType::std_side, &tall, 4 * 30 * 4},
                        {GaLoreProjType::reverse_std_side, &wide, 4 * 50 * 4},
                        {GaLoreProjType::left, &tall, 4 * 50 * 4},      {GaLoreProjType::right, &tall, 4 * 30 * 4},
                        {GaLoreProjType::full, &wide, 4 * (30 + 50) * 4}};
  for (const Case& c : cases) {
    for (GaLoreSvd svd : kSvds) {
      GaLoreProjector proj(opts(4, c.type, svd));
      EXPECT_EQ(proj.bytes(), 0u);
      proj.project(*c.g, 0);
      EXPECT_EQ(proj.bytes(), c.bytes) << galore_proj_type_name(c.type);
    }
  }
}

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const std::string& p : parts) EXPECT_NE(what.find(p), std::string::npos) << what << " lacks " << p;
  }
}

TEST(GaLoreProjector, BadInputErrors) {
  expect_error([] { GaLoreProjector p(opts(0, GaLoreProjType::std_side, GaLoreSvd::exact)); }, {"GaLoreProjector", "rank"});
  expect_error([] { GaLoreProjector p(opts(-3, GaLoreProjType::std_side, GaLoreSvd::exact)); }, {"GaLoreProjector"});
  expect_error([] {
    GaLoreProjectorOptions o = opts(2, GaLoreProjType::std_side, GaLoreSvd::exact);
    o.update_gap = 0;
    GaLoreProjector p(o);
  }, {"GaLoreProjector", "update_gap"});
  expect_error([] {
    GaLoreProjector p(opts(5, GaLoreProjType::std_side, GaLoreSvd::randomized));
    p.project(zeros({4, 6}), 0);
  }, {"GaLoreProjector", "rank 5", "[4, 6]"});
  expect_error([] {
    GaLoreProjector p(opts(2, GaLoreProjType::std_side, GaLoreSvd::exact));
    p.project(zeros({2, 3, 4}), 0);
  }, {"GaLoreProjector", "2-D", "[2, 3, 4]"});
  expect_error([] {
    GaLoreProjector p(opts(2, GaLoreProjType::std_side, GaLoreSvd::exact));
    p.project(zeros({4, 6}, DType::f64), 0);
  }, {"GaLoreProjector", "f32", "[4, 6]"});
  expect_error([] {
    GaLoreProjector p(opts(2, GaLoreProjType::std_side, GaLoreSvd::exact));
    p.project(ones({4, 6}), 0);
    p.project(ones({6, 4}), 1);
  }, {"GaLoreProjector", "[4, 6]", "[6, 4]"});
  expect_error([] {
    GaLoreProjector p(opts(2, GaLoreProjType::left, GaLoreSvd::exact));
    p.project(ones({4, 6}), 0);
    p.project_back(ones({6, 2}));
  }, {"GaLoreProjector", "[2, 6]", "[6, 2]"});
  expect_error([] {
    GaLoreProjector p(opts(2, GaLoreProjType::left, GaLoreSvd::exact));
    p.project_back(ones({2, 6}));
  }, {"GaLoreProjector", "before"});
}

TEST(GaLoreProjector, NonContiguousGradient) {
  std::mt19937 gen(9);
  const Tensor G = to_tensor(random_mat(20, 12, gen));
  const Tensor Gt = G.t();  // (12, 20) view
  ASSERT_FALSE(Gt.is_contiguous());
  GaLoreProjector a(opts(4, GaLoreProjType::std_side, GaLoreSvd::exact));
  GaLoreProjector b(opts(4, GaLoreProjType::std_side, GaLoreSvd::exact));
  const Tensor ra = a.project(Gt, 0), rb = b.project(Gt.contiguous(), 0);
  EXPECT_EQ((to_mat(ra) - to_mat(rb)).cwiseAbs().maxCoeff(), 0.0);
}

}  // namespace

// ---- canonical signs -------------------------------------------------------------------------------------

namespace {

// Each column of `basis` (rows x r): the index of its largest-magnitude entry (the lowest on a tie).
std::int64_t top_row(const MatD& basis, std::int64_t c) {
  std::int64_t top = 0;
  for (std::int64_t i = 1; i < basis.rows(); ++i)
    if (std::abs(static_cast<float>(basis(i, c))) > std::abs(static_cast<float>(basis(top, c)))) top = i;
  return top;
}

}  // namespace

// A first basis has every column's largest entry positive, whatever the SVD, side or method; G and -G (whose
// singular vectors an SVD may return with either sign) give the same basis.
TEST(GaLoreProjector, AFirstBasisHasEachColumnsLargestEntryPositive) {
  std::mt19937 gen(31);
  for (const GaLoreSvd svd : kSvds)
    for (const GaLoreProjType type : {GaLoreProjType::left, GaLoreProjType::right, GaLoreProjType::full}) {
      const MatD g = gapped(30, 20, 4, gen);
      GaLoreProjector a(opts(4, type, svd)), b(opts(4, type, svd));
      (void)a.project(to_tensor(g), 0);
      (void)b.project(to_tensor(-g), 0);
      for (const Tensor* basis : {&a.left_matrix(), &a.right_matrix()}) {
        if (!basis->defined()) continue;
        const MatD p = to_mat(*basis);
        for (std::int64_t c = 0; c < p.cols(); ++c)
          EXPECT_GT(p(top_row(p, c), c), 0.0) << galore_svd_name(svd) << " " << galore_proj_type_name(type);
      }
      const Tensor& pa = type == GaLoreProjType::right ? a.right_matrix() : a.left_matrix();
      const Tensor& pb = type == GaLoreProjType::right ? b.right_matrix() : b.left_matrix();
      EXPECT_LT((to_mat(pa) - to_mat(pb)).cwiseAbs().maxCoeff(), 1e-5)
          << galore_svd_name(svd) << " " << galore_proj_type_name(type) << ": G and -G";
    }
}

// A refresh keeps every column on the side of the previous basis's same column: a projector restored with a
// basis and one restored with its negation refresh to negated bases, and each new column's dot product with
// the stored one is >= 0. So a checkpoint written before the rule aligns at its first refresh.
TEST(GaLoreProjector, ARefreshKeepsEachColumnOnThePreviousBasisSide) {
  std::mt19937 gen(32);
  const MatD g0 = gapped(24, 40, 3, gen);
  GaLoreProjector first(opts(3, GaLoreProjType::left, GaLoreSvd::exact));
  (void)first.project(to_tensor(g0), 0);
  const MatD p0 = to_mat(first.left_matrix());
  MatD flipped = p0;
  flipped.col(1) *= -1.0;  // as another SVD library might have returned it
  const MatD g1 = g0 + 0.05 * random_mat(24, 40, gen);
  const auto refreshed = [&](const MatD& stored) {
    GaLoreProjector p(opts(3, GaLoreProjType::left, GaLoreSvd::exact));
    p.restore(24, 40, to_tensor(stored), Tensor(), first.rng_state(), 1);
    (void)p.project(to_tensor(g1), 10);  // a refresh step
    EXPECT_TRUE(p.refreshed_last());
    return to_mat(p.left_matrix());
  };
  const MatD a = refreshed(p0), b = refreshed(flipped);
  for (std::int64_t c = 0; c < 3; ++c) {
    EXPECT_GE(a.col(c).dot(p0.col(c)), 0.0) << c;
    EXPECT_GE(b.col(c).dot(flipped.col(c)), 0.0) << c;
    const double sign = c == 1 ? -1.0 : 1.0;
    EXPECT_LT((a.col(c) - sign * b.col(c)).cwiseAbs().maxCoeff(), 1e-6) << c;
  }
}

// Deep Gradient Compression over dist::world(), alone and under mpirun at 2, 3 and 4 ranks: the tiny GPT trained
// with dgc:0.9 (momentum correction, local clipping, warm-up) ends with the same weights on every rank, bit for
// bit, and reports its bytes in the step metrics and the summary; the summed sparse gradient of every rank's
// own dyadic gradients (exact in f32) equals a float64 reference of the ranks' top-k and error feedback, bit
// for bit, with each rank's residual; at 0.999 a rank sends >= 100x fewer bytes than dense.
#include "memtrain/core/rng.h"
#include "memtrain/dist/communicator.h"
#include "memtrain/dist/dgc.h"
#include "memtrain/train/trainer.h"

#include "tiny_lm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

namespace mt = memtrain;
using mt::train::TrainerConfig;

namespace {

// Rank r's gradient of tensor k at step s: small integers over 16, the same on every rank that makes it.
std::vector<float> dyadic_grad(int rank, std::size_t k, int step, std::int64_t n) {
  std::mt19937 gen(static_cast<unsigned>(rank * 7919 + static_cast<int>(k) * 104729 + step * 31));
  std::uniform_int_distribution<int> d(-64, 64);
  std::vector<float> g(static_cast<std::size_t>(n));
  for (float& x : g) x = static_cast<float>(d(gen)) / 16.0f;
  return g;
}

// One rank's float64 reference of one tensor (u = m u + g, v += u; the k largest |v|, ties to the lower index).
struct Reference {
  std::vector<double> u, v;
  explicit Reference(std::int64_t n) : u(static_cast<std::size_t>(n), 0.0), v(static_cast<std::size_t>(n), 0.0) {}
  void step(const std::vector<float>& g, double m, std::int64_t k, std::vector<double>& sum) {
    for (std::size_t i = 0; i < u.size(); ++i) {
      u[i] = m * u[i] + g[i];
      v[i] += u[i];
    }
    std::vector<std::size_t> order(u.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return std::fabs(v[a]) > std::fabs(v[b]); });
    for (std::size_t j = 0; j < static_cast<std::size_t>(k); ++j) {
      sum[order[j]] += v[order[j]];
      u[order[j]] = v[order[j]] = 0.0;
    }
  }
};

}  // namespace

TEST(Dgc, EveryRankEndsWithTheSameWeightsAndReportsItsBytes) {
  auto world = mt::dist::world();
  const auto ranks = static_cast<std::int64_t>(world->size());
  TrainerConfig c = mt::test_support::short_run_config();
  c.micro_batch = 2;
  c.grad_accum = std::max<std::int64_t>(1, 8 / ranks);
  c.world_size = ranks;
  c.max_steps = 8;
  c.grad_clip = 1.0;
  c.optimizer = mt::optim::Spec::adamw({.lr = 1e-2, .weight_decay = 0.1});
  c.grad_compression = "dgc:0.9,momentum=0.5,warmup=4";
  mt::manual_seed(11);
  auto model = mt::test_support::make_tiny_lm(false);
  auto data = std::make_shared<mt::test_support::TokenDataset>(48, mt::test_support::kTinyWindow,
                                                               mt::test_support::kTinyVocab);
  mt::train::Trainer trainer(c, model, mt::test_support::tiny_lm_loss(model, false), data);
  const std::shared_ptr<mt::dist::DgcSync> dgc = mt::dist::attach_dgc(trainer, world);
  // fit(): rank 0 writes the metrics lines; the summary carries this rank's totals and the ratio.
  const mt::train::RunSummary summary = trainer.fit();
  // Every rank's memory is in the summary, rank by rank; each holds the whole optimizer state here.
  ASSERT_EQ(summary.ranks.size(), static_cast<std::size_t>(world->size()));
  for (std::size_t r = 0; r < summary.ranks.size(); ++r) {
    EXPECT_EQ(summary.ranks[r]["rank"].get<std::size_t>(), r);
    EXPECT_EQ(summary.ranks[r]["optimizer_state_bytes"].get<std::size_t>(), trainer.optimizer().state_bytes());
  }
  std::vector<double> losses;
  for (const mt::train::StepMetrics& m : trainer.history()) losses.push_back(m.loss);
  EXPECT_LT(losses.back(), losses.front());
  for (const auto& [name, p] : model->named_parameters()) {
    mt::Tensor mine = p.detach().contiguous().clone();
    mt::Tensor root = mine.clone();
    world->broadcast(root, 0);
    EXPECT_EQ(std::memcmp(mine.data_ptr(), root.data_ptr(), mine.nbytes()), 0) << name << " differs from rank 0's";
  }
  double sent = 0.0, dense = 0.0;
  for (const mt::train::StepMetrics& m : trainer.history()) {
    ASSERT_TRUE(m.grad_bytes_sent && m.grad_bytes_dense) << "step " << m.step;
    EXPECT_LT(*m.grad_bytes_sent, *m.grad_bytes_dense) << "step " << m.step;
    EXPECT_TRUE(m.to_json().contains("grad_bytes_sent"));
    sent += static_cast<double>(*m.grad_bytes_sent);
    dense += static_cast<double>(*m.grad_bytes_dense);
  }
  // The warm-up sends a quarter of each tensor first, then less.
  EXPECT_GT(*trainer.history().front().grad_bytes_sent, *trainer.history().back().grad_bytes_sent);
  EXPECT_EQ(summary.metrics.at("grad_bytes_sent_total"), sent);
  EXPECT_EQ(summary.metrics.at("grad_bytes_dense_total"), dense);
  EXPECT_DOUBLE_EQ(summary.metrics.at("grad_compression_ratio"), dense / sent);
  EXPECT_TRUE(summary.to_json().contains("grad_compression_ratio"));
  EXPECT_EQ(dgc->stats().steps, c.max_steps);
}

TEST(Dgc, TheSparseSumMatchesAFloat64ReferenceOfEveryRank) {
  auto world = mt::dist::world();
  const int ranks = world->size();
  const std::vector<std::int64_t> sizes = {300, 17, 1024};
  const double m = 0.5;
  const mt::dist::DgcOptions options{.ratio = 0.95, .momentum = m, .warmup_steps = 4};
  std::vector<mt::Tensor> params;
  for (const std::int64_t n : sizes) {
    params.push_back(mt::zeros({n}));
    params.back().set_requires_grad(true);
  }
  mt::dist::DgcSync sync(world, options);
  std::vector<std::vector<Reference>> refs(static_cast<std::size_t>(ranks));
  for (auto& r : refs)
    for (const std::int64_t n : sizes) r.emplace_back(n);
  for (int step = 0; step < 8; ++step) {
    for (std::size_t k = 0; k < params.size(); ++k) {
      const std::vector<float> g = dyadic_grad(world->rank(), k, step, sizes[k]);
      params[k].set_grad(mt::tensor(g, {sizes[k]}));
    }
    sync.begin_gradients(params, {});
    for (std::size_t k = params.size(); k-- > 0;) sync.gradient_ready(k);
    sync.finish_gradients();
    const double sparsity = mt::dist::dgc_sparsity(options, step);
    for (std::size_t k = 0; k < params.size(); ++k) {
      std::vector<double> want(static_cast<std::size_t>(sizes[k]), 0.0);
      for (int r = 0; r < ranks; ++r)
        refs[static_cast<std::size_t>(r)][k].step(dyadic_grad(r, k, step, sizes[k]), m,
                                                  mt::dist::dgc_keep_count(sizes[k], sparsity), want);
      const mt::Tensor got = params[k].grad().contiguous();
      const float* kept = sync.residual_of(k).data<float>();
      const Reference& mine = refs[static_cast<std::size_t>(world->rank())][k];
      for (std::int64_t i = 0; i < sizes[k]; ++i) {
        const auto at = static_cast<std::size_t>(i);
        ASSERT_EQ(static_cast<double>(got.data<float>()[i]), want[at])
            << "step " << step << " tensor " << k << " " << i;
        ASSERT_EQ(static_cast<double>(kept[i]), mine.v[at]) << "residual, step " << step << " tensor " << k << " " << i;
      }
    }
  }
}

TEST(Dgc, SendsAHundredTimesFewerBytesAtRatio0999) {
  auto world = mt::dist::world();
  std::vector<mt::Tensor> params;
  for (int i = 0; i < 2; ++i) {
    params.push_back(mt::zeros({256, 512}));
    params.back().set_requires_grad(true);
  }
  mt::dist::DgcSync sync(world, {.ratio = 0.999});
  mt::manual_seed(static_cast<std::uint64_t>(world->rank() + 1));
  for (mt::Tensor& p : params) p.set_grad(mt::randn(p.shape()));
  sync.begin_gradients(params, {});
  sync.finish_gradients();
  const mt::train::SyncBytes bytes = sync.last_step_bytes().value();
  EXPECT_EQ(bytes.dense, 2 * 256 * 512 * 4);
  EXPECT_EQ(bytes.sent, 2 * 132 * 8);  // ceil(0.001 * 131072) pairs per tensor
  EXPECT_GE(bytes.dense, 100 * bytes.sent);
  // Every rank's pairs landed: at most world * 132 nonzeros per tensor, at least 132.
  for (const mt::Tensor& p : params) {
    const mt::Tensor g = p.grad().contiguous();
    const auto nonzero = std::count_if(g.data<float>(), g.data<float>() + g.numel(), [](float x) { return x != 0.0f; });
    EXPECT_GE(nonzero, 132);
    EXPECT_LE(nonzero, 132 * world->size());
  }
}

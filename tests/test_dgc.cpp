// Deep Gradient Compression alone (dist/dgc.h): TrainerConfig::grad_compression parsed, round-tripped and
// refused; the sparsity warm-up; one tensor's momentum correction, top-k and error feedback against a float64
// reference (on dyadic values, whose f32 sums are exact, so the two agree bit for bit); local clipping; and the
// bytes a DgcSync sends at ratio 0.999 on tensors large enough. The ranks' exchange: tests/dist/test_dgc.cpp.
#include "memtrain/dist/data_parallel.h"
#include "memtrain/core/rng.h"
#include "memtrain/dist/dgc.h"
#include "memtrain/train/predict.h"
#include "memtrain/train/trainer.h"
#include "memtrain/train/trainer_config.h"

#include "error_text.h"
#include "tiny_lm.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace mt = memtrain;
using mt::test_support::error_of;
using mt::train::TrainerConfig;

namespace {

std::string validate_error(const std::string& spec, std::int64_t zero = 0) {
  TrainerConfig c;
  c.grad_compression = spec;
  c.zero = zero;
  c.world_size = zero > 0 ? 2 : 1;
  return error_of([&] { c.validate(); });
}

// Small integers over 16: a few steps of u = m u + g, v += u with m = 0.5 stay exact in f32.
std::vector<float> dyadic(std::mt19937& gen, std::int64_t n) {
  std::uniform_int_distribution<int> d(-64, 64);
  std::vector<float> g(static_cast<std::size_t>(n));
  for (float& x : g) x = static_cast<float>(d(gen)) / 16.0f;
  return g;
}

// The float64 reference of one tensor's step: indices of the k largest |v| (ties: lower index), sorted.
struct Reference {
  std::vector<double> u, v;
  explicit Reference(std::size_t n) : u(n, 0.0), v(n, 0.0) {}
  std::vector<std::pair<std::int64_t, double>> step(const std::vector<float>& g, double m, double scale,
                                                    std::int64_t k) {
    for (std::size_t i = 0; i < u.size(); ++i) {
      u[i] = m * u[i] + scale * g[i];
      v[i] += u[i];
    }
    std::vector<std::int64_t> order(u.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
      return std::fabs(v[static_cast<std::size_t>(a)]) > std::fabs(v[static_cast<std::size_t>(b)]);
    });
    order.resize(static_cast<std::size_t>(k));
    std::sort(order.begin(), order.end());
    std::vector<std::pair<std::int64_t, double>> sent;
    for (const std::int64_t i : order) {
      const auto at = static_cast<std::size_t>(i);
      sent.emplace_back(i, v[at]);
      u[at] = v[at] = 0.0;
    }
    return sent;
  }
};

}  // namespace

TEST(GradCompression, ParsesRoundTripsAndRefusesRatiosOutsideZeroOne) {
  EXPECT_FALSE(mt::train::parse_grad_compression("none").enabled());
  const mt::train::GradCompression c = mt::train::parse_grad_compression("dgc:0.999,momentum=0.9,warmup=40");
  EXPECT_DOUBLE_EQ(c.ratio, 0.999);
  EXPECT_DOUBLE_EQ(c.momentum, 0.9);
  EXPECT_EQ(c.warmup_steps, 40);
  TrainerConfig config;
  config.grad_compression = "dgc:0.99";
  EXPECT_EQ(TrainerConfig::from_json(config.to_json()).grad_compression, "dgc:0.99");
  EXPECT_EQ(validate_error("dgc:0.99"), "(no error)");
  for (const char* bad : {"dgc:0", "dgc:1", "dgc:1.5", "dgc:-0.5"})
    EXPECT_NE(validate_error(bad).find("outside (0, 1)"), std::string::npos) << bad << ": " << validate_error(bad);
  for (const char* bad : {"dgc:abc", "dgc:", "dgc:0.9x", "garbage", "topk:0.9", "dgc:0.9,momentum=1",
                          "dgc:0.9,warmup=-1", "dgc:0.9,warmup=2.5", "dgc:0.9,speed=3"}) {
    const std::string e = validate_error(bad);
    EXPECT_NE(e.find("grad_compression '" + std::string(bad) + "'"), std::string::npos) << bad << ": " << e;
  }
}

TEST(GradCompression, RefusesWhatItCannotCompress) {
  EXPECT_NE(validate_error("dgc:0.999", 1).find("zero 1"), std::string::npos) << validate_error("dgc:0.999", 1);
  EXPECT_NE(validate_error("dgc:0.999", 2).find("use zero 0"), std::string::npos);
  TrainerConfig c;
  c.grad_compression = "dgc:0.9";
  c.layerwise_update = true;
  EXPECT_NE(error_of([&] { c.validate(); }).find("layerwise_update"), std::string::npos);
  c.layerwise_update = false;
  c.precision = mt::amp::Precision::fp16;
  EXPECT_NE(error_of([&] { c.validate(); }).find("fp16"), std::string::npos);
  // The dense sync would silently drop the compression: it refuses, naming the one to use.
  c = mt::test_support::short_run_config();
  c.grad_compression = "dgc:0.9";
  auto model = mt::test_support::make_tiny_lm(false);
  auto data = std::make_shared<mt::test_support::TokenDataset>(16, mt::test_support::kTinyWindow,
                                                               mt::test_support::kTinyVocab);
  mt::train::Trainer trainer(c, model, mt::test_support::tiny_lm_loss(model, false), data);
  EXPECT_NE(error_of([&] { mt::dist::attach_data_parallel(trainer, mt::dist::single_process()); }).find("attach_dgc"),
            std::string::npos);
  EXPECT_NE(error_of([] { mt::dist::DgcSync(mt::dist::single_process(), {.ratio = 1.0}); }).find("outside (0, 1)"),
            std::string::npos);
}

// A plan would leave out the residuals (two f32 copies of every gradient): it refuses rather than under-predict.
TEST(GradCompression, PredictionRefusesACompressedRun) {
  TrainerConfig c = mt::test_support::short_run_config();
  c.grad_compression = "dgc:0.99";
  const mt::train::RunInputs inputs = mt::test_support::inputs_for(false);
  const std::string e = error_of([&] { mt::train::predict_memory(c, inputs); });
  EXPECT_NE(e.find("predict_memory"), std::string::npos) << e;
  EXPECT_NE(e.find("is not predicted"), std::string::npos) << e;
}

TEST(GradCompression, SparsityWarmsUpThroughThePapersStages) {
  const mt::dist::DgcOptions o{.ratio = 0.999, .warmup_steps = 8};
  const std::vector<double> want = {0.75, 0.75, 0.9375, 0.9375, 0.984375, 0.984375, 0.996, 0.996, 0.999, 0.999};
  for (std::int64_t s = 0; s < 10; ++s) EXPECT_DOUBLE_EQ(mt::dist::dgc_sparsity(o, s), want[s]) << s;
  EXPECT_DOUBLE_EQ(mt::dist::dgc_sparsity({.ratio = 0.9, .warmup_steps = 8}, 7), 0.9);  // never above the ratio
  EXPECT_EQ(mt::dist::dgc_keep_count(1000, 0.999), 1);
  EXPECT_EQ(mt::dist::dgc_keep_count(1001, 0.999), 2);
  EXPECT_EQ(mt::dist::dgc_keep_count(10, 0.999), 1);
  EXPECT_EQ(mt::dist::dgc_keep_count(100, 0.75), 25);
}

TEST(GradCompression, TopKAndErrorFeedbackMatchAFloat64Reference) {
  std::mt19937 gen(3);
  const std::int64_t n = 300, k = 7;
  for (const double m : {0.0, 0.5}) {
    std::vector<float> u(n, 0.0f), v(n, 0.0f);
    Reference ref(static_cast<std::size_t>(n));
    std::vector<double> sent_total(n, 0.0), corrected_total(n, 0.0);
    for (int step = 0; step < 8; ++step) {
      const std::vector<float> g = dyadic(gen, n);
      for (std::int64_t i = 0; i < n; ++i) corrected_total[i] += m * ref.u[i] + g[i];  // u_t before masking
      std::vector<std::int32_t> index;
      std::vector<float> value;
      mt::dist::dgc_accumulate_and_select(g.data(), u.data(), v.data(), n, m, 1.0f, k, 1000, index, value);
      const auto want = ref.step(g, m, 1.0, k);
      ASSERT_EQ(index.size(), want.size());
      for (std::size_t j = 0; j < want.size(); ++j) {
        EXPECT_EQ(index[j], 1000 + want[j].first) << "m " << m << " step " << step;
        EXPECT_EQ(static_cast<double>(value[j]), want[j].second) << "m " << m << " step " << step;
        sent_total[static_cast<std::size_t>(want[j].first)] += want[j].second;
      }
      for (std::int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(static_cast<double>(v[i]), ref.v[i]) << "residual " << i;
        ASSERT_EQ(static_cast<double>(u[i]), ref.u[i]) << "momentum " << i;
      }
    }
    // Nothing is lost: what was sent plus what is left is every momentum-corrected gradient.
    for (std::int64_t i = 0; i < n; ++i) EXPECT_EQ(sent_total[i] + v[i], corrected_total[i]) << i;
  }
}

TEST(GradCompression, AValueNotSentStaysAndIsSentOnceLargeEnough) {
  // Element 1 gets 1 per step, element 0 gets 3 once then nothing: 0 goes first, then 1 once it has grown.
  std::vector<float> u(2, 0.0f), v(2, 0.0f);
  std::vector<std::int32_t> index;
  std::vector<float> value;
  const std::vector<float> first = {3.0f, 1.0f}, later = {0.0f, 1.0f};
  mt::dist::dgc_accumulate_and_select(first.data(), u.data(), v.data(), 2, 0.0, 1.0f, 1, 0, index, value);
  EXPECT_EQ(index, std::vector<std::int32_t>({0}));
  EXPECT_EQ(v[1], 1.0f);  // kept
  mt::dist::dgc_accumulate_and_select(later.data(), u.data(), v.data(), 2, 0.0, 1.0f, 1, 0, index, value);
  EXPECT_EQ(index, std::vector<std::int32_t>({0, 1}));
  EXPECT_EQ(value, std::vector<float>({3.0f, 2.0f}));  // the unsent 1 came back with this step's 1
  EXPECT_EQ(v[0], 0.0f);
  EXPECT_EQ(v[1], 0.0f);
}

TEST(GradCompression, SendsFarFewerBytesAndClipsLocally) {
  // Three tensors of 200k elements at ratio 0.999: 200 pairs of 8 bytes each instead of 800 KB.
  std::vector<mt::Tensor> params;
  for (int i = 0; i < 3; ++i) params.push_back(mt::zeros({400, 500}));
    params.back().set_requires_grad(true);
  mt::dist::DgcSync sync(mt::dist::single_process(), {.ratio = 0.999, .clip_norm = 1.0});
  mt::manual_seed(4);
  std::vector<mt::Tensor> grads;
  double squares = 0.0;
  for (mt::Tensor& p : params) {
    grads.push_back(mt::randn(p.shape()));
    const float* g = grads.back().data<float>();
    for (std::int64_t i = 0; i < p.numel(); ++i) squares += static_cast<double>(g[i]) * g[i];
    p.set_grad(grads.back().clone());
  }
  sync.begin_gradients(params, {});
  for (std::size_t k = 0; k < params.size(); ++k) sync.gradient_ready(k);
  sync.finish_gradients();
  const mt::train::SyncBytes bytes = sync.last_step_bytes().value();
  EXPECT_EQ(bytes.dense, 3 * 200000 * 4);
  EXPECT_EQ(bytes.sent, 3 * 200 * 8);
  EXPECT_GE(bytes.dense, 100 * bytes.sent);
  // Alone (N = 1) the gradient is clipped to norm 1 before it is accumulated: sent + kept = g / |g|.
  const double scale = 1.0 / std::sqrt(squares);
  for (std::size_t k = 0; k < params.size(); ++k) {
    const float* g = grads[k].data<float>();
    const float* sent = params[k].grad().contiguous().data<float>();
    const float* kept = sync.residual_of(k).data<float>();
    std::int64_t nonzero = 0;
    for (std::int64_t i = 0; i < params[k].numel(); ++i) {
      nonzero += sent[i] != 0.0f;
      ASSERT_NEAR(sent[i] + kept[i], g[i] * scale, 1e-6 * std::fabs(g[i] * scale) + 1e-12) << k << " " << i;
    }
    EXPECT_EQ(nonzero, 200);
  }
}

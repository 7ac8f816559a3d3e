// Sampling: the draw for a uniform u must be the inverse CDF of softmax(logits / T) over the top k,
// computed here independently in float64 with a full sort.
#include "memtrain/core/error.h"
#include "memtrain/core/rng.h"
#include "memtrain/nn/generate.h"
#include "memtrain/nn/gpt.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

using namespace memtrain;

namespace {

std::int64_t reference_draw(const std::vector<float>& logits, double temperature, std::int64_t top_k, double u) {
  std::vector<std::int64_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](auto a, auto b) { return logits[a] > logits[b]; });
  const std::size_t k = top_k == 0 ? ids.size() : std::min<std::size_t>(top_k, ids.size());
  std::vector<double> p(k);
  for (std::size_t i = 0; i < k; ++i) p[i] = std::exp(static_cast<double>(logits[ids[i]]) / temperature);
  const double z = std::accumulate(p.begin(), p.end(), 0.0);
  double c = 0.0;
  for (std::size_t i = 0; i < k; ++i) {
    c += p[i] / z;
    if (c >= u) return ids[i];
  }
  return ids[k - 1];
}

}  // namespace

TEST(Sampling, InverseCdfMatchesFloat64Reference) {
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 0.1f, 1.5f, -0.3f, 2.0f, 0.0f};
  for (double temperature : {0.5, 1.0, 2.0}) {
    for (std::int64_t top_k : {0, 1, 3, 8}) {
      // Stay clear of the exact CDF boundaries, where float64 summation order could decide either way.
      for (double u = 0.0137; u < 1.0; u += 0.0311) {
        EXPECT_EQ(nn::sample_from_logits(logits.data(), 8, temperature, top_k, u),
                  reference_draw(logits, temperature, top_k, u))
            << "T=" << temperature << " k=" << top_k << " u=" << u;
      }
    }
  }
}

TEST(Sampling, TopOneIsArgmaxAndBadOptionsThrow) {
  const std::vector<float> logits = {0.5f, 3.0f, 2.0f};
  EXPECT_EQ(nn::sample_from_logits(logits.data(), 3, 1.0, 1, 0.999), 1);
  EXPECT_THROW(nn::sample_from_logits(logits.data(), 3, 0.0, 1, 0.5), Error);
  EXPECT_THROW(nn::sample_from_logits(logits.data(), 3, 1.0, -1, 0.5), Error);
}

TEST(Sampling, GeneratesFromAModelDeterministically) {
  manual_seed(3);
  nn::GPT model(nn::GPTConfig::preset("tiny"));
  auto forward = [&](const Tensor& idx) { return model.forward(idx); };
  nn::SampleOptions options{.max_new_tokens = 10, .temperature = 1.0, .top_k = 20, .seed = 7};
  const auto a = nn::sample_tokens(model, forward, 64, {1, 2, 3}, options);
  const auto b = nn::sample_tokens(model, forward, 64, {1, 2, 3}, options);
  ASSERT_EQ(a.size(), 13u);
  EXPECT_EQ(a, b);
  EXPECT_TRUE(model.is_training());  // restored
  for (auto t : a) EXPECT_LT(t, 512);
  options.seed = 8;
  EXPECT_NE(nn::sample_tokens(model, forward, 64, {1, 2, 3}, options), a);
}

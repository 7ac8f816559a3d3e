#include "memtrain/nn/generate.h"

#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/error.h"
#include "memtrain/core/philox.h"
#include "memtrain/nn/module.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace memtrain::nn {

std::int64_t sample_from_logits(const float* logits, std::int64_t vocab, double temperature, std::int64_t top_k,
                                double u) {
  MT_CHECK(vocab > 0, "sample_from_logits", "empty vocabulary");
  MT_CHECK(temperature > 0.0 && std::isfinite(temperature), "sample_from_logits",
           "temperature must be positive and finite, got {} (use top_k = 1 for greedy decoding)", temperature);
  MT_CHECK(top_k >= 0, "sample_from_logits", "top_k must be >= 0, got {}", top_k);
  const std::int64_t k = top_k == 0 ? vocab : std::min(top_k, vocab);
  std::vector<std::int64_t> order(static_cast<std::size_t>(vocab));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  // Highest logits first; ties keep the lower id first so the draw is deterministic.
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](std::int64_t a, std::int64_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  MT_CHECK(std::isfinite(logits[order[0]]), "sample_from_logits", "the largest logit is not finite ({})",
           logits[order[0]]);
  std::vector<double> weights(static_cast<std::size_t>(k));
  const double top = logits[order[0]];
  double total = 0.0;
  for (std::int64_t i = 0; i < k; ++i) {
    weights[i] = std::exp((static_cast<double>(logits[order[i]]) - top) / temperature);
    total += weights[i];
  }
  // Inverse CDF: the first token whose cumulative weight reaches u * total.
  const double target = u * total;
  double cumulative = 0.0;
  for (std::int64_t i = 0; i < k; ++i) {
    cumulative += weights[i];
    if (cumulative >= target) return order[i];
  }
  return order[k - 1];  // rounding left the target a hair above the sum
}

std::vector<std::int32_t> sample_tokens(Module& model, const std::function<Tensor(const Tensor&)>& forward,
                                        std::int64_t block_size, std::vector<std::int32_t> prompt,
                                        const SampleOptions& options) {
  MT_CHECK(!prompt.empty(), "sample_tokens", "the prompt needs at least one token");
  MT_CHECK(block_size > 0, "sample_tokens", "block_size must be positive, got {}", block_size);
  const bool was_training = model.is_training();
  model.eval();
  autograd::NoGradGuard no_grad;
  for (std::int64_t n = 0; n < options.max_new_tokens; ++n) {
    const std::int64_t T = std::min<std::int64_t>(block_size, static_cast<std::int64_t>(prompt.size()));
    std::vector<std::int64_t> window(prompt.end() - T, prompt.end());
    const Tensor logits = forward(tensor<std::int64_t>(window, {1, T})).contiguous();
    MT_CHECK(logits.dim() == 3 && logits.size(1) == T, "sample_tokens", "forward returned {} for input [1, {}]",
             shape_str(logits.shape()), T);
    const std::int64_t vocab = logits.size(2);
    const Tensor last = logits.select(1, T - 1).to(DType::f32).contiguous();
    const Philox4x32 r = philox4x32_10(static_cast<std::uint64_t>(n), 0, options.seed);
    const std::int64_t next = sample_from_logits(last.data<float>(), vocab, options.temperature, options.top_k,
                                                 uint_to_unit_float(r.v[0]));
    prompt.push_back(static_cast<std::int32_t>(next));
    if (next == options.stop_token) break;
  }
  model.train(was_training);
  return prompt;
}

}  // namespace memtrain::nn

// Autoregressive sampling from a language model: repeatedly run the model on the last block_size tokens,
// take the logits of the last position, and draw the next token from softmax(logits / temperature)
// restricted to the top_k most likely tokens. Runs under NoGrad and in eval mode (restored afterwards).
// Draws come from Philox keyed by `seed`, not from the default RNG stream, so sampling never perturbs a
// training run's random numbers.
#pragma once

#include "memtrain/core/tensor.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace memtrain::nn {

class Module;

struct SampleOptions {
  std::int64_t max_new_tokens = 64;
  double temperature = 1.0;  // > 0; 0 is refused (use top_k = 1 for greedy decoding)
  std::int64_t top_k = 40;   // 0 = the whole vocabulary
  std::uint64_t seed = 0;
  std::int64_t stop_token = -1;  // generation ends after emitting it; -1 = never
};

// `forward`: idx [1, T] i64 -> logits [1, T, V]. Returns prompt + the generated tokens.
std::vector<std::int32_t> sample_tokens(Module& model, const std::function<Tensor(const Tensor&)>& forward,
                                        std::int64_t block_size, std::vector<std::int32_t> prompt,
                                        const SampleOptions& options);

// The index drawn from softmax(logits / temperature) over the top_k entries, for a uniform draw u in (0, 1].
// Exposed so a test can check the distribution against float64 math.
std::int64_t sample_from_logits(const float* logits, std::int64_t vocab, double temperature, std::int64_t top_k,
                                double u);

}  // namespace memtrain::nn

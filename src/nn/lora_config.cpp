#include "memtrain/nn/lora_config.h"

#include "memtrain/core/error.h"

#include <cmath>

namespace memtrain::nn {

double LoraConfig::scaling() const {
  const auto r = static_cast<double>(rank);
  return rslora ? alpha / std::sqrt(r) : alpha / r;
}

void LoraConfig::validate() const {
  const char* where = "LoraConfig";
  MT_CHECK(rank >= 0, where, "rank must be >= 0 (0 = no LoRA), got {}", rank);
  MT_CHECK(std::isfinite(alpha) && (rank == 0 || alpha != 0.0), where, "alpha must be finite and non-zero, got {}",
           alpha);
  MT_CHECK(dropout >= 0.0 && dropout < 1.0, where, "dropout must be in [0, 1), got {}", dropout);
  for (const std::string& t : targets) MT_CHECK(!t.empty(), where, "targets holds an empty pattern");
}

}  // namespace memtrain::nn

// The learning-rate schedule: linear warmup, then cosine decay to a floor (or constant).
#include "memtrain/train/trainer_config.h"

#include <algorithm>
#include <numbers>
#include <cmath>

namespace memtrain::train {

double LrSchedule::lr_at(std::int64_t step, double peak_lr, std::int64_t max_steps) const {
  // Warmup counts steps from 1, so step 0 already trains (at peak / W) instead of wasting a step at lr 0.
  if (step < warmup_steps) return peak_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (decay == LrDecay::constant) return peak_lr;
  const double min_lr = peak_lr * min_lr_ratio;
  const std::int64_t span = max_steps - warmup_steps;
  if (span <= 0 || step >= max_steps) return min_lr;
  const double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(span);
  return min_lr + (peak_lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace memtrain::train

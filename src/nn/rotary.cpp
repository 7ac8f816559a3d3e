#include "memtrain/nn/rotary.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/shape.h"

#include <cmath>
#include <vector>

namespace memtrain::nn {

Tensor rotate_half(const Tensor& x) {
  MT_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, "nn::rotate_half", "needs an even last dim, got {}",
           shape_str(x.shape()));
  const std::int64_t half = x.size(-1) / 2;
  std::vector<Tensor> halves = ops::split(x, {half, half}, -1);
  return ops::concat({ops::neg(halves[1]), halves[0]}, -1);
}

RotaryEmbedding::RotaryEmbedding(std::int64_t head_dim, std::int64_t max_seq_len, double theta, DType dtype)
    : head_dim_(head_dim), max_seq_len_(max_seq_len) {
  MT_CHECK(head_dim > 0 && head_dim % 2 == 0, "nn::RotaryEmbedding", "head_dim must be positive and even, got {}",
           head_dim);
  MT_CHECK(max_seq_len > 0, "nn::RotaryEmbedding", "max_seq_len must be positive, got {}", max_seq_len);
  MT_CHECK(theta > 1.0, "nn::RotaryEmbedding", "theta must be > 1, got {}", theta);
  const std::int64_t D = head_dim, half = D / 2;
  std::vector<double> c(static_cast<std::size_t>(max_seq_len * D)), s(c.size());
  for (std::int64_t t = 0; t < max_seq_len; ++t)
    for (std::int64_t i = 0; i < half; ++i) {
      // HF: inv_freq[i] = 1 / theta^(2i / D); both halves of the row use the same frequency.
      const double angle = static_cast<double>(t) * std::pow(theta, -2.0 * static_cast<double>(i) / D);
      const auto k = static_cast<std::size_t>(t * D + i);
      c[k] = c[k + half] = std::cos(angle);
      s[k] = s[k + half] = std::sin(angle);
    }
  CategoryGuard guard(MemoryCategory::other);  // derived constants, not model state
  cos_ = from_buffer(c.data(), {max_seq_len, D}, DType::f64, dtype);
  sin_ = from_buffer(s.data(), {max_seq_len, D}, DType::f64, dtype);
}

std::pair<Tensor, Tensor> RotaryEmbedding::tables_on(Device device) const {
  if (device == cos_.device()) return {cos_, sin_};
  // The tables are derived data, not buffers, so Module::to leaves them on the CPU; each other device gets
  // its own copy once, instead of the rows in use travelling there on every call.
  std::lock_guard lock(mutex_);
  for (const auto& [c, s] : copies_)
    if (c.device() == device) return {c, s};
  CategoryGuard guard(MemoryCategory::other);
  copies_.emplace_back(cos_.to(device), sin_.to(device));
  return copies_.back();
}

Tensor RotaryEmbedding::apply(const Tensor& x) const {
  MT_CHECK(x.dim() == 4 && x.size(3) == head_dim_ && x.size(2) <= max_seq_len_, "nn::RotaryEmbedding",
           "expected x [B, H, T <= {}, {}], got {}", max_seq_len_, head_dim_, shape_str(x.shape()));
  const std::int64_t T = x.size(2);
  const auto [cos_here, sin_here] = tables_on(x.device());
  Tensor c = cos_here.slice(0, 0, T), s = sin_here.slice(0, 0, T);  // (T,D), broadcast over B and H
  if (x.dtype() != c.dtype()) {
    // Under autocast q and k arrive in the compute dtype: the rows in use are rounded to it, as HF casts
    // cos/sin to the activations' dtype (elementwise ops take one dtype).
    c = c.to(x.dtype());
    s = s.to(x.dtype());
  }
  return x * c + rotate_half(x) * s;
}

}  // namespace memtrain::nn

// Rotary position embeddings (RoPE) in the Hugging Face LLaMA convention. A head vector of size D is seen as
// two halves; element i and element i + D/2 form a pair that is rotated, at position t, by the angle
// t * theta^(-2i/D):
//   rope(x) = x * cos + rotate_half(x) * sin,     rotate_half([x1, x2]) = [-x2, x1]
// with cos/sin tables [max_seq_len, D] whose two halves repeat the same D/2 frequencies. (Meta's original
// code rotates interleaved pairs (2i, 2i+1) instead; HF permutes q_proj/k_proj rows when converting, so HF
// checkpoints load here unchanged.)
//
// The tables are computed in double and stored in the model dtype. They are derived data, neither
// parameters nor buffers, so they are not in state_dict (HF's inv_freq is a non-persistent buffer too). On
// another device than the CPU the tables are copied there once, at their first use on it, and kept (under
// MemoryCategory::other), so a step allocates the same bytes on every device.
// Applying them uses differentiable ops, so the gradient flows back through the rotation (its transpose).
#pragma once

#include "memtrain/core/dtype.h"
#include "memtrain/core/tensor.h"

#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace memtrain::nn {

// x [..., D] with D even -> [..., D]: the halves x1 = x[..., :D/2], x2 = x[..., D/2:] become [-x2, x1].
Tensor rotate_half(const Tensor& x);

class RotaryEmbedding {
 public:
  RotaryEmbedding(std::int64_t head_dim, std::int64_t max_seq_len, double theta = 10000.0, DType dtype = DType::f32);
  // x [B, H, T, D] with T <= max_seq_len (positions 0..T-1) -> [B, H, T, D].
  Tensor apply(const Tensor& x) const;
  const Tensor& cos() const { return cos_; }  // [max_seq_len, D]
  const Tensor& sin() const { return sin_; }  // [max_seq_len, D]
  std::int64_t head_dim() const { return head_dim_; }
  std::int64_t max_seq_len() const { return max_seq_len_; }

 private:
  std::int64_t head_dim_;
  std::int64_t max_seq_len_;
  Tensor cos_;
  Tensor sin_;
  // cos/sin on each other device they were used on; made at the first use there.
  std::pair<Tensor, Tensor> tables_on(Device device) const;
  mutable std::mutex mutex_;
  mutable std::vector<std::pair<Tensor, Tensor>> copies_;
};

}  // namespace memtrain::nn

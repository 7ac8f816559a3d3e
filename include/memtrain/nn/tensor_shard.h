// Which part of a tensor-parallel model (Megatron-LM) one rank holds, and the layers that hold such a part.
//
// A model built with a TensorShard of count T > 1 holds, on rank r: attention heads [r H/T, (r+1) H/T) (c_attn's
// q, k and v rows for them, c_proj's columns), the MLP's hidden units [r 4C/T, (r+1) 4C/T) (c_fc's rows, c_proj's
// columns), and rows_part(vocab) of the token embedding, which is also the tied head. Everything else (layer
// norms, wpe, the row-parallel layers' biases) is held whole by every rank. Each part has exactly the values
// that the whole model's init gives it (the same default RNG stream, advanced as for the whole model), so a
// tensor-parallel run starts where the run alone starts. The ops that join the parts are in
// nn/tensor_parallel_ops.h; the group they sum over is an nn::TensorParallelGroup, which
// dist::tensor_parallel_group makes over a dist::Communicator (the distributed layer sits above the models).
#pragma once

#include "memtrain/core/dtype.h"
#include "memtrain/core/tensor.h"

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace memtrain::nn {

class Embedding;
class Linear;

// What a split model asks of the ranks that share its layers. Every rank calls each operation together, in the
// same order.
class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // t := the sum over the ranks of t (contiguous, in place), the same bits on every rank.
  virtual void all_reduce_sum(Tensor& t) = 0;
  // all := every rank's `mine` (all ranks pass the same numel), rank by rank; both contiguous, one dtype.
  virtual void all_gather(const Tensor& mine, Tensor& all) = 0;
};

struct TensorShard {
  int rank = 0;
  int count = 1;
  std::shared_ptr<TensorParallelGroup> group;  // the ranks that share every layer; may be null when count is 1
  bool split() const { return count > 1; }
  // [begin, end) of this rank's n / count things; n must be a multiple of count (heads, the MLP's width).
  std::pair<std::int64_t, std::int64_t> even_part(std::int64_t n) const;
  // [begin, end) of this rank's rows of n: the first n % count ranks hold one row more (a vocabulary of any
  // size, GPT-2's 50257 included).
  std::pair<std::int64_t, std::int64_t> rows_part(std::int64_t n) const;
};

using Range = std::pair<std::int64_t, std::int64_t>;  // [begin, end)

// A Linear holding rows `out_ranges` (in order) and columns `in_range` of a whole [out, in] layer's weight
// (bias: the same rows when the output is split, whole when only the input is), with the values the whole
// layer's init gives them. It advances the default RNG stream exactly as building the whole layer does.
std::shared_ptr<Linear> make_linear_part(std::int64_t in, std::int64_t out, bool bias, DType dtype, double init_std,
                                         const std::vector<Range>& out_ranges, Range in_range);
// The same for rows `rows` of an Embedding(num, dim, dtype, init_std).
std::shared_ptr<Embedding> make_embedding_part(std::int64_t num, std::int64_t dim, DType dtype, Range rows,
                                               double init_std = 0.02);

// What the layers of a split model run (plain layer.forward / x when the shard is not split):
// x as a column-parallel layer's input (tensor_parallel_copy: its gradient is summed over the group), and
// a row-parallel layer's output: this rank's x W_part^T summed over the group, plus the whole bias.
Tensor column_parallel_input(const Tensor& x, const TensorShard& shard);
Tensor row_parallel_forward(const Linear& layer, const Tensor& x, const TensorShard& shard);

}  // namespace memtrain::nn

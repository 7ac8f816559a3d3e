#include "memtrain/nn/tensor_shard.h"

#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/error.h"
#include "memtrain/core/rng.h"
#include "memtrain/nn/embedding.h"
#include "memtrain/nn/linear.h"
#include "memtrain/nn/tensor_parallel_ops.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/linalg.h"

#include <algorithm>
#include <vector>

namespace memtrain::nn {

std::pair<std::int64_t, std::int64_t> TensorShard::even_part(std::int64_t n) const {
  MT_CHECK(count >= 1 && rank >= 0 && rank < count && n % count == 0, "nn::TensorShard",
           "{} cannot be split evenly over {} tensor-parallel ranks (rank {})", n, count, rank);
  const std::int64_t each = n / count;
  return {rank * each, (rank + 1) * each};
}

std::pair<std::int64_t, std::int64_t> TensorShard::rows_part(std::int64_t n) const {
  MT_CHECK(count >= 1 && rank >= 0 && rank < count && n >= count, "nn::TensorShard",
           "{} rows over {} tensor-parallel ranks (rank {}): every rank needs a row", n, count, rank);
  const std::int64_t each = n / count, extra = n % count;
  const std::int64_t begin = rank * each + std::min<std::int64_t>(rank, extra);
  return {begin, begin + each + (rank < extra ? 1 : 0)};
}

namespace {

std::int64_t length(const std::vector<Range>& ranges) {
  std::int64_t n = 0;
  for (const auto& [a, b] : ranges) n += b - a;
  return n;
}

// part := the rows `rows` and columns `cols` of normal(0, std) drawn from `state` over a whole [*, whole_cols]
// tensor of part's dtype, as init_normal_ draws it: element e of the whole uses Philox block state.offset + e / 4,
// so any run of elements can be drawn on its own (from the block it starts in).
void fill_part(Tensor part, RngState state, std::int64_t whole_cols, const std::vector<Range>& rows, Range cols,
               double std) {
  if (part.device().is_meta()) return;  // a prediction: nothing to fill
  const std::int64_t width = cols.second - cols.first;
  Tensor values = Tensor::empty(part.shape(), DType::f32, Device::cpu());
  float* out = values.data<float>();
  std::vector<float> run;
  // A run of the whole tensor's elements [first, first + n), drawn from the block it starts in.
  const auto draw = [&](std::int64_t first, std::int64_t n, float* into) {
    const std::int64_t skip = first % 4;
    run.resize(static_cast<std::size_t>(n + skip));
    cpu::fill_normal(run.data(), n + skip,
                     RngState{state.seed, state.offset + static_cast<std::uint64_t>((first - skip) / 4)});
    std::copy(run.begin() + skip, run.end(), into);
  };
  for (const auto& [begin, end] : rows) {
    if (width == whole_cols) {  // whole rows: one run
      draw(begin * whole_cols, (end - begin) * whole_cols, out);
      out += (end - begin) * whole_cols;
      continue;
    }
    for (std::int64_t r = begin; r < end; ++r, out += width) draw(r * whole_cols + cols.first, width, out);
  }
  autograd::NoGradGuard no_grad;
  part.copy_(values.to(part.device()));  // rounded to the part's dtype as randn rounds the whole
  ops::mul_(part, std);
}

// make_part() (its own draws undone: fill_part replaces them) and then the whole layer on meta, which advances
// the default stream exactly as building the whole layer does; with the state the whole layer drew from.
template <typename MakePart, typename MakeWhole>
auto part_and_stream(MakePart make_part, MakeWhole make_whole) {
  const RngState state = get_rng_state();
  decltype(make_part()) part;
  {
    RngStateGuard as_before;
    part = make_part();
  }
  {
    ParameterDeviceGuard on_meta(Device::meta());
    make_whole();
  }
  return std::pair(part, state);
}

}  // namespace

std::shared_ptr<Linear> make_linear_part(std::int64_t in, std::int64_t out, bool bias, DType dtype, double init_std,
                                         const std::vector<Range>& out_ranges, Range in_range) {
  for (const auto& [a, b] : out_ranges)
    MT_CHECK(a >= 0 && a < b && b <= out, "nn::make_linear_part", "output rows [{}, {}) outside the layer's {}", a,
             b, out);
  MT_CHECK(in_range.first >= 0 && in_range.first < in_range.second && in_range.second <= in, "nn::make_linear_part",
           "input columns [{}, {}) outside the layer's {}", in_range.first, in_range.second, in);
  auto [part, state] = part_and_stream(
      [&] {
        return std::make_shared<Linear>(in_range.second - in_range.first, length(out_ranges), bias, dtype, init_std);
      },
      [&] { const Linear whole(in, out, bias, dtype, init_std); });
  fill_part(part->weight(), state, in, out_ranges, in_range, init_std);
  return part;
}

std::shared_ptr<Embedding> make_embedding_part(std::int64_t num, std::int64_t dim, DType dtype, Range rows,
                                               double init_std) {
  MT_CHECK(rows.first >= 0 && rows.first < rows.second && rows.second <= num, "nn::make_embedding_part",
           "rows [{}, {}) outside the table's {}", rows.first, rows.second, num);
  auto [part, state] =
      part_and_stream([&] { return std::make_shared<Embedding>(rows.second - rows.first, dim, dtype, init_std); },
                      [&] { const Embedding whole(num, dim, dtype, init_std); });
  fill_part(part->weight(), state, dim, {rows}, {0, dim}, init_std);
  return part;
}

Tensor column_parallel_input(const Tensor& x, const TensorShard& shard) {
  return shard.split() ? tensor_parallel_copy(x, *shard.group) : x;
}

Tensor row_parallel_forward(const Linear& layer, const Tensor& x, const TensorShard& shard) {
  if (!shard.split()) return layer.forward(x);
  const Tensor y = tensor_parallel_sum(ops::linear(x, layer.weight()), *shard.group);
  return layer.bias().defined() ? y + layer.bias().to(y.dtype()) : y;
}

}  // namespace memtrain::nn

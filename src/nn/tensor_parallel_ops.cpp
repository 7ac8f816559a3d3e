// The tensor-parallel autograd ops (nn/tensor_parallel_ops.h). The vocabulary-parallel loss runs its per-row
// arithmetic in host loops: tensor parallelism runs on the MPI backend, whose tensors are on the CPU.
#include "memtrain/nn/tensor_parallel_ops.h"

#include "core/backend.h"
#include "memtrain/autograd/grad_mode.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/linalg.h"
#include "memtrain/ops/nn.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace memtrain::nn {

namespace {

// t summed over the group into a new contiguous tensor.
Tensor summed(const Tensor& t, TensorParallelGroup& group) {
  Tensor out = Tensor::empty(t.shape(), t.dtype(), t.device());
  out.copy_(t);
  if (out.numel() > 0) group.all_reduce_sum(out);
  return out;
}

std::int64_t index_at(const Tensor& idx, std::int64_t i) {
  return idx.dtype() == DType::i64 ? idx.data<std::int64_t>()[i] : idx.data<std::int32_t>()[i];
}

void check_cpu(const Tensor& t, const char* op, const char* what) {
  MT_CHECK(t.device().is_cpu(), op, "{} is on {}: tensor parallelism runs on the CPU (the MPI backend)", what,
           t.device().str());
}

}  // namespace

Tensor tensor_parallel_copy(const Tensor& x, TensorParallelGroup& group) {
  if (!autograd::needs_grad({&x})) return x;
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    out = x.contiguous().view(x.shape());  // x's own bytes when contiguous; only the backward differs
  }
  TensorParallelGroup* g = &group;
  autograd::record("tensor_parallel_copy", {x}, {out}, [g](const std::vector<Tensor>& grads) {
    return std::vector<Tensor>{summed(grads[0], *g)};
  });
  return out;
}

Tensor tensor_parallel_sum(const Tensor& x, TensorParallelGroup& group) {
  check_cpu(x, "tensor_parallel_sum", "x");
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    out = summed(x.contiguous(), group);
  }
  if (autograd::needs_grad({&x}))
    autograd::record("tensor_parallel_sum", {x}, {out},
                     [](const std::vector<Tensor>& grads) { return std::vector<Tensor>{grads[0]}; });
  return out;
}

Tensor vocab_parallel_embedding(const Tensor& rows, const Tensor& idx, std::int64_t first_row, std::int64_t vocab,
                                TensorParallelGroup& group) {
  const char* op = "vocab_parallel_embedding";
  MT_CHECK(rows.dim() == 2, op, "expected rows [R, C], got {}", shape_str(rows.shape()));
  MT_CHECK(idx.dtype() == DType::i64 || idx.dtype() == DType::i32, op, "indices must be i32 or i64, got {}",
           dtype_name(idx.dtype()));
  check_cpu(idx, op, "idx");
  const std::int64_t R = rows.size(0);
  // Indices outside this rank's rows look up row 0 and are zeroed by the mask, so their gradient is zero too.
  // Every rank holds the same indices, so every rank refuses a bad one alike, before any exchange.
  const Tensor in = idx.contiguous();
  Tensor local = Tensor::empty(idx.shape(), DType::i64, Device::cpu());
  Shape mask_shape = idx.shape();
  mask_shape.push_back(1);
  Tensor mask = Tensor::empty(mask_shape, DType::f32, Device::cpu());
  auto* l = local.data<std::int64_t>();
  auto* m = mask.data<float>();
  for (std::int64_t i = 0; i < in.numel(); ++i) {
    const std::int64_t v = index_at(in, i);
    MT_CHECK(v >= 0 && v < vocab, op, "index {} at position {} is outside the vocabulary [0, {})", v, i, vocab);
    const std::int64_t r = v - first_row;
    const bool mine = r >= 0 && r < R;
    l[i] = mine ? r : 0;
    m[i] = mine ? 1.0f : 0.0f;
  }
  const Tensor looked_up = ops::embedding(rows, local);
  return tensor_parallel_sum(ops::mul(looked_up, mask.to(looked_up.dtype())), group);
}

namespace {

// What the loss's forward keeps for its backward.
struct VocabParallelLossState {
  autograd::SavedTensor x, rows, targets;
  std::vector<float> lse;  // each row's log-sum-exp over the whole vocabulary
  std::int64_t first_row = 0, chunk_rows = 0, ignore_index = 0, counted = 0;
  DType x_dtype = DType::f32, rows_dtype = DType::f32;
  bool x_needs = false, rows_needs = false;
};

// The loss's products, a chunk of x's rows at a time, in f32 (backend gemm_f32: products into one workspace
// buffer, dW accumulated in place). rows not in f32 (bf16 parameters) are widened once, whole.
class ChunkProducts {
 public:
  ChunkProducts(const Tensor& x, const Tensor& rows, std::int64_t chunk_rows)
      : be_(::memtrain::detail::backend_for(x.device())), x_(x), rows_(rows.to(DType::f32)),
        buffer_(Tensor::empty({std::min(chunk_rows, x.size(0)), rows.size(0)}, DType::f32, x.device())) {}
  // x's rows [r0, r0 + n) in f32.
  Tensor x_rows(std::int64_t r0, std::int64_t n) const { return x_.narrow(0, r0, n).to(DType::f32).contiguous(); }
  // Their logits against this rank's rows: [n, R], valid until the next call.
  Tensor logits(const Tensor& xc) {
    Tensor out = buffer_.narrow(0, 0, xc.size(0));
    be_.gemm_f32(out, xc, rows_, false, true, 1.0, 0.0);
    return out;
  }
  void dx(const Tensor& out, const Tensor& dlogits) { be_.gemm_f32(out, dlogits, rows_, false, false, 1.0, 0.0); }
  void add_drows(const Tensor& drows, const Tensor& dlogits, const Tensor& xc) {
    be_.gemm_f32(drows, dlogits, xc, true, false, 1.0, 1.0);
  }

 private:
  const ::memtrain::detail::Backend& be_;
  Tensor x_, rows_, buffer_;
};

// This rank's part of each of the chunk's n rows: into part[i] the log-sum-exp over its R columns, into
// part[n + i] the target's logit where this rank holds the target's column (0 elsewhere).
void local_parts(const float* logits, std::int64_t n, std::int64_t R, const Tensor& tgt, std::int64_t r0,
                 std::int64_t first_row, float* part) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float* row = logits + i * R;
    float top = -std::numeric_limits<float>::infinity();
    for (std::int64_t j = 0; j < R; ++j) top = std::max(top, row[j]);
    double sum = 0.0;
    for (std::int64_t j = 0; j < R; ++j) sum += std::exp(static_cast<double>(row[j] - top));
    part[i] = static_cast<float>(top + std::log(sum));
    const std::int64_t t = index_at(tgt, r0 + i) - first_row;
    part[n + i] = t >= 0 && t < R ? row[t] : 0.0f;
  }
}

// d loss / d logits of the chunk, in place of its logits: softmax over the whole vocabulary (from the saved
// log-sum-exp) minus the target's one-hot, times `scale`; zero for ignored rows.
void logits_to_gradient(float* d, std::int64_t n, std::int64_t R, const VocabParallelLossState& s, const Tensor& tgt,
                        std::int64_t r0, double scale) {
  for (std::int64_t i = 0; i < n; ++i) {
    float* row = d + i * R;
    const std::int64_t target = index_at(tgt, r0 + i);
    if (target == s.ignore_index) {
      std::fill(row, row + R, 0.0f);
      continue;
    }
    const float lse = s.lse[static_cast<std::size_t>(r0 + i)];
    for (std::int64_t j = 0; j < R; ++j) row[j] = static_cast<float>(std::exp(row[j] - lse) * scale);
    const std::int64_t t = target - s.first_row;
    if (t >= 0 && t < R) row[t] -= static_cast<float>(scale);
  }
}

}  // namespace

Tensor vocab_parallel_cross_entropy(const Tensor& x, const Tensor& rows, std::int64_t first_row, std::int64_t vocab,
                                    const Tensor& targets, TensorParallelGroup& group, std::int64_t ignore_index,
                                    std::int64_t chunk_rows) {
  const char* op = "vocab_parallel_cross_entropy";
  MT_CHECK(x.dim() == 2 && rows.dim() == 2 && x.size(1) == rows.size(1) && rows.size(0) > 0, op,
           "expected x [N, C] and rows [R > 0, C], got {} and {}", shape_str(x.shape()), shape_str(rows.shape()));
  MT_CHECK(targets.dim() == 1 && targets.size(0) == x.size(0), op, "targets {} must be [N] for x {}",
           shape_str(targets.shape()), shape_str(x.shape()));
  MT_CHECK(targets.dtype() == DType::i64 || targets.dtype() == DType::i32, op, "targets must be i32 or i64, got {}",
           dtype_name(targets.dtype()));
  MT_CHECK(first_row >= 0 && first_row + rows.size(0) <= vocab, op,
           "rows [{}, {}) are not inside the vocabulary of {}", first_row, first_row + rows.size(0), vocab);
  MT_CHECK(chunk_rows > 0, op, "chunk_rows must be positive, got {}", chunk_rows);
  check_cpu(x, op, "x");
  check_cpu(rows, op, "the weight rows");
  check_cpu(targets, op, "targets");
  const std::int64_t N = x.size(0), R = rows.size(0), P = group.size();
  const Tensor tgt = targets.contiguous();
  // Every rank holds the same targets, so every rank refuses alike, before any exchange.
  for (std::int64_t i = 0; i < N; ++i) {
    const std::int64_t t = index_at(tgt, i);
    MT_CHECK(t == ignore_index || (t >= 0 && t < vocab), op, "target {} at row {} is outside [0, {})", t, i, vocab);
  }

  auto state = std::make_shared<VocabParallelLossState>();
  state->lse.assign(static_cast<std::size_t>(N), 0.0f);
  double total = 0.0;
  if (N > 0) {
    autograd::NoGradGuard no_grad;
    CategoryGuard category(MemoryCategory::workspace);
    ChunkProducts products(x, rows, chunk_rows);
    for (std::int64_t r0 = 0; r0 < N; r0 += chunk_rows) {
      const std::int64_t n = std::min(chunk_rows, N - r0);
      const Tensor logits = products.logits(products.x_rows(r0, n));
      Tensor mine = Tensor::empty({2 * n}, DType::f32, Device::cpu());
      local_parts(logits.data<float>(), n, R, tgt, r0, first_row, mine.data<float>());
      Tensor all = Tensor::empty({2 * n * P}, DType::f32, Device::cpu());
      group.all_gather(mine, all);
      const float* parts = all.data<float>();
      // The same arithmetic in the same rank order on every rank: the same bits.
      for (std::int64_t i = 0; i < n; ++i) {
        double top = -std::numeric_limits<double>::infinity(), target = 0.0;
        for (std::int64_t q = 0; q < P; ++q) top = std::max(top, static_cast<double>(parts[2 * n * q + i]));
        double sum = 0.0;
        for (std::int64_t q = 0; q < P; ++q) {
          sum += std::exp(static_cast<double>(parts[2 * n * q + i]) - top);
          target += parts[2 * n * q + n + i];
        }
        const double lse = top + std::log(sum);
        state->lse[static_cast<std::size_t>(r0 + i)] = static_cast<float>(lse);
        if (index_at(tgt, r0 + i) == ignore_index) continue;
        total += lse - target;
        ++state->counted;
      }
    }
  }
  // The mean over no rows is 0/0, as cross_entropy's.
  const double mean = state->counted > 0 ? total / static_cast<double>(state->counted)
                                         : std::numeric_limits<double>::quiet_NaN();
  Tensor loss = full({}, mean, DType::f32, Device::cpu());
  if (!autograd::needs_grad({&x, &rows})) return loss;

  state->x = autograd::SavedTensor(x);
  state->rows = autograd::SavedTensor(rows);
  state->targets = autograd::SavedTensor(tgt);
  state->first_row = first_row;
  state->chunk_rows = chunk_rows;
  state->ignore_index = ignore_index;
  state->x_dtype = x.dtype();
  state->rows_dtype = rows.dtype();
  state->x_needs = x.requires_grad();
  state->rows_needs = rows.requires_grad();
  autograd::record(op, {x, rows}, {loss}, [state](const std::vector<Tensor>& grads) {
    const Tensor x = state->x.unpack(), rows = state->rows.unpack(), tgt = state->targets.unpack();
    const std::int64_t N = x.size(0), C = x.size(1), R = rows.size(0);
    const double scale = state->counted > 0 ? grads[0].item() / static_cast<double>(state->counted) : 0.0;
    Tensor dx = state->x_needs ? zeros({N, C}, DType::f32, x.device()) : Tensor();
    Tensor drows = state->rows_needs ? zeros({R, C}, DType::f32, rows.device()) : Tensor();
    if (N > 0) {
      CategoryGuard category(MemoryCategory::workspace);
      ChunkProducts products(x, rows, state->chunk_rows);
      for (std::int64_t r0 = 0; r0 < N; r0 += state->chunk_rows) {
        const std::int64_t n = std::min(state->chunk_rows, N - r0);
        const Tensor xc = products.x_rows(r0, n);
        const Tensor dlogits = products.logits(xc);  // made d loss / d logits in place
        logits_to_gradient(dlogits.data<float>(), n, R, *state, tgt, r0, scale);
        if (dx.defined()) products.dx(dx.narrow(0, r0, n), dlogits);
        if (drows.defined()) products.add_drows(drows, dlogits, xc);
      }
    }
    return std::vector<Tensor>{dx.defined() ? dx.to(state->x_dtype) : dx,
                               drows.defined() ? drows.to(state->rows_dtype) : drows};
  });
  return loss;
}

}  // namespace memtrain::nn

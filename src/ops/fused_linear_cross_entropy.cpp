// fused_linear_cross_entropy: linear + cross-entropy walked in chunks of rows, so the [N, V] logits are
// never alive at once. Written once, over the backend's entries (src/core/backend.h), so it runs on every device:
//
//   forward, per chunk of r rows:  copy                    x rows (r, C) widened to f32 (bf16/f16 x only)
//                                  linear_forward / matmul logits (r, V) = x W^T (+ b)
//                                  cross_entropy_forward   losses, lse (r)
//   backward, per chunk:           the same logits, recomputed
//                                  cross_entropy_backward  dlogits (r, V), in place over the logits
//                                  matmul (+ copy)         dx (r, C) = dlogits W, rounded once to x's dtype
//                                  gemm_f32, beta 1        dW (V, C) += dlogits^T x
//                                  sum, binary add         db (V) += column sums of dlogits
//
// Its buffers are workspace: one (chunk, V) f32 logits buffer, for bf16/f16 x (chunk, C) f32 rows (and rows of
// dx), and with a bias gradient one (V) f32 column sum. The front-end checks the operands, and the targets once
// for every chunk (on a host copy where their data is not on the host), reduces the per-row losses on the host
// in row order, in double, as ops::cross_entropy does, and keeps only lse [N] for the backward. Reductions,
// ignore_index and the mean's count follow ops::cross_entropy exactly.
#include "memtrain/ops/fused_loss.h"

#include "core/backend.h"
#include "memtrain/autograd/node.h"
#include "memtrain/core/allocator.h"
#include "memtrain/autograd/saved_tensor.h"
#include "ops/nn_common.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace memtrain::ops {

using autograd::SavedTensor;

namespace {

constexpr const char* kOp = "fused_linear_cross_entropy";

using ::memtrain::detail::Backend;
using ::memtrain::detail::dense;
using ::memtrain::detail::workspace_on;

void check_f32(const char* what, const Tensor& t, const Tensor& x) {
  MT_CHECK(t.dtype() == DType::f32, kOp, "{} must be an f32 tensor, got {} {} on {}", what, dtype_name(t.dtype()),
           shape_str(t.shape()), t.device().str());
  detail::check_same_device(kOp, "x", x, what, t);
}

// How many of the (dense) targets are not ignore_index, after checking them against [0, V) once for every chunk,
// so that an error names this op and the target's position in [N]. Read on the host: a copy off the CPU (meta
// reads zeros: every target is class 0).
std::int64_t count_targets(const Tensor& targets, std::int64_t V, std::int64_t ignore_index) {
  const Tensor host = targets.to(Device::cpu());  // targets dense; no copy on the CPU
  const std::int64_t N = host.numel();
  std::int64_t count = 0;
  detail::dispatch_index(host.dtype(), [&](auto izero) {
    using I = decltype(izero);
    const I* tp = host.data<I>();
    detail::check_index_range(kOp, "target", tp, N, V, true, ignore_index, targets.shape());
    for (std::int64_t i = 0; i < N; ++i) count += static_cast<std::int64_t>(tp[i]) != ignore_index;
  });
  return count;
}

// The operands of a walk, dense as the primitives read them best, and its buffers (workspace, on x's device):
// the (chunk, V) f32 logits and, for bf16/f16 x, the (chunk, C) f32 rows.
class ChunkWalk {
 public:
  ChunkWalk(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& targets, std::int64_t chunk_rows)
      : be_(::memtrain::detail::backend_for(x.device())),
        x_(dense(x)),
        w_(dense(weight)),
        b_(dense(bias)),
        t_(dense(targets)),
        N_(x.size(0)),
        C_(x.size(1)),
        V_(weight.size(0)),
        chunk_(std::min(chunk_rows, N_)) {
    if (chunk_ == 0) return;
    logits_ = workspace_on(x.device(), chunk_ * V_, DType::f32);
    if (narrow()) wide_ = workspace_on(x.device(), chunk_ * C_, DType::f32);
  }

  const Backend& backend() const { return be_; }
  std::int64_t rows() const { return N_; }
  std::int64_t chunk() const { return chunk_; }
  bool narrow() const { return x_.dtype() != DType::f32; }
  const Tensor& weight() const { return w_; }
  Tensor targets(std::int64_t n0, std::int64_t r) const { return t_.narrow(0, n0, r); }

  // Rows [n0, n0 + r) of x as an f32 (r, C) matrix: x's own rows, or widened (exactly) into the rows buffer.
  Tensor rows_f32(std::int64_t n0, std::int64_t r) const {
    const Tensor rows = x_.narrow(0, n0, r);
    if (!narrow()) return rows;
    const Tensor wide = wide_.narrow(0, 0, r * C_).view({r, C_});
    be_.copy(wide, rows);
    return wide;
  }

  // logits (r, V) = x_rows W^T (+ b), in the logits buffer.
  Tensor logits(const Tensor& x_rows) const {
    const std::int64_t r = x_rows.size(0);
    const Tensor out = logits_.narrow(0, 0, r * V_).view({r, V_});
    if (b_.defined()) {
      be_.linear_forward(out, x_rows, w_, b_);
    } else {
      be_.matmul(out, x_rows, w_.t());
    }
    return out;
  }

 private:
  const Backend& be_;
  Tensor x_, w_, b_, t_;  // x (N, C), w (V, C), b (V) or undefined, t (N)
  std::int64_t N_, C_, V_, chunk_;
  Tensor logits_;  // (chunk * V) f32
  Tensor wide_;    // (chunk * C) f32; undefined for f32 x
};

// losses and lse [N] (f32, on x's device) of every row, chunk by chunk.
void fused_forward(const Tensor& losses, const Tensor& lse, const Tensor& x, const Tensor& weight, const Tensor& bias,
                   const Tensor& targets, std::int64_t ignore_index, std::int64_t chunk_rows) {
  const ChunkWalk walk(x, weight, bias, targets, chunk_rows);
  for (std::int64_t n0 = 0; n0 < walk.rows(); n0 += walk.chunk()) {
    const std::int64_t r = std::min(walk.chunk(), walk.rows() - n0);
    const Tensor logits = walk.logits(walk.rows_f32(n0, r));  // (r, V)
    // The targets were checked and counted once by count_targets.
    walk.backend().cross_entropy_forward(losses.narrow(0, n0, r), lse.narrow(0, n0, r), logits, walk.targets(n0, r),
                                         ignore_index, false);
  }
}

struct Saved {
  SavedTensor x, weight, bias, targets, lse;
};

// dx (N, C) like x, dw (V, C) and db (V) f32 (zero-filled: accumulated), each undefined when not wanted, from
// dloss: f32 [] (one scale for every row) or [N] (per row). Each chunk's logits are recomputed and turned in
// place into dlogits.
void fused_backward_walk(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dloss, const Tensor& x,
                         const Tensor& weight, const Tensor& bias, const Tensor& targets, const Tensor& lse,
                         std::int64_t ignore_index, std::int64_t chunk_rows) {
  const bool want_dx = dx.defined(), want_dw = dw.defined(), want_db = db.defined();
  if (!(want_dx || want_dw || want_db)) return;
  const ChunkWalk walk(x, weight, bias, targets, chunk_rows);
  if (walk.chunk() == 0) return;
  const Backend& be = walk.backend();
  const Device dev = x.device();
  const std::int64_t C = x.size(1), V = weight.size(0);
  const bool per_row = dloss.dim() == 1;
  // dx rows of a narrow x are computed in f32 and rounded once into dx.
  const Tensor dx_wide = want_dx && walk.narrow() ? workspace_on(dev, walk.chunk() * C, DType::f32) : Tensor();
  const Tensor db_chunk = want_db ? workspace_on(dev, V, DType::f32).view({1, V}) : Tensor();  // (1, V)
  const Tensor db_row = want_db ? db.view({1, V}) : Tensor();                                   // (1, V)
  for (std::int64_t n0 = 0; n0 < walk.rows(); n0 += walk.chunk()) {
    const std::int64_t r = std::min(walk.chunk(), walk.rows() - n0);
    const Tensor x_rows = walk.rows_f32(n0, r);  // (r, C) f32
    const Tensor dl = walk.logits(x_rows);       // (r, V): logits, then dlogits in place
    be.cross_entropy_backward(dl, per_row ? dloss.narrow(0, n0, r) : dloss, dl, walk.targets(n0, r),
                              lse.narrow(0, n0, r), ignore_index, per_row, 1);
    if (want_dx) {
      const Tensor dx_rows = dx.narrow(0, n0, r);
      const Tensor out = dx_wide.defined() ? dx_wide.narrow(0, 0, r * C).view({r, C}) : dx_rows;
      be.matmul(out, dl, walk.weight());
      if (dx_wide.defined()) be.copy(dx_rows, out);
    }
    if (want_dw) be.gemm_f32(dw, dl, x_rows, true, false, 1.0, 1.0);  // dW (V, C) += dl^T (V, r) x_rows (r, C)
    if (want_db) {
      // Scratch of this walk, whatever the backend allocates for the sum (the CPU: an f64 accumulator).
      const CategoryGuard scratch(MemoryCategory::workspace);
      be.sum(db_chunk, dl);
      be.binary(db_row, db_row, db_chunk, Backend::BinaryOp::add, 0.0, 0.0);
    }
  }
}

// Gradients of x, weight and (when defined) bias from the loss gradient g (scalar for mean/sum, [N] for
// none). Undefined where not wanted.
std::vector<Tensor> fused_backward(const Tensor& g, const Saved& s, Reduction reduction, std::int64_t ignore_index,
                                   std::int64_t count, std::int64_t chunk_rows, bool want_dx, bool want_dw,
                                   bool want_db) {
  const Tensor x = s.x.unpack(), w = s.weight.unpack(), t = s.targets.unpack(), lse = s.lse.unpack();
  const Tensor b = s.bias.defined() ? s.bias.unpack() : Tensor();
  const std::int64_t N = x.size(0), C = x.size(1), V = w.size(0);
  const Device dev = x.device();
  Tensor dloss;  // f32 on x's device: one scale [] or [N]
  if (reduction == Reduction::none) {
    MT_CHECK(g.dim() == 1 && g.size(0) == N, kOp, "loss gradient {} does not match {} rows", shape_str(g.shape()), N);
    detail::check_same_device(kOp, "x", x, "loss gradient", g);
    dloss = g.detach().to(DType::f32).contiguous();
  } else {
    MT_CHECK(g.numel() == 1, kOp, "loss gradient {} is not a scalar", shape_str(g.shape()));
    // Formed on the host in f32, on every device.
    auto scale = static_cast<float>(g.item());
    if (reduction == Reduction::mean) scale /= static_cast<float>(count);
    dloss = full({}, static_cast<double>(scale), DType::f32, dev);
  }
  const Tensor dx = want_dx ? Tensor::empty({N, C}, x.dtype(), dev) : Tensor();  // (N, C), every row written
  const Tensor dw = want_dw ? zeros({V, C}, DType::f32, dev) : Tensor();          // (V, C), accumulated
  const Tensor db = want_db ? zeros({V}, DType::f32, dev) : Tensor();             // (V), accumulated
  fused_backward_walk(dx, dw, db, dloss, x, w, b, t, lse, ignore_index, chunk_rows);
  std::vector<Tensor> grads{dx, dw};
  if (s.bias.defined()) grads.push_back(db);
  return grads;
}

}  // namespace

Tensor fused_linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& targets,
                                  Reduction reduction, std::int64_t ignore_index, std::int64_t chunk_rows) {
  detail::check_defined(kOp, x);
  detail::check_defined(kOp, weight);
  detail::check_index(kOp, "targets", targets);
  MT_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16 || x.dtype() == DType::f16, kOp,
           "x must be an f32, bf16 or f16 tensor, got {} {} on {}", dtype_name(x.dtype()), shape_str(x.shape()),
           x.device().str());
  check_f32("weight", weight, x);
  if (bias.defined()) check_f32("bias", bias, x);
  detail::check_same_device(kOp, "x", x, "targets", targets);
  MT_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), kOp,
           "expects x [N, C] and weight [V, C], got x {} and weight {}", shape_str(x.shape()),
           shape_str(weight.shape()));
  MT_CHECK(weight.size(0) > 0, kOp, "weight {} has no classes", shape_str(weight.shape()));
  MT_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)), kOp,
           "bias {} does not match weight {} (expects [V])", shape_str(bias.shape()), shape_str(weight.shape()));
  MT_CHECK(targets.dim() == 1 && targets.size(0) == x.size(0), kOp, "expects targets [N] for x {}, got {}",
           shape_str(x.shape()), shape_str(targets.shape()));
  MT_CHECK(chunk_rows > 0, kOp, "chunk_rows must be positive, got {}", chunk_rows);

  const std::int64_t N = x.size(0);
  const Device dev = x.device();
  const Tensor losses = Tensor::empty({N}, DType::f32, dev), lse = Tensor::empty({N}, DType::f32, dev);  // (N) each
  const Tensor t = dense(targets);
  const std::int64_t count = count_targets(t, weight.size(0), ignore_index);
  fused_forward(losses, lse, x, weight, bias, t, ignore_index, chunk_rows);

  Tensor out;
  if (reduction == Reduction::none) {
    out = losses;
  } else {
    const Tensor host = losses.to(Device::cpu());  // no copy on the CPU; zeros from meta
    const float* lp = host.data<float>();
    double total = 0;  // in row order, in double, as cross_entropy sums
    for (std::int64_t i = 0; i < N; ++i) total += static_cast<double>(lp[i]);
    const double v = reduction == Reduction::sum ? total
                     : count > 0                 ? total / static_cast<double>(count)
                                                 : std::numeric_limits<double>::quiet_NaN();
    out = full({}, v, DType::f32, dev);
  }

  if (autograd::needs_grad({&x, &weight, &bias})) {
    Saved s{SavedTensor(x), SavedTensor(weight), bias.defined() ? SavedTensor(bias) : SavedTensor(),
            SavedTensor(targets.detach()), SavedTensor(lse)};
    const bool want_dx = x.requires_grad(), want_dw = weight.requires_grad();
    const bool want_db = bias.defined() && bias.requires_grad();
    std::vector<Tensor> inputs{x, weight};
    if (bias.defined()) inputs.push_back(bias);
    autograd::record(kOp, inputs, {out},
                     [s, reduction, ignore_index, count, chunk_rows, want_dx, want_dw,
                      want_db](const std::vector<Tensor>& g) {
                       return fused_backward(g[0], s, reduction, ignore_index, count, chunk_rows, want_dx, want_dw,
                                             want_db);
                     });
  }
  return out;
}

std::int64_t fused_head_chunk_rows(std::int64_t vocab, std::size_t budget_bytes) {
  MT_CHECK(vocab > 0, "fused_head_chunk_rows", "vocab must be positive, got {}", vocab);
  const auto rows = static_cast<std::int64_t>(budget_bytes / (sizeof(float) * static_cast<std::size_t>(vocab)));
  return std::max<std::int64_t>(16, rows);
}

}  // namespace memtrain::ops

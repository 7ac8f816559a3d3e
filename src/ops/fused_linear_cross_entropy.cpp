// fused_linear_cross_entropy: linear + cross-entropy walked in chunks of rows, so the [N, V] logits are
// never alive at once. Written once, over the backend's entries (src/core/backend.h), so it runs on every device:
//
//   per chunk of r rows:   copy                     x rows (r, C) widened to f32 (f32 GEMMs over bf16/f16 x)
//                          linear_forward / matmul  logits (r, V) = x W^T (+ b), f32 GEMMs
//                          (copy +) gemm_f32        the same from x's dtype (narrow GEMMs under autocast: an f32
//                                                   weight cast a block of V rows at a time into a buffer)
//                          cross_entropy_forward    losses, lse (r)
//   gradients, per chunk:  cross_entropy_backward   dlogits (r, V), in place over the logits
//                          copy                     dlogits rounded to x's dtype (narrow GEMMs)
//                          matmul (+ copy)          dx (r, C) = dlogits W, rounded once to x's dtype (narrow
//                                                   GEMMs over a cast weight: summed in f32 block by block)
//                          gemm_f32, beta 1         dW (V, C) += dlogits^T x
//                          (copy, gemm_f32, copy)   the same into a bf16/f16 weight's dW, a block of V rows at a
//                                                   time: widened, accumulated in f32, rounded once per chunk
//                          sum, binary add          db (V) += column sums of dlogits
//
// The gradients run in the forward, right after each chunk's loss, when the loss's gradient was declared
// (LossGradientSeed) for a mean or sum; else in the backward, over logits recomputed chunk by chunk. Both walks
// run the same entries on the same values, so they give the same bits. Buffers are workspace, one chunk each
// (ChunkWalk). The front-end checks the operands, and the targets once for every chunk (on a host copy where
// their data is not on the host), reduces the per-row losses on the host in row order, in double, as
// ops::cross_entropy does, and keeps lse [N] for a backward that recomputes. Reductions, ignore_index and the
// mean's count follow ops::cross_entropy exactly.
#include "memtrain/ops/fused_loss.h"

#include "core/backend.h"
#include "memtrain/autograd/node.h"
#include "memtrain/core/allocator.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/ops/dispatch_modes.h"
#include "ops/nn_common.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
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
  return ::memtrain::detail::count_checked_targets(kOp, host, V, ignore_index, targets.shape());
}

// The gradients a walk makes: dx (N, C) like x, dW (V, C) in the weight's dtype and db (V) f32 (zero-filled:
// accumulated); each undefined when not wanted. A narrow weight (stored in bf16 without an f32 master) gets a
// narrow dW: the full f32 one would be twice its size.
struct Grads {
  Tensor dx, dw, db;
};

Grads allocate_grads(const Tensor& x, const Tensor& weight, bool want_dx, bool want_dw, bool want_db) {
  const std::int64_t N = x.size(0), C = x.size(1), V = weight.size(0);
  const Device dev = x.device();
  const CategoryGuard category(MemoryCategory::gradients);
  return {want_dx ? Tensor::empty({N, C}, x.dtype(), dev) : Tensor(),  // every row written
          want_dw ? zeros({V, C}, weight.dtype(), dev) : Tensor(), want_db ? zeros({V}, DType::f32, dev) : Tensor()};
}

// Rows of a narrow dW accumulated per block: 4096 x C f32 of scratch (12 MiB at C = 768).
constexpr std::int64_t kNarrowDwRows = 4096;
// Rows of an f32 weight cast at a time for narrow GEMMs: 4096 x C in x's dtype (6 MiB of bf16 at C = 768), where
// a cast of the whole weight would sit at the step's peak (73.6 MiB of gpt2-124M's wte).
constexpr std::int64_t kCastRows = 4096;

// The f32 loss gradient of every row of a mean or sum from the loss's gradient g, formed on the host in f32 on
// every device (the same float whether the forward or the backward forms it).
Tensor reduced_dloss(float g, Reduction reduction, std::int64_t count, Device dev) {
  float scale = g;
  if (reduction == Reduction::mean) scale /= static_cast<float>(count);
  return full({}, static_cast<double>(scale), DType::f32, dev);
}

// The operands of a walk, dense as the primitives read them best, and its buffers (workspace, on x's device).
// gemm_dtype is what the GEMMs read: f32, or x's narrow dtype (narrow GEMMs with f32 accumulation), from a weight
// stored in it or from an f32 weight cast a block of kCastRows rows at a time. Buffers: the (chunk, V) f32 logits,
// then as the walk needs them: for f32 GEMMs over a narrow x, the (chunk, C) f32 rows; for those and for narrow
// GEMMs over a cast weight, the (chunk, C) f32 rows of dx; for narrow GEMMs, the (chunk, V) dlogits rounded to
// x's dtype, or over a cast weight one block's (chunk, kCastRows) and the cast block of the weight; with a bias
// gradient, one (V) f32 column sum.
class ChunkWalk {
 public:
  ChunkWalk(const Tensor& x, const Tensor& weight, DType gemm_dtype, const Tensor& bias, const Tensor& targets,
            std::int64_t chunk_rows, const Grads& grads)
      : be_(::memtrain::detail::backend_for(x.device())),
        x_(dense(x)),
        w_(dense(weight)),
        b_(dense(bias)),
        t_(dense(targets)),
        gemm_dtype_(gemm_dtype),
        N_(x.size(0)),
        C_(x.size(1)),
        V_(weight.size(0)),
        chunk_(std::min(chunk_rows, N_)) {
    if (chunk_ == 0) return;
    const Device dev = x.device();
    logits_ = workspace_on(dev, chunk_ * V_, DType::f32);
    if (widened()) wide_ = workspace_on(dev, chunk_ * C_, DType::f32);
    if ((widened() || cast_blocks()) && grads.dx.defined()) dx_wide_ = workspace_on(dev, chunk_ * C_, DType::f32);
    // The dlogits in the GEMMs' dtype: a chunk's, or over a cast weight one block's (chunk x kCastRows).
    if (narrow_gemm() && (grads.dx.defined() || grads.dw.defined()))
      dl_narrow_ = workspace_on(dev, chunk_ * (cast_blocks() ? std::min(V_, kCastRows) : V_), gemm_dtype_);
    if (cast_blocks()) w_block_ = workspace_on(dev, std::min(V_, kCastRows) * C_, gemm_dtype_);
    if (grads.db.defined()) db_chunk_ = workspace_on(dev, V_, DType::f32).view({1, V_});
    if (grads.dw.defined() && grads.dw.dtype() != DType::f32)
      dw_block_ = workspace_on(dev, std::min(V_, kNarrowDwRows) * C_, DType::f32);
  }

  const Backend& backend() const { return be_; }
  std::int64_t rows() const { return N_; }
  std::int64_t chunk() const { return chunk_; }
  Tensor targets(std::int64_t n0, std::int64_t r) const { return t_.narrow(0, n0, r); }

  // Rows [n0, n0 + r) of x as the GEMMs read them: x's own rows, or widened (exactly) into the f32 rows buffer.
  Tensor gemm_rows(std::int64_t n0, std::int64_t r) const {
    const Tensor rows = x_.narrow(0, n0, r);
    if (!widened()) return rows;
    const Tensor wide = wide_.narrow(0, 0, r * C_).view({r, C_});
    be_.copy(wide, rows);
    return wide;
  }

  // logits (r, V) f32 = rows W^T (+ b), in the logits buffer.
  Tensor logits(const Tensor& rows) const {
    const std::int64_t r = rows.size(0);
    const Tensor out = logits_.narrow(0, 0, r * V_).view({r, V_});
    if (cast_blocks()) {
      for (std::int64_t v0 = 0; v0 < V_; v0 += kCastRows) {
        const std::int64_t vb = std::min(kCastRows, V_ - v0);
        const Tensor cols = out.narrow(1, v0, vb);  // rows V apart: the GEMM writes through its row stride
        if (b_.defined()) be_.copy(cols, b_.narrow(0, v0, vb).view({1, vb}).expand({r, vb}));
        be_.gemm_f32(cols, rows, cast_block(v0, vb), false, true, 1.0, b_.defined() ? 1.0 : 0.0);
      }
    } else if (narrow_gemm()) {
      if (b_.defined()) be_.copy(out, b_.view({1, V_}).expand({r, V_}));  // the bias, summed into by the GEMM
      be_.gemm_f32(out, rows, w_, false, true, 1.0, b_.defined() ? 1.0 : 0.0);
    } else if (b_.defined()) {
      be_.linear_forward(out, rows, w_, b_);
    } else {
      be_.matmul(out, rows, w_.t());
    }
    return out;
  }

  // Hands on the dlogits dl (r, V) f32 of rows [n0, n0 + r) (`rows` as gemm_rows gave them): dx rows = dl W,
  // rounded once to x's dtype; dW += dl^T rows; db += column sums of dl.
  void gradients(const Tensor& dl, std::int64_t n0, const Tensor& rows, const Grads& g) const {
    const std::int64_t r = dl.size(0);
    if (cast_blocks() && (g.dx.defined() || g.dw.defined())) {
      gradients_by_block(dl, n0, rows, g);
    } else if (g.dx.defined() || g.dw.defined()) {
      // Narrow GEMMs read dlogits rounded to x's dtype, as the backward of a narrow matmul would.
      Tensor dl_gemm = dl;
      if (narrow_gemm()) {
        dl_gemm = dl_narrow_.narrow(0, 0, r * V_).view({r, V_});
        be_.copy(dl_gemm, dl);
      }
      if (g.dx.defined()) {
        const Tensor dx_rows = g.dx.narrow(0, n0, r);
        const Tensor out = dx_wide_.defined() ? dx_wide_.narrow(0, 0, r * C_).view({r, C_}) : dx_rows;
        be_.matmul(out, dl_gemm, w_);  // narrow: summed in f32, rounded once into dx's rows
        if (dx_wide_.defined()) be_.copy(dx_rows, out);
      }
      if (g.dw.defined()) add_dw(g.dw, dl_gemm, rows);
    }
    if (g.db.defined()) {
      // Scratch of this walk, whatever the backend allocates for the sum (the CPU: an f64 accumulator).
      const CategoryGuard scratch(MemoryCategory::workspace);
      be_.sum(db_chunk_, dl);
      const Tensor db_row = g.db.view({1, V_});
      be_.binary(db_row, db_row, db_chunk_, Backend::BinaryOp::add, 0.0, 0.0);
    }
  }

 private:
  // gradients() over an f32 weight cast a block of kCastRows rows at a time: per block, the dlogits rounded to
  // the GEMMs' dtype, dx rows += dl_block W_block (summed in f32 over the blocks, rounded once), and the block's
  // rows of the f32 dW += dl_block^T rows.
  void gradients_by_block(const Tensor& dl, std::int64_t n0, const Tensor& rows, const Grads& g) const {
    const std::int64_t r = dl.size(0);
    const Tensor dx_acc = g.dx.defined() ? dx_wide_.narrow(0, 0, r * C_).view({r, C_}) : Tensor();
    for (std::int64_t v0 = 0; v0 < V_; v0 += kCastRows) {
      const std::int64_t vb = std::min(kCastRows, V_ - v0);
      const Tensor dl_block = dl_narrow_.narrow(0, 0, r * vb).view({r, vb});
      be_.copy(dl_block, dl.narrow(1, v0, vb));
      if (g.dx.defined()) be_.gemm_f32(dx_acc, dl_block, cast_block(v0, vb), false, false, 1.0, v0 == 0 ? 0.0 : 1.0);
      if (g.dw.defined()) be_.gemm_f32(g.dw.narrow(0, v0, vb), dl_block, rows, true, false, 1.0, 1.0);
    }
    if (g.dx.defined()) be_.copy(g.dx.narrow(0, n0, r), dx_acc);
  }

  // dW (V, C) += dl^T rows. A narrow dW a block of V rows at a time through the f32 block buffer: widened
  // (exactly), the chunk's products summed into it in f32, rounded once back.
  void add_dw(const Tensor& dw, const Tensor& dl, const Tensor& rows) const {
    if (dw.dtype() == DType::f32) {
      be_.gemm_f32(dw, dl, rows, true, false, 1.0, 1.0);
      return;
    }
    for (std::int64_t v0 = 0; v0 < V_; v0 += kNarrowDwRows) {
      const std::int64_t vb = std::min(kNarrowDwRows, V_ - v0);
      const Tensor acc = dw_block_.narrow(0, 0, vb * C_).view({vb, C_});
      const Tensor block = dw.narrow(0, v0, vb);
      be_.copy(acc, block);
      be_.gemm_f32(acc, dl.narrow(1, v0, vb), rows, true, false, 1.0, 1.0);
      be_.copy(block, acc);
    }
  }

  // Weight rows [v0, v0 + vb) cast to the GEMMs' dtype in the block buffer (the rounding a whole cast makes).
  Tensor cast_block(std::int64_t v0, std::int64_t vb) const {
    const Tensor block = w_block_.narrow(0, 0, vb * C_).view({vb, C_});
    be_.copy(block, w_.narrow(0, v0, vb));
    return block;
  }

  bool narrow_gemm() const { return gemm_dtype_ != DType::f32; }
  bool cast_blocks() const { return narrow_gemm() && w_.dtype() == DType::f32; }
  bool widened() const { return x_.dtype() != DType::f32 && !narrow_gemm(); }

  const Backend& be_;
  Tensor x_, w_, b_, t_;  // x (N, C), w (V, C), b (V) or undefined, t (N)
  DType gemm_dtype_;
  std::int64_t N_, C_, V_, chunk_;
  Tensor logits_;     // (chunk * V) f32
  Tensor wide_;       // (chunk * C) f32: f32 GEMMs over a narrow x; else undefined
  Tensor dx_wide_;    // (chunk * C) f32: likewise, for dx's rows
  Tensor dl_narrow_;  // (chunk * V), or (chunk * min(V, kCastRows)) over a cast weight, in x's dtype: narrow GEMMs
  Tensor db_chunk_;   // (1, V) f32: with a bias gradient
  Tensor dw_block_;   // (min(V, kNarrowDwRows) * C) f32: a narrow dW's accumulator
  Tensor w_block_;    // (min(V, kCastRows) * C) in gemm_dtype_: narrow GEMMs over an f32 weight
};

// losses and lse [N] (f32, on x's device) of every row, chunk by chunk. With dloss defined (a mean's or sum's
// f32 [] scale: the gradients in the forward), each chunk's logits become its dlogits at once, handed on into
// `grads`.
void forward_walk(const Tensor& losses, const Tensor& lse, const ChunkWalk& walk, std::int64_t ignore_index,
                  const Tensor& dloss, const Grads& grads) {
  const Backend& be = walk.backend();
  for (std::int64_t n0 = 0; n0 < walk.rows(); n0 += walk.chunk()) {
    const std::int64_t r = std::min(walk.chunk(), walk.rows() - n0);
    const Tensor rows = walk.gemm_rows(n0, r);
    const Tensor logits = walk.logits(rows);  // (r, V)
    // The targets were checked and counted once by count_targets.
    be.cross_entropy_forward(losses.narrow(0, n0, r), lse.narrow(0, n0, r), logits, walk.targets(n0, r),
                             ignore_index, false);
    if (!dloss.defined()) continue;
    be.cross_entropy_backward(logits, dloss, logits, walk.targets(n0, r), lse.narrow(0, n0, r), ignore_index, false,
                              1);
    walk.gradients(logits, n0, rows, grads);
  }
}

// The backward that recomputes: each chunk's logits again, turned in place into dlogits from dloss, f32 [] (one
// scale for every row) or [N] (per row), and handed on into `grads`.
void recompute_walk(const ChunkWalk& walk, const Tensor& dloss, const Tensor& lse, std::int64_t ignore_index,
                    const Grads& grads) {
  const Backend& be = walk.backend();
  const bool per_row = dloss.dim() == 1;
  for (std::int64_t n0 = 0; n0 < walk.rows(); n0 += walk.chunk()) {
    const std::int64_t r = std::min(walk.chunk(), walk.rows() - n0);
    const Tensor rows = walk.gemm_rows(n0, r);
    const Tensor dl = walk.logits(rows);  // (r, V): logits, then dlogits in place
    be.cross_entropy_backward(dl, per_row ? dloss.narrow(0, n0, r) : dloss, dl, walk.targets(n0, r),
                              lse.narrow(0, n0, r), ignore_index, per_row, 1);
    walk.gradients(dl, n0, rows, grads);
  }
}

thread_local bool t_narrow_gemms = false;  // a HeadGemmsInComputeDtype guard is alive

// The dtype the GEMMs read: a narrow weight's own (read as it is); x's narrow dtype under HeadGemmsInComputeDtype
// when the CastMode (autocast) computes in it and the backend multiplies it natively (the f32 weight is then
// cast a block at a time by the walk, its gradient f32); else f32.
DType gemm_dtype_for(const Tensor& x, const Tensor& weight) {
  const DType dt = x.dtype();
  if (weight.dtype() != DType::f32) return weight.dtype();
  if (!t_narrow_gemms || dt == DType::f32 || !::memtrain::detail::backend_for(x.device()).gemm_narrow_native(dt))
    return DType::f32;
  const CastMode* mode = detail::current_cast_mode();
  return mode != nullptr && mode->compute_dtype() == dt ? dt : DType::f32;
}

thread_local double t_seed = 0.0;
thread_local bool t_has_seed = false;
thread_local std::int64_t t_recomputes = 0;

// What the backward needs. The recompute reads x, the f32 weight (cast again to gemm_dtype when the forward's
// GEMMs were narrow), the bias, the targets and lse; the gradients of the forward (defined only when it made
// them, for `seed`) are handed on once and dropped.
struct Saved {
  SavedTensor x, weight, bias, targets, lse;
  DType gemm_dtype = DType::f32;
  Reduction reduction = Reduction::mean;
  std::int64_t ignore_index = -100, count = 0, chunk_rows = 0;
  bool want_dx = false, want_dw = false, want_db = false;
  float seed = 0.0f;
  std::optional<Grads> made;
};

// Gradients of x, weight and (when defined) bias from the loss gradient g (scalar for mean/sum, [N] for
// none). Undefined where not wanted.
std::vector<Tensor> fused_backward(const Tensor& g, Saved& s) {
  const Tensor x = s.x.unpack();
  const std::int64_t N = x.size(0);
  Grads grads;
  if (s.reduction == Reduction::none) {
    MT_CHECK(g.dim() == 1 && g.size(0) == N, kOp, "loss gradient {} does not match {} rows", shape_str(g.shape()), N);
    detail::check_same_device(kOp, "x", x, "loss gradient", g);
  } else {
    MT_CHECK(g.numel() == 1, kOp, "loss gradient {} is not a scalar", shape_str(g.shape()));
  }
  // A mean's or sum's gradient, read once (a host sync off the CPU). Meta reads zeros for every value: its run
  // stands for the seeded backward the forward prepared.
  const float g_scale = s.reduction == Reduction::none ? 0.0f : static_cast<float>(g.item());
  const bool seeded = s.made && (g.device().is_meta() || g_scale == s.seed);
  if (seeded) {
    grads = std::move(*s.made);
    s.made.reset();
  } else {
    s.made.reset();  // the forward's gradients were for another seed: recompute
    ++t_recomputes;
    const Tensor w = s.weight.unpack(), t = s.targets.unpack(), lse = s.lse.unpack();
    const Tensor b = s.bias.defined() ? s.bias.unpack() : Tensor();
    const Device dev = x.device();
    const Tensor dloss = s.reduction == Reduction::none
                             ? g.detach().to(DType::f32).contiguous()
                             : reduced_dloss(g_scale, s.reduction, s.count, dev);
    grads = allocate_grads(x, w, s.want_dx, s.want_dw, s.want_db);
    const ChunkWalk walk(x, w, s.gemm_dtype, b, t, s.chunk_rows, grads);  // casts w's blocks as the forward did
    if (walk.chunk() > 0) recompute_walk(walk, dloss, lse, s.ignore_index, grads);
  }
  std::vector<Tensor> out{grads.dx, grads.dw};
  if (s.bias.defined()) out.push_back(grads.db);
  return out;
}

}  // namespace

LossGradientSeed::LossGradientSeed(double seed) : previous_(t_seed), had_previous_(t_has_seed) {
  t_seed = seed;
  t_has_seed = true;
}

LossGradientSeed::~LossGradientSeed() {
  t_seed = previous_;
  t_has_seed = had_previous_;
}

HeadGemmsInComputeDtype::HeadGemmsInComputeDtype() : previous_(t_narrow_gemms) { t_narrow_gemms = true; }

HeadGemmsInComputeDtype::~HeadGemmsInComputeDtype() { t_narrow_gemms = previous_; }

std::int64_t fused_head_recomputes() { return t_recomputes; }

Tensor fused_linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& targets,
                                  Reduction reduction, std::int64_t ignore_index, std::int64_t chunk_rows) {
  detail::check_defined(kOp, x);
  detail::check_defined(kOp, weight);
  detail::check_index(kOp, "targets", targets);
  MT_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16 || x.dtype() == DType::f16, kOp,
           "x must be an f32, bf16 or f16 tensor, got {} {} on {}", dtype_name(x.dtype()), shape_str(x.shape()),
           x.device().str());
  // The weight: f32, or stored in x's narrow dtype (no f32 master), which the GEMMs then read as it is.
  MT_CHECK(weight.dtype() == DType::f32 || (weight.dtype() == x.dtype() && x.dtype() != DType::f32), kOp,
           "weight must be f32, or in x's narrow dtype ({}), got {} {} on {}", dtype_name(x.dtype()),
           dtype_name(weight.dtype()), shape_str(weight.shape()), weight.device().str());
  detail::check_same_device(kOp, "x", x, "weight", weight);
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

  const std::int64_t N = x.size(0), V = weight.size(0);
  const Device dev = x.device();
  const Tensor losses = Tensor::empty({N}, DType::f32, dev), lse = Tensor::empty({N}, DType::f32, dev);  // (N) each
  const Tensor t = dense(targets);
  const std::int64_t count = count_targets(t, V, ignore_index);
  const bool needs_grad = autograd::needs_grad({&x, &weight, &bias});
  auto s = std::make_shared<Saved>();
  s->reduction = reduction;
  s->ignore_index = ignore_index;
  s->count = count;
  s->chunk_rows = chunk_rows;
  s->want_dx = x.requires_grad();
  s->want_dw = weight.requires_grad();
  s->want_db = bias.defined() && bias.requires_grad();
  s->gemm_dtype = gemm_dtype_for(x, weight);
  // With the loss's gradient declared, the forward makes the gradients (Grads) as it goes.
  Tensor dloss;
  if (needs_grad && t_has_seed && reduction != Reduction::none) {
    s->seed = static_cast<float>(t_seed);
    s->made = allocate_grads(x, weight, s->want_dx, s->want_dw, s->want_db);
    dloss = reduced_dloss(s->seed, reduction, count, dev);
  }
  const ChunkWalk walk(x, weight, s->gemm_dtype, bias, t, chunk_rows, s->made ? *s->made : Grads{});
  forward_walk(losses, lse, walk, ignore_index, dloss, s->made ? *s->made : Grads{});

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

  if (needs_grad) {
    s->x = SavedTensor(x);
    s->weight = SavedTensor(weight);
    if (bias.defined()) s->bias = SavedTensor(bias);
    s->targets = SavedTensor(targets.detach());
    s->lse = SavedTensor(lse);
    std::vector<Tensor> inputs{x, weight};
    if (bias.defined()) inputs.push_back(bias);
    autograd::record(kOp, inputs, {out}, [s](const std::vector<Tensor>& g) { return fused_backward(g[0], *s); });
  }
  return out;
}

std::int64_t fused_head_chunk_rows(std::int64_t vocab, std::size_t budget_bytes) {
  MT_CHECK(vocab > 0, "fused_head_chunk_rows", "vocab must be positive, got {}", vocab);
  const auto rows = static_cast<std::int64_t>(budget_bytes / (sizeof(float) * static_cast<std::size_t>(vocab)));
  return std::max<std::int64_t>(16, rows);
}

}  // namespace memtrain::ops

// matmul and linear. Operands are handed to the GEMM as (pointer, transposed?, leading dim, batch stride)
// read straight from their strides, so the transposed views backward makes cost no copies.
//
// save_then_compute: both ops save their operands for backward before they run the product. Under activation
// checkpointing, a region's re-run stops as soon as its last dropped tensor is saved again; when that is the
// input of the region's last projection (GPT's mlp.proj, whose output only feeds a residual add), saving first
// means the re-run stops before that GEMM instead of after it.
#include "memtrain/ops/linalg.h"

#include "amp/autocast_state.h"
#include "cpu/gemm.h"
#include "memtrain/ckpt/checkpoint.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/cuda/cuda.h"
#include "memtrain/cuda/gemm_lt.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/reduce.h"
#include "ops/op_utils.h"

#include <algorithm>
#include <cstdint>

namespace memtrain::ops {

using autograd::needs_grad;
using autograd::record;
using autograd::SavedTensor;

namespace {

struct MatrixOperand {
  Tensor tensor;  // keeps the data alive (may be a contiguous copy)
  bool trans = false;
  std::int64_t ld = 0;
  std::int64_t batch_stride = 0;
};

// Stride between consecutive matrices when the batch dims [0, rank-2) collapse into one; -1 if they don't.
std::int64_t collapsed_batch_stride(const Tensor& t) {
  std::int64_t stride = -1, expected = -1;
  for (std::int64_t d = t.dim() - 3; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (stride == -1) {
      stride = t.stride(d);
    } else if (t.stride(d) != expected) {
      return -1;
    }
    expected = t.stride(d) * t.size(d);
  }
  return stride == -1 ? 0 : stride;
}

MatrixOperand as_operand(const Tensor& t) {
  const std::int64_t rows = t.size(-2), cols = t.size(-1);
  const std::int64_t batch = collapsed_batch_stride(t);
  // Row-major: unit column stride and rows that do not overlap; column-major (a transposed view) likewise.
  if (batch >= 0 && (t.stride(-1) == 1 || cols == 1) && (rows == 1 || t.stride(-2) >= cols)) {
    return {t, false, rows == 1 ? cols : t.stride(-2), batch};
  }
  if (batch >= 0 && (t.stride(-2) == 1 || rows == 1) && (cols == 1 || t.stride(-1) >= rows)) {
    return {t, true, cols == 1 ? rows : t.stride(-1), batch};
  }
  const Tensor c = t.detach().contiguous();
  return {c, false, cols, collapsed_batch_stride(c)};
}

// out [batch, m, n] (contiguous) = a [batch, m, k] x b [batch|1, k, n] + beta * out; compute in the kernel's
// dtype.
void gemm_cpu(const Tensor& a, const Tensor& b, Tensor& out, std::int64_t batch, double beta = 0.0) {
  const std::int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const MatrixOperand A = as_operand(a), B = as_operand(b);
  std::int64_t stride_b = b.dim() == 2 ? 0 : B.batch_stride;
  std::int64_t stride_c = m * n;
  std::int64_t rows = m;
  // One shared B (a weight, e.g. the tied LM head) and A's matrices stacked row after row: one GEMM of
  // batch * m rows instead of `batch` GEMMs that would each pack B again.
  if (batch > 1 && stride_b == 0 && !A.trans && A.batch_stride == m * A.ld) {
    rows = batch * m;
    batch = 1;
    stride_c = 0;
  }
  switch (a.dtype()) {
    case DType::f32:
      cpu::gemm_batched_f32(A.trans, B.trans, rows, n, k, 1.0f, A.tensor.data<float>(), A.ld, B.tensor.data<float>(), B.ld,
                            static_cast<float>(beta), out.data<float>(), n, batch, A.batch_stride, stride_b, stride_c);
      return;
    case DType::f64:
      cpu::gemm_batched_f64(A.trans, B.trans, rows, n, k, 1.0, A.tensor.data<double>(), A.ld, B.tensor.data<double>(),
                            B.ld, beta, out.data<double>(), n, batch, A.batch_stride, stride_b, stride_c);
      return;
    case DType::bf16:
      cpu::gemm_batched_bf16(A.trans, B.trans, rows, n, k, 1.0f, A.tensor.data<std::uint16_t>(), A.ld,
                             B.tensor.data<std::uint16_t>(), B.ld, static_cast<float>(beta), out.data<float>(), n, batch, A.batch_stride,
                             stride_b, stride_c);
      return;
    default:
      MT_CHECK(false, "matmul", "no CPU GEMM for {}", dtype_name(a.dtype()));
  }
}

bool is_narrow(DType t) { return t == DType::bf16 || t == DType::f16; }

// Narrow (bf16/f16) products on the CPU accumulate in f32, but the f32 result exists one slab of rows at a
// time (at most kNarrowSlabElements floats), each slab rounded into the narrow output: mixed precision keeps
// activations narrow to halve them, and an f32 copy of a whole [N, 4C] output (plus a separate bias add) would
// give that saving back at the forward's peak. Slabs are few and even (each GEMM call re-packs the other
// operand): GPT-2's [1024, 3072] MLP output runs as two GEMMs of 512 rows.
constexpr std::int64_t kNarrowSlabElements = std::int64_t{1} << 21;  // 8 MiB of f32

// Rows per slab: the fewest slabs of at most `limit` elements, rows split evenly, a multiple of 16 rows.
std::int64_t even_slab_rows(std::int64_t rows, std::int64_t row_elements, std::int64_t limit) {
  const std::int64_t per_slab = std::max<std::int64_t>(1, limit / std::max<std::int64_t>(row_elements, 1));
  const std::int64_t slabs = (rows + per_slab - 1) / per_slab;
  const std::int64_t even = (rows + slabs - 1) / slabs;
  return std::min(rows, std::min(per_slab, (even + 15) / 16 * 16));
}

// out [rows, n] (narrow, contiguous) = a [rows, k] x b [k, n] (+ bias [n], added to the f32 accumulator, so
// each element is rounded once). bf16 runs natively in the GEMM; f16 operands are widened (b once, a per slab).
void narrow_gemm_rows(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out) {
  const std::int64_t rows = a.size(0), n = b.size(1);
  const bool native = a.dtype() == DType::bf16;
  const Tensor bw = native ? b.detach() : b.detach().to(DType::f32);
  const Tensor bias_row = bias.defined() ? bias.detach().to(DType::f32).reshape({1, n}) : Tensor();
  const std::int64_t slab = even_slab_rows(rows, n, kNarrowSlabElements);
  const Tensor acc = Tensor::empty({slab, n}, DType::f32);
  for (std::int64_t r0 = 0; r0 < rows; r0 += slab) {
    const std::int64_t r = std::min(slab, rows - r0);
    Tensor y = acc.narrow(0, 0, r);
    if (bias_row.defined()) y.copy_(bias_row.expand({r, n}));
    const Tensor a_slab = a.detach().narrow(0, r0, r);
    gemm_cpu(native ? a_slab : a_slab.to(DType::f32), bw, y, 1, bias_row.defined() ? 1.0 : 0.0);
    out.narrow(0, r0, r).copy_(y);
  }
}

// The CUDA product (f32, bf16 or f16, accumulated in f32; f32 never on TF32). A 2-D B shared by a batch of A's
// runs as one cuBLAS GEMM over A's matrices stacked row after row (a contiguous copy of A only when its matrices
// do not stack); batched A and B run as one strided-batched cuBLASLt GEMM that reads transposed views through
// their strides, as the CPU path does.
Tensor matmul_cuda(const Tensor& a, const Tensor& b, const Shape& out_shape, std::int64_t batch) {
  Tensor out = Tensor::empty(out_shape, a.dtype(), a.device());
  const std::int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  if (out.numel() == 0) return out;
  if (k == 0) {  // an empty sum; cuBLASLt refuses k = 0
    out.fill_(0.0);
    return out;
  }
  const int device = a.device().index;
  if (b.dim() == 2) {
    MatrixOperand A = as_operand(a);
    if (batch > 1 && (A.trans || A.batch_stride != m * A.ld)) A = as_operand(a.detach().contiguous());
    const MatrixOperand B = as_operand(b);
    cuda::gemm(a.dtype(), A.trans, B.trans, batch * m, n, k, 1.0f, A.tensor.data_ptr(), A.ld, B.tensor.data_ptr(),
               B.ld, 0.0f, out.data_ptr(), n, device);
    return out;
  }
  const MatrixOperand A = as_operand(a), B = as_operand(b);
  cuda::GemmLtArgs g;
  g.a_type = g.b_type = g.c_type = a.dtype();
  g.trans_a = A.trans;
  g.trans_b = B.trans;
  g.m = m;
  g.n = n;
  g.k = k;
  g.lda = A.ld;
  g.ldb = B.ld;
  g.ldc = n;
  g.batch = batch;
  g.stride_a = A.batch_stride;
  g.stride_b = B.batch_stride;
  g.stride_c = m * n;
  cuda::gemm_lt(g, A.tensor.data_ptr(), B.tensor.data_ptr(), out.data_ptr(), device);
  return out;
}

Tensor matmul_forward(const Tensor& a, const Tensor& b) {
  detail::check_same("matmul", a, b);
  detail::check_floating("matmul", a);
  MT_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul", "operands need at least 2 dims, got {} and {}",
           shape_str(a.shape()), shape_str(b.shape()));
  MT_CHECK(a.size(-1) == b.size(-2), "matmul", "inner dimensions differ: {} x {}", shape_str(a.shape()),
           shape_str(b.shape()));
  const Shape batch_a(a.shape().begin(), a.shape().end() - 2), batch_b(b.shape().begin(), b.shape().end() - 2);
  MT_CHECK(b.dim() == 2 || batch_a == batch_b, "matmul", "batch dimensions differ: {} x {}", shape_str(a.shape()),
           shape_str(b.shape()));
  Shape out_shape = batch_a;
  out_shape.push_back(a.size(-2));
  out_shape.push_back(b.size(-1));
  const std::int64_t batch = shape_numel(batch_a);

  if (a.device().is_cuda()) return matmul_cuda(a, b, out_shape, batch);
  detail::check_cpu("matmul", a);
  if (is_narrow(a.dtype()) && b.dim() == 2 && (a.dim() == 2 || a.is_contiguous())) {
    Tensor out = Tensor::empty(out_shape, a.dtype());
    Tensor out2 = out.reshape({-1, b.size(1)});
    if (out.numel() > 0) narrow_gemm_rows(a.reshape({-1, a.size(-1)}), b, Tensor(), out2);
    return out;
  }
  const bool native = a.dtype() == DType::f32 || a.dtype() == DType::f64 || a.dtype() == DType::bf16;
  const Tensor x = native ? a : a.detach().to(DType::f32), y = native ? b : b.detach().to(DType::f32);
  const DType acc = a.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor out = Tensor::empty(out_shape, acc);
  if (out.numel() > 0) gemm_cpu(x, y, out, batch);
  return out.dtype() == a.dtype() ? out : out.to(a.dtype());
}

// linear with a bias on the CPU: the bias is written into the output rows and the GEMM adds x W^T onto them
// (beta = 1), saving the separate pass over [N, out] that add() would make (bf16/f16: slab by slab in f32, see
// narrow_gemm_rows). One node: dx = dY W, dW = dY^T x (computed straight in W's [out, in] layout), db = column
// sums of dY.
bool fused_linear_applies(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const DType t = x.dtype();
  return (t == DType::f32 || t == DType::f64 || is_narrow(t)) && weight.dtype() == t && bias.dtype() == t &&
         x.device().is_cpu() && weight.device().is_cpu() && bias.device().is_cpu() && bias.dim() == 1 &&
         bias.size(0) == weight.size(0) && x.numel() > 0;
}

Tensor fused_linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const Tensor x2 = x.reshape({-1, x.size(-1)});  // (N, in)
  const std::int64_t N = x2.size(0), out_features = weight.size(0);
  const double flops = 2.0 * static_cast<double>(N) * static_cast<double>(out_features) * static_cast<double>(x2.size(1));
  // Saved before the product: see save_then_compute at the top.
  const bool grad = needs_grad({&x2, &weight, &bias});
  const SavedTensor sx(grad && weight.requires_grad() ? x2 : Tensor());
  const SavedTensor sw(grad && x2.requires_grad() ? weight : Tensor());
  Tensor out = ckpt::detail::compute_or_replay("linear", flops, [&] {
                 Tensor y = Tensor::empty({N, out_features}, x.dtype());  // (N, out)
                 if (is_narrow(x.dtype())) {
                   narrow_gemm_rows(x2, weight.detach().t(), bias, y);
                   return std::vector<Tensor>{y};
                 }
                 y.copy_(bias.detach().reshape({1, out_features}).expand({N, out_features}));
                 gemm_cpu(x2.detach(), weight.detach().t(), y, 1, 1.0);
                 return std::vector<Tensor>{y};
               })[0];
  if (grad) {
    const bool want_db = bias.requires_grad();
    record("linear", {x2, weight, bias}, {out}, [sx, sw, want_db](const std::vector<Tensor>& g) {
      const Tensor xv = sx.unpack(), wv = sw.unpack();
      Tensor dx, dw, db;
      if (wv.defined()) dx = matmul(g[0], wv);       // (N, in)
      if (xv.defined()) dw = matmul(g[0].t(), xv);   // (out, in), the weight's layout
      if (want_db) db = sum(g[0], {0});              // (out)
      return std::vector<Tensor>{dx, dw, db};
    });
  }
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (auto c = amp::detail::autocast_to_compute({a, b})) return matmul((*c)[0], (*c)[1]);
  const double flops = 2.0 * static_cast<double>(a.numel()) * static_cast<double>(b.dim() >= 2 ? b.size(-1) : 0);
  // Saved before the product: see save_then_compute at the top.
  const bool grad = needs_grad({&a, &b});
  const SavedTensor sa(grad && b.requires_grad() ? a : Tensor()), sb(grad && a.requires_grad() ? b : Tensor());
  Tensor out = ckpt::detail::compute_or_replay("matmul", flops, [&] { return std::vector<Tensor>{matmul_forward(a, b)}; })[0];
  if (grad) {
    // A 2-D B stored transposed is a Linear weight seen through .t(): its gradient is computed as
    // (dC^T A)^T, i.e. stored in the weight's own [out, in] layout, so the .t() backward hands the weight a
    // contiguous gradient it can take over instead of copying a transposed one.
    const bool b_transposed = b.dim() == 2 && b.size(0) > 1 && b.size(1) > 1 && b.stride(0) == 1 &&
                              b.stride(1) == b.size(0);
    record("matmul", {a, b}, {out}, [sa, sb, b_shape = b.shape(), b_transposed](const std::vector<Tensor>& g) {
      const Tensor av = sa.unpack(), bv = sb.unpack();
      Tensor da, db;
      if (bv.defined()) da = matmul(g[0], bv.transpose(-1, -2));  // dA = dC B^T
      if (av.defined()) {
        if (b_shape.size() == 2 && (av.dim() > 2 || b_transposed)) {
          // B was shared across the batch: dB = sum_i A_i^T dC_i = A_flat^T dC_flat.
          const Tensor a2 = av.reshape({-1, av.size(-1)}), g2 = g[0].reshape({-1, g[0].size(-1)});
          db = b_transposed ? matmul(g2.t(), a2).t() : matmul(a2.t(), g2);
        } else {
          db = matmul(av.transpose(-1, -2), g[0]);  // dB = A^T dC
        }
      }
      return std::vector<Tensor>{da, db};
    });
  }
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  detail::check_defined("linear", x);
  detail::check_defined("linear", weight);
  if (auto y = amp::detail::autocast_linear(x, weight, bias)) return *y;
  if (auto c = amp::detail::autocast_to_compute({x, weight, bias})) return linear((*c)[0], (*c)[1], (*c)[2]);
  MT_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1), "linear",
           "input {} does not match weight {} ([out, in])", shape_str(x.shape()), shape_str(weight.shape()));
  Shape out_shape = x.shape();
  out_shape.back() = weight.size(0);
  if (bias.defined() && fused_linear_applies(x, weight, bias)) return fused_linear(x, weight, bias).reshape(out_shape);
  Tensor out = matmul(x.reshape({-1, x.size(-1)}), weight.t());
  if (bias.defined()) {
    MT_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), "linear", "bias {} does not match weight {}",
             shape_str(bias.shape()), shape_str(weight.shape()));
    out = add(out, bias);
  }
  return out.reshape(out_shape);
}

}  // namespace memtrain::ops

// matmul and linear. Operands are handed to the GEMM as (pointer, transposed?, leading dim, batch stride)
// read straight from their strides, so the transposed views backward makes cost no copies.
//
// save_then_compute: both ops save their operands for backward before they run the product. Under activation
// checkpointing, a region's re-run stops as soon as its last dropped tensor is saved again; when that is the
// input of the region's last projection (GPT's mlp.proj, whose output only feeds a residual add), saving first
// means the re-run stops before that GEMM instead of after it.
#include "memtrain/ops/linalg.h"

#include "core/backend.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/ops/dispatch_modes.h"
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
  Tensor out = Tensor::empty(out_shape, a.dtype(), a.device());
  ::memtrain::detail::backend_for(a.device()).matmul(out, a, b);
  return out;
}

// linear with a bias: the backend writes x W^T + bias in one entry (the CPU writes the bias into the output rows
// and the GEMM adds x W^T onto them; bf16/f16 slab by slab in f32), saving the separate [N, out] that add()
// would make. One node: dx = dY W, dW = dY^T x (computed straight in W's [out, in] layout), db = column
// sums of dY.
bool fused_linear_applies(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const DType t = x.dtype();
  return (t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16) && weight.dtype() == t &&
         bias.dtype() == t && weight.device() == x.device() && bias.device() == x.device() && bias.dim() == 1 &&
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
  Tensor out = detail::compute_or_replay("linear", flops, [&] {
                 Tensor y = Tensor::empty({N, out_features}, x.dtype(), x.device());  // (N, out)
                 ::memtrain::detail::backend_for(x.device()).linear_forward(y, x2, weight, bias);
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
  if (auto c = detail::cast_mode_to_compute(a, b)) return matmul((*c)[0], (*c)[1]);
  const double flops = 2.0 * static_cast<double>(a.numel()) * static_cast<double>(b.dim() >= 2 ? b.size(-1) : 0);
  // Saved before the product: see save_then_compute at the top.
  const bool grad = needs_grad({&a, &b});
  const SavedTensor sa(grad && b.requires_grad() ? a : Tensor()), sb(grad && a.requires_grad() ? b : Tensor());
  Tensor out = detail::compute_or_replay("matmul", flops, [&] { return std::vector<Tensor>{matmul_forward(a, b)}; })[0];
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
  if (auto y = detail::cast_mode_linear(x, weight, bias)) return *y;
  if (auto c = detail::cast_mode_to_compute(x, weight, bias)) return linear((*c)[0], (*c)[1], (*c)[2]);
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

// amp::fp8_linear (amp/fp8_linear.h): the FP8 linear layer, emulated on any device through its backend
// (src/core/backend.h). x is quantized before the product, outside compute_or_replay, so its codes are saved
// whether the product is computed or handed back by a checkpoint re-run. Every GEMM runs in f32 on dequantized
// copies that live only as workspace while it runs: the backend's gemm_f32 (full f32 products, no TF32), so
// every device computes the same products and they differ only in summation order. Delayed scales stay on the
// host (Fp8TensorMeta) and reach the kernels by value.
#include "memtrain/amp/fp8_linear.h"

#include "core/backend.h"
#include "memtrain/amp/fp8_state.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/ckpt/checkpoint.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"

#include <cstdint>
#include <optional>
#include <vector>

namespace memtrain::amp {

Fp8LinearMeta::Fp8LinearMeta(const DelayedScalingOptions& options)
    : input(Fp8Format::e4m3, options), weight(Fp8Format::e4m3, options), grad(Fp8Format::e5m2, options) {}

void Fp8LinearMeta::update_scales() {
  input.update_scale();
  weight.update_scale();
  grad.update_scale();
}

std::size_t Fp8LinearMeta::bytes() const { return input.bytes() + weight.bytes() + grad.bytes(); }

void Fp8LinearMeta::save(std::map<std::string, Tensor>& out, const std::string& key) const {
  input.save(out, key + ".input");
  weight.save(out, key + ".weight");
  grad.save(out, key + ".grad");
}

void Fp8LinearMeta::load(const std::map<std::string, Tensor>& in, const std::string& key) {
  Fp8LinearMeta loaded = *this;  // all three or none
  loaded.input.load(in, key + ".input");
  loaded.weight.load(in, key + ".weight");
  loaded.grad.load(in, key + ".grad");
  *this = std::move(loaded);
}

std::size_t Fp8Weight::bytes() const {
  return (codes.defined() ? codes.nbytes() : 0) + (inv_scales.defined() ? inv_scales.nbytes() : 0);
}

namespace {

constexpr const char* kOp = "fp8_linear";

// FP8 codes and the inverse scales that turn them back into values: one f32 on the host side (delayed; inv_scale
// is its value) or a tile grid on the codes' device (blockwise).
struct Quantized {
  Tensor codes;
  Tensor inv_scales;
  float inv_scale = 0.0f;
};

// A delayed inverse scale as a one-element f32 tensor on the host side of the codes' device even when the codes
// are on a GPU: the kernels take the scale by value and the host already has it, so neither side waits for the
// other. On meta it is a meta tensor, accounted where the CPU run accounts its 4 bytes.
Tensor scalar_f32(float value, Device codes_device) {
  Tensor t = Tensor::empty({1}, DType::f32, detail::backend_for(codes_device).host_side());
  t.fill_(value);
  return t;
}

// x (contiguous, f32/bf16, CPU or CUDA) in format f: with meta's scale, recording x's amax (delayed), or in 1x128
// tiles along the last dim (blockwise). Allocates in the current category.
Quantized quantize_rows(const Tensor& x, Fp8Format f, Fp8ScalingKind kind, Fp8TensorMeta* meta) {
  if (kind == Fp8ScalingKind::blockwise) {
    BlockwiseFp8 q = quantize_fp8_blockwise(x, f, Fp8Tiling::row_1x128);
    return {q.codes, q.inv_scales};
  }
  Fp8WithAmax q = quantize_fp8_with_amax(x, f, meta->scale());
  meta->record_amax(q.amax);
  // The inverse scale is saved as it was now: update_scales() may run before the backward reads it.
  const float inv = meta->inv_scale();
  return {q.codes, scalar_f32(inv, x.device()), inv};
}

// f32 values of codes, on the codes' device; tiling only matters for blockwise, inv_scale only for delayed.
Tensor dequantize(const Tensor& codes, const Tensor& inv_scales, float inv_scale, Fp8ScalingKind kind,
                  Fp8Tiling tiling) {
  if (kind == Fp8ScalingKind::delayed) return dequantize_fp8(codes, inv_scale);
  return dequantize_fp8_blockwise({codes, inv_scales, tiling});
}

// An f32 result on `device` that becomes a tensor of final_dtype: allocated in the current category when it is the
// final tensor itself, else as workspace (the conversion allocates the final one).
Tensor f32_result(const Shape& shape, DType final_dtype, Device device) {
  std::optional<CategoryGuard> workspace;
  if (final_dtype != DType::f32) workspace.emplace(MemoryCategory::workspace);
  return Tensor::empty(shape, DType::f32, device);
}

// c [m, n] = op(a) op(b) (+ c when accumulate); all contiguous f32 matrices on one device, op = transpose when
// flagged: the backend's full-f32 GEMM (never TF32, so backends differ only in summation order).
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, bool accumulate) {
  if (c.numel() == 0) return;
  detail::backend_for(c.device()).gemm_f32(c, a, b, trans_a, trans_b, 1.0, accumulate ? 1.0 : 0.0);
}

// db: column sums of g [rows, cols] (contiguous f32/bf16), accumulated in f64, in `dtype`.
Tensor column_sums(const Tensor& g, DType dtype) {
  Tensor sums = Tensor::empty({g.size(1)}, dtype, g.device());
  detail::backend_for(g.device()).column_sums(sums, g);
  return sums;
}

void check_operand(const Tensor& t, const char* op, const char* what) {
  MT_CHECK(t.defined(), op, "{} is undefined", what);
  MT_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16, op, "{} dtype {} is not supported (f32, bf16)", what,
           dtype_name(t.dtype()));
}

// The kernels and GEMMs take raw pointers of one device: every operand must be where x is.
void check_device(const Tensor& t, Device device, const char* what) {
  MT_CHECK(t.device() == device, kOp, "{} is on {}, the input on {}: all operands must be on one device", what,
           t.device().str(), device.str());
}

void check_inputs(const Tensor& x, const Tensor& weight, const Fp8Weight& wq, const Tensor& bias,
                  const Fp8Recipe& recipe, const Fp8LinearMeta* meta) {
  check_operand(x, kOp, "input");
  check_operand(weight, kOp, "weight");
  check_device(weight, x.device(), "weight");
  MT_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1), kOp,
           "input {} does not match weight {} ([out, in])", shape_str(x.shape()), shape_str(weight.shape()));
  if (bias.defined()) {
    check_operand(bias, kOp, "bias");
    check_device(bias, x.device(), "bias");
    MT_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), kOp, "bias {} does not match weight {} ([out])",
             shape_str(bias.shape()), shape_str(weight.shape()));
  }
  MT_CHECK(wq.codes.defined() && wq.inv_scales.defined(), kOp, "the FP8 weight is empty; make it with quantize_weight");
  check_device(wq.codes, x.device(), "the FP8 weight");
  // A delayed inverse scale is one f32 read by value, so it may be anywhere; a blockwise grid is read by the kernel.
  if (recipe.kind == Fp8ScalingKind::blockwise) check_device(wq.inv_scales, x.device(), "the FP8 weight's scale grid");
  MT_CHECK(wq.codes.dtype() == DType::f8_e4m3, kOp, "FP8 weight codes are {}, want f8_e4m3",
           dtype_name(wq.codes.dtype()));
  MT_CHECK(wq.codes.shape() == weight.shape(), kOp, "FP8 weight codes {} do not match weight {}",
           shape_str(wq.codes.shape()), shape_str(weight.shape()));
  MT_CHECK(wq.kind == recipe.kind, kOp, "the FP8 weight was quantized for {} scaling, the recipe is {}",
           fp8_scaling_name(wq.kind), fp8_scaling_name(recipe.kind));
  const Shape scales = recipe.kind == Fp8ScalingKind::delayed
                           ? Shape{1}
                           : Shape{fp8_scale_rows(weight.size(0), Fp8Tiling::block_128x128),
                                   fp8_scale_cols(weight.size(1))};
  MT_CHECK(wq.inv_scales.dtype() == DType::f32 && wq.inv_scales.shape() == scales, kOp,
           "FP8 weight inverse scales are {} {}, want f32 {} for {} scaling", dtype_name(wq.inv_scales.dtype()),
           shape_str(wq.inv_scales.shape()), shape_str(scales), fp8_scaling_name(recipe.kind));
  MT_CHECK(recipe.kind != Fp8ScalingKind::delayed || meta != nullptr, kOp,
           "delayed scaling needs an Fp8LinearMeta (got null)");
}

// What the backward needs besides the output gradient.
struct BackwardState {
  autograd::SavedTensor x_codes, x_inv_scales;  // only when the weight wants a gradient
  autograd::SavedTensor w_codes, w_inv_scales;  // only when x wants a gradient
  float x_inv_scale, w_inv_scale;                // delayed: the values the two scale tensors hold
  Fp8ScalingKind kind;
  Fp8LinearMeta* meta;  // delayed: the grad scale and its amax
  Shape x_shape;
  DType x_dtype, w_dtype, b_dtype;
  std::int64_t rows, in, out;
  bool want_dx, want_dw, want_db, has_bias;
};

std::vector<Tensor> fp8_linear_backward(const BackwardState& s, const Tensor& dy) {
  const Tensor g = [&] {  // (rows, out)
    CategoryGuard workspace(MemoryCategory::workspace);
    return dy.contiguous().reshape({s.rows, s.out});
  }();
  Tensor dx, dw, db;
  if (s.want_dx || s.want_dw) {
    Tensor gd;  // (rows, out), the E5M2 gradient's values
    {
      CategoryGuard workspace(MemoryCategory::workspace);
      const Quantized gq = quantize_rows(g, Fp8Format::e5m2, s.kind, s.meta ? &s.meta->grad : nullptr);
      gd = dequantize(gq.codes, gq.inv_scales, gq.inv_scale, s.kind, Fp8Tiling::row_1x128);
    }
    if (s.want_dx) {
      Tensor dx32 = f32_result({s.rows, s.in}, s.x_dtype, g.device());
      {
        CategoryGuard workspace(MemoryCategory::workspace);
        const Tensor wd =
            dequantize(s.w_codes.unpack(), s.w_inv_scales.unpack(), s.w_inv_scale, s.kind, Fp8Tiling::block_128x128);
        gemm(gd, false, wd, false, dx32, false);  // dx = g W
      }
      dx = dx32.to(s.x_dtype).reshape(s.x_shape);
    }
    if (s.want_dw) {
      Tensor dw32 = f32_result({s.out, s.in}, s.w_dtype, g.device());
      {
        CategoryGuard workspace(MemoryCategory::workspace);
        const Tensor xd =
            dequantize(s.x_codes.unpack(), s.x_inv_scales.unpack(), s.x_inv_scale, s.kind, Fp8Tiling::row_1x128);
        gemm(gd, true, xd, false, dw32, false);  // dW = g^T x, in the weight's [out, in] layout
      }
      dw = dw32.to(s.w_dtype);
    }
  }
  if (s.want_db) db = column_sums(g, s.b_dtype);
  std::vector<Tensor> grads{dx, dw};
  if (s.has_bias) grads.push_back(db);
  return grads;
}

}  // namespace

Fp8Weight quantize_weight(const Tensor& weight, const Fp8Recipe& recipe, Fp8LinearMeta* meta) {
  constexpr const char* op = "amp::quantize_weight";
  check_operand(weight, op, "weight");
  MT_CHECK(weight.dim() == 2, op, "weight must be [out, in], got {}", shape_str(weight.shape()));
  const Tensor w = weight.detach();
  if (recipe.kind == Fp8ScalingKind::blockwise) {
    BlockwiseFp8 q = quantize_fp8_blockwise(w, Fp8Format::e4m3, Fp8Tiling::block_128x128);
    return {q.codes, q.inv_scales, Fp8ScalingKind::blockwise};
  }
  MT_CHECK(meta != nullptr, op, "delayed scaling needs an Fp8LinearMeta (got null)");
  Fp8WithAmax q = quantize_fp8_with_amax(w, Fp8Format::e4m3, meta->weight.scale());
  meta->weight.record_amax(q.amax);
  const float inv = meta->weight.inv_scale();
  return {q.codes, scalar_f32(inv, w.device()), Fp8ScalingKind::delayed, inv};
}

Tensor quantize_weight_codes_again(const Tensor& weight, const Fp8Recipe& recipe, float delayed_scale) {
  const Tensor w = weight.detach();
  if (recipe.kind == Fp8ScalingKind::blockwise)
    return quantize_fp8_blockwise(w, Fp8Format::e4m3, Fp8Tiling::block_128x128).codes;
  return quantize_fp8_with_amax(w, Fp8Format::e4m3, delayed_scale).codes;
}

Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Fp8Weight& wq, const Tensor& bias,
                  const Fp8Recipe& recipe, Fp8LinearMeta* meta) {
  check_inputs(x, weight, wq, bias, recipe, meta);
  const std::int64_t in = weight.size(1), out = weight.size(0);
  const Shape lead(x.shape().begin(), x.shape().end() - 1);
  const std::int64_t rows = shape_numel(lead);
  Shape out_shape = lead;
  out_shape.push_back(out);

  const Tensor x2 = [&] {  // (rows, in); a copy only when x is strided
    CategoryGuard workspace(MemoryCategory::workspace);
    return x.detach().contiguous().reshape({rows, in});
  }();
  const Quantized xq = quantize_rows(x2, Fp8Format::e4m3, recipe.kind, meta ? &meta->input : nullptr);

  // Saved before the product, so a checkpoint re-run that only needs these codes again stops before it.
  const bool grad = autograd::needs_grad({&x, &weight, &bias});
  const bool want_dx = grad && x.requires_grad(), want_dw = grad && weight.requires_grad();
  BackwardState s{autograd::SavedTensor(want_dw ? xq.codes : Tensor()),
                  autograd::SavedTensor(want_dw ? xq.inv_scales : Tensor()),
                  autograd::SavedTensor(want_dx ? wq.codes : Tensor()),
                  autograd::SavedTensor(want_dx ? wq.inv_scales : Tensor()),
                  xq.inv_scale,
                  wq.inv_scale,
                  recipe.kind,
                  meta,
                  x.shape(),
                  x.dtype(),
                  weight.dtype(),
                  bias.defined() ? bias.dtype() : DType::f32,
                  rows,
                  in,
                  out,
                  want_dx,
                  want_dw,
                  grad && bias.defined() && bias.requires_grad(),
                  bias.defined()};
  const double flops = 2.0 * static_cast<double>(rows) * static_cast<double>(out) * static_cast<double>(in);
  const Tensor y = ckpt::detail::compute_or_replay("linear", flops, [&] {
                     Tensor y32 = f32_result({rows, out}, x.dtype(), x.device());  // (rows, out)
                     if (bias.defined()) {
                       // A bias of another dtype is converted through a temporary: workspace, not the output's.
                       CategoryGuard workspace(MemoryCategory::workspace);
                       y32.copy_(bias.detach().reshape({1, out}).expand({rows, out}));
                     }
                     {
                       CategoryGuard workspace(MemoryCategory::workspace);
                       const Tensor xd =
                           dequantize(xq.codes, xq.inv_scales, xq.inv_scale, recipe.kind, Fp8Tiling::row_1x128);
                       const Tensor wd =
                           dequantize(wq.codes, wq.inv_scales, wq.inv_scale, recipe.kind, Fp8Tiling::block_128x128);
                       gemm(xd, false, wd, true, y32, bias.defined());  // y = x W^T (+ b)
                     }
                     return std::vector<Tensor>{y32.to(x.dtype())};
                   })[0].reshape(out_shape);

  if (grad) {
    std::vector<Tensor> inputs{x, weight};
    if (bias.defined()) inputs.push_back(bias);
    autograd::record(kOp, inputs, {y}, [s = std::move(s)](const std::vector<Tensor>& g) {
      return fp8_linear_backward(s, g[0]);
    });
  }
  return y;
}

}  // namespace memtrain::amp

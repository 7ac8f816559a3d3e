// FP8 linear layer (emulated exactly on the CPU): y = x W^T + b with x and W quantized to E4M3 in the forward
// and the output gradient quantized to E5M2 in the backward; the products are computed in f32 from the
// dequantized values (FP8 values times f32 scales are exact in f32), so a GPU FP8 GEMM gives the same result up
// to summation order.
//
// Devices: all operands on the CPU, or all on one CUDA device. On CUDA, the same emulation runs on the device
// (the quantizers of cuda/convert.h, dequantized f32 workspace, cuda::gemm in full f32 without TF32, column sums
// by cuda::sum_dim), so it equals the CPU result up to summation order; FP8 tensor-core GEMMs are a later step.
// Delayed scales stay on the host: each call reads this step's amaxes back from the device (one wait per
// quantized tensor).
//
// Memory, the point of FP8 here: backward keeps x as FP8 codes plus scales (1 byte per element instead of 2 for
// bf16) and the weight as its FP8 copy (the compute copy of the weights is FP8, not bf16); neither x nor a
// dequantized copy is saved. The established FP8 stacks keep high-precision copies as well, so their peak
// memory does not fall.
//
// Scaling (Fp8Recipe.kind):
//   delayed    per-tensor scales from Fp8LinearMeta (amax histories of the input, the weight and the output
//              gradient: Transformer Engine's DelayedScaling); each call records this step's amaxes, and
//              Fp8LinearMeta::update_scales() after the optimizer step turns them into the next scales.
//   blockwise  current scales: x in 1x128 tiles along in_features (one scale per row per 128 columns), W in
//              128x128 blocks, the output gradient in 1x128 tiles along out_features (DeepSeek-V3); no state.
#pragma once

#include "memtrain/amp/fp8.h"
#include "memtrain/core/tensor.h"

#include <cstddef>

namespace memtrain::amp {

struct Fp8Recipe {
  Fp8ScalingKind kind = Fp8ScalingKind::blockwise;
  DelayedScalingOptions delayed;  // used by kind == delayed
};

// Delayed-scaling state of one linear layer: input and weight in E4M3, output gradient in E5M2.
struct Fp8LinearMeta {
  explicit Fp8LinearMeta(const DelayedScalingOptions& options = {});
  Fp8TensorMeta input, weight, grad;
  void update_scales();                 // all three (after the optimizer step)
  std::size_t bytes() const;            // scaling state of the three
  // "<key>.input.*", "<key>.weight.*", "<key>.grad.*" as Fp8TensorMeta::save / load.
  void save(std::map<std::string, Tensor>& out, const std::string& key) const;
  void load(const std::map<std::string, Tensor>& in, const std::string& key);
};

// The FP8 compute copy of one weight [out, in]: E4M3 codes (on the weight's device) and their inverse scales
// (delayed: one f32 on the host, passed to the kernels by value; blockwise: the (ceil(out/128), ceil(in/128))
// grid, on the weight's device).
struct Fp8Weight {
  Tensor codes;
  Tensor inv_scales;
  Fp8ScalingKind kind = Fp8ScalingKind::blockwise;
  // delayed: the value inv_scales holds, kept as a float too so the product reads it without a round trip (and on
  // meta, whose inv_scales holds no data). Unused for blockwise.
  float inv_scale = 0.0f;
  std::size_t bytes() const;  // codes + scales
};

// Quantizes weight (f32 or bf16, [out, in], CPU or CUDA) for the forwards of one step. delayed: with
// meta->weight's scale, recording its amax (meta required); blockwise: meta is not used (may be null). Not
// recorded by autograd.
Fp8Weight quantize_weight(const Tensor& weight, const Fp8Recipe& recipe, Fp8LinearMeta* meta);
// The codes quantize_weight made of `weight`, made again and recording nothing: blockwise from the weight alone,
// delayed with the scale that quantization used (`delayed_scale`, meta->weight.scale() then). For a backward that
// did not keep them (amp::WeightCasts::recast).
Tensor quantize_weight_codes_again(const Tensor& weight, const Fp8Recipe& recipe, float delayed_scale);

// x [..., in] (f32 or bf16), weight [out, in] (the parameter gradients flow to), wq = quantize_weight(weight,
// ...) of the same values, bias [out] or undefined. Returns [..., out] in x's dtype. Gradients: dx in x's dtype,
// dweight in weight's dtype, dbias in bias's dtype (computed from the unquantized output gradient, as TE does).
// delayed needs meta (input and grad scales; amaxes recorded; the backward uses it, so it must outlive the
// backward); blockwise ignores it.
Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Fp8Weight& wq, const Tensor& bias,
                  const Fp8Recipe& recipe, Fp8LinearMeta* meta);

}  // namespace memtrain::amp

// FP8 scaling: per-tensor delayed scaling from an amax history (Transformer Engine's DelayedScaling recipe)
// and current per-block scaling in 1x128 / 128x128 tiles (DeepSeek-V3). Matmul inputs use E4M3 in the
// forward pass (activations, weights) and E5M2 for gradients.
//
// The CPU emulates FP8 exactly: quantize, dequantize, and compute in f32. The quantization functions below
// take a tensor on any device: they call that device's backend (src/core/backend.h; on CUDA the kernels of
// cuda/convert.h, on meta nothing is computed) and allocate their outputs there, with the same results bit
// for bit on the CPU and CUDA. Every rule below is the CUDA path's:
//   per tensor  q = fp8(f32(x * scale)), rounded as a cast (nearest even; finite values past the range
//               saturate to +-fp8_max; NaN stays NaN; Inf -> NaN in e4m3, Inf in e5m2), and the
//               dequantized value is f32(fp8_value(q) * inv_scale), then rounded to the output dtype.
//   blockwise   per tile: amax = max |x|, scale = fp8_max / amax, inv_scale = amax / fp8_max (f32
//               divisions); amax 0, Inf or NaN, or a scale that overflows f32, gives scale = inv_scale = 1.
//
// Scaling kinds, picked by the precision recipe:
//   delayed     one scale per tensor role (e.g. "layer 3 weight"), from the amaxes of earlier steps.
//   blockwise   scales computed from the tensor being quantized, one per tile.
#pragma once

#include "memtrain/core/dtype.h"
#include "memtrain/core/tensor.h"
#include "memtrain/core/fp8_tiling.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace memtrain::amp {

enum class Fp8Format { e4m3, e5m2 };
enum class Fp8ScalingKind { delayed, blockwise };  // the recipe option; see the overview above

// DType::f8_e4m3 / DType::f8_e5m2.
DType fp8_dtype(Fp8Format f);
// Largest finite value: 448 (e4m3) or 57344 (e5m2).
float fp8_max(Fp8Format f);

// ---- delayed scaling ----

// Which amax of the history sets the scale: the largest in the window, or the latest step's.
enum class AmaxAlgorithm { max, most_recent };

// history_len is 16 by default, not TE's 1024: the state is then 72 bytes per tensor instead of 4104, and
// the window only needs to bridge step-to-step noise; after a spike (a bad batch) a 1024-step window keeps
// the scale 1024 steps too small, which pushes small values into FP8's subnormals or to zero, while a
// 16-step one recovers in 16 steps. Margin m divides the scale by 2^m: headroom for values that grow
// between updates.
struct DelayedScalingOptions {
  int history_len = 16;  // >= 1
  int margin = 0;        // 0..64
  AmaxAlgorithm algo = AmaxAlgorithm::max;
};

// The delayed-scaling state of one FP8 tensor role: a ring of the last history_len amaxes, the current
// scale and its inverse. A fresh meta has scale = inv_scale = 1 and an all-zero history.
//
// One training step, as in TE:
//   q = quantize_fp8(x, f, meta.scale());   // quantize with the scale from BEFORE this step
//   meta.record_amax(amax(x));               // this step's amax goes into the current slot
//   meta.update_scale();                     // after the step: new scale from the window incl. this
//                                            // step's amax, then the ring advances
// update_scale():
//   a = max over the window (NaN if any entry is NaN), or the current slot for most_recent;
//   if a is finite and > 0: scale = f32(f32(fp8_max / a) / 2^margin), and FLT_MAX if that is Inf;
//   else the old scale is kept; inv_scale = f32(1 / scale);
//   then the oldest slot becomes the current one and is set to 0.
// NaN in the window freezes the scale like Inf does (TE's PyTorch rule, torch.max; TE's fused CUDA
// update skips NaN entries with fmaxf instead).
class Fp8TensorMeta {
 public:
  explicit Fp8TensorMeta(Fp8Format format, DelayedScalingOptions options = {});

  Fp8Format format() const { return format_; }
  const DelayedScalingOptions& options() const { return options_; }
  float scale() const { return scale_; }
  float inv_scale() const { return inv_scale_; }

  // Folds amax (>= 0, Inf or NaN) into the current slot: the slot keeps the larger value, NaN sticks, so
  // a tensor quantized several times in one step records the max of its amaxes.
  void record_amax(float amax);
  void update_scale();
  float step_amax() const { return amax_history_[current_]; }  // the current slot: this step's amax so far

  // The window, oldest first; the last entry is the current slot.
  std::vector<float> amax_history() const;
  // Bytes of scaling state: history_len * 4 (the ring) + 8 (scale and inverse scale).
  std::size_t bytes() const { return amax_history_.size() * sizeof(float) + 2 * sizeof(float); }

  // For checkpoint files: "<key>.amax_history" (f32 [history_len], oldest first) and "<key>.scale" (f32 [2]:
  // scale, inverse scale). load restores a meta that continues exactly as the saved one would have; it throws
  // naming the key, and changes nothing, on a missing tensor, another dtype or history length, or a scale that
  // is not finite and > 0.
  void save(std::map<std::string, Tensor>& out, const std::string& key) const;
  void load(const std::map<std::string, Tensor>& in, const std::string& key);

 private:
  Fp8Format format_;
  DelayedScalingOptions options_;
  std::vector<float> amax_history_;  // ring; current_ is the slot this step records into
  std::size_t current_ = 0;
  float scale_ = 1.0f;
  float inv_scale_ = 1.0f;
};

// ---- quantization ----

// Counts over the elements of a quantize call; each call adds to them.
//   saturated    finite x * scale that rounds past fp8_max (|.| > 464 for e4m3, >= 61440 for e5m2): the
//                code clips to +-fp8_max. Values that round to fp8_max anyway are not counted.
//   underflowed  x finite and nonzero, but the code is +-0.
//   nonfinite    the code is NaN or Inf: x was NaN or Inf, or x * scale overflowed f32.
struct QuantStats {
  std::int64_t saturated = 0;
  std::int64_t underflowed = 0;
  std::int64_t nonfinite = 0;
};

// Device: every tensor argument of one call is on one device (CPU, CUDA or meta), and so are the results. A
// strided input is copied to a contiguous one first. stats (counts of the CPU loops) must be null for an input
// on another device. On meta nothing is computed: an amax is 0.

// max |x| over an f32 or bf16 tensor (0 when empty, NaN when any element is NaN): the amax to record. For a
// CUDA x the device result is copied back, so this waits for the device.
float amax(const Tensor& x);

// x: f32 or bf16, any shape with >= 1 dim. Returns the FP8 codes (same shape, dtype fp8_dtype(f)).
// scale: finite and > 0.
Tensor quantize_fp8(const Tensor& x, Fp8Format f, float scale, QuantStats* stats = nullptr);
// quantize_fp8(x, f, scale) and amax(x) at once: the delayed-scaling step (quantize with the scale from before
// the step, record this step's amax). On CUDA one pass over x.
struct Fp8WithAmax {
  Tensor codes;
  float amax = 0.0f;
};
Fp8WithAmax quantize_fp8_with_amax(const Tensor& x, Fp8Format f, float scale);
// q: f8_e4m3 / f8_e5m2. Returns fp8_value(q) * inv_scale in `out` (f32 or bf16); inv_scale finite, > 0.
Tensor dequantize_fp8(const Tensor& q, float inv_scale, DType out = DType::f32);

// The tiling of core/fp8_tiling.h, shared by every backend, so a tensor quantized on any device carries the
// same scale grid.
using Fp8Tiling = ::memtrain::Fp8Tiling;

// Blockwise FP8 of x viewed as a (rows, cols) matrix, rows = numel / cols, cols = the last dim.
struct BlockwiseFp8 {
  Tensor codes;       // x's shape, f8_e4m3 / f8_e5m2
  Tensor inv_scales;  // (fp8_scale_rows(rows, tiling), fp8_scale_cols(cols)) f32, row-major, on codes' device
  Fp8Tiling tiling = Fp8Tiling::row_1x128;
};

// x: f32 or bf16 with >= 1 dim. 1x128 suits activations (one scale per row per 128 columns),
// 128x128 suits weights. Edge tiles are partial.
BlockwiseFp8 quantize_fp8_blockwise(const Tensor& x, Fp8Format f, Fp8Tiling t, QuantStats* stats = nullptr);
// The inverse: codes * the tile's inverse scale, in `out` (f32 or bf16), shape of q.codes.
Tensor dequantize_fp8_blockwise(const BlockwiseFp8& q, DType out = DType::f32);

}  // namespace memtrain::amp

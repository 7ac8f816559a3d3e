// The backend contract: what a device kind must provide so that tensors and ops run on it. An op's
// front-end (src/ops/) checks shapes and dtypes once, allocates its outputs on the operands' device,
// records autograd, and then calls the one entry of the backend registered for that device:
//
//   detail::backend_for(x.device()).layer_norm_forward(out, mean, rstd, x, weight, bias, eps);
//
// Backends implement kernels only: no autograd, no policy, no shape rules beyond what their kernels
// need (a kernel's own layout limits, e.g. "contiguous", are checked by the backend that has them).
//
// The backends (docs/architecture.md):
// - cpu  (src/cpu/cpu_backend.h): the reference. Always registered.
// - meta (src/meta/): the CPU backend with every kernel skipped. It allocates exactly what the CPU
//   backend allocates (outputs, converted copies, workspace), so a step on meta accounts the same bytes
//   as the step on the CPU; it reads as zeros (item() is 0), the documented answer for data-dependent
//   branches. Always registered.
// - cuda (src/cuda/): registered when the build has CUDA; backend_for() names why a device is unusable.
//
// The entries are listed once, in core/backend_entries.def; a backend's class expands the same list with
// `override`, so adding an entry there is what makes every backend implement it.
#pragma once

#include "memtrain/core/allocator.h"
#include "memtrain/core/device.h"
#include "memtrain/core/elementwise_ops.h"
#include "memtrain/core/fp8_tiling.h"
#include "memtrain/core/rng.h"
#include "memtrain/core/tensor.h"

#include <memory>
#include <string>

namespace memtrain::detail {

class Backend {
 public:
  virtual ~Backend() = default;

  // ---- what a backend may leave to these defaults ----
  // Devices of this kind on this machine (indices 0..n-1); the CPU and meta have one.
  virtual int device_count() const { return 1; }
  // Where small host-side values that go with this device's tensors live (fp8_linear's delayed scale): the CPU,
  // except on meta, whose host side is meta itself so a meta run accounts those bytes where the CPU run does.
  virtual Device host_side() const { return Device::cpu(); }
  // Whether host code reads and writes this device's tensor bytes through data_ptr() (the CPU; not meta, which
  // holds none): a file's bytes then go straight between the file and the tensor, without a staging copy.
  virtual bool host_addressable() const { return false; }

  // ---- the types the entries name ----
  // The elementwise maps, named since a lambda cannot run on every device. out = f(x; p0, p1); p0/p1
  // are rounded to the compute type first (x + p0, not x + (double)p0).
  using UnaryOp = ::memtrain::elementwise::UnaryOp;
  // out = f(a, b; p0, p1). The *_backward rules are dx = f(a = dy, b = saved), with b the forward's input
  // x (abs, pow [p0 = exponent], clamp [p0, p1 = bounds], gelu_erf, gelu_tanh, silu) or its output y
  // (tanh, sigmoid, relu, sqrt, rsqrt), as in src/ops/unary.cpp.
  using BinaryOp = ::memtrain::elementwise::BinaryOp;
  enum class CompareOp { gt, lt };
  // What an FP8 quantize pass counted (amp::QuantStats): the CPU counts (counted = true); CUDA and meta count
  // nothing and leave counted false, so a caller that asked for counts is refused instead of reading zeros.
  struct Fp8Counts {
    std::int64_t saturated = 0, underflowed = 0, nonfinite = 0;
    bool counted = false;
  };

  // ---- the kernel entries, each documented in the list ----
#define MT_BACKEND_ENTRY(ret, name, params) virtual ret name params const = 0;
#include "core/backend_entries.def"
#undef MT_BACKEND_ENTRY
};

// ---- helpers of the backends' entries ----

// t without autograd history, contiguous (no copy when it already is); an undefined t stays undefined.
inline Tensor dense(const Tensor& t) {
  if (!t.defined()) return t;
  const Tensor d = t.detach();
  return d.is_contiguous() ? d : d.contiguous();
}

// Scratch of `elems` elements on `device`, counted as workspace; freed when the returned tensor dies.
inline Tensor workspace_on(Device device, std::int64_t elems, DType dtype) {
  CategoryGuard guard(MemoryCategory::workspace);
  return Tensor::empty({elems}, dtype, device);
}

// The backend of a device; throws naming the device and why when none can serve it (a build without CUDA,
// no usable GPU, an index past the machine's devices).
const Backend& backend_for(Device device);

// How a device's Allocator caches freed bytes. Known from the device kind alone, without its backend, so an
// allocator can be built over any memory source for a device this machine lacks (the device allocator's tests).
CachePolicy cache_policy_for(Device device);

// The backend that moves bytes between two devices (its `transfer` entry): with meta on either side meta's,
// which moves none; otherwise the side that is not the CPU (either one when both are CUDA devices).
const Backend& backend_for_transfer(Device dst, Device src);

}  // namespace memtrain::detail

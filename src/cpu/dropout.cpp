#include "cpu/dropout.h"

#include "cpu/cpu_backend.h"

#include "memtrain/core/philox.h"

#include <algorithm>
#include <cmath>

namespace memtrain::cpu {

namespace {

// out[i] = keep(i) ? in[i] * scale : 0 with keep(i) from the Philox rule in dropout.h.
template <typename T>
void apply_mask(T* out, const T* in, int64_t n, double p, RngState state) {
  const uint64_t threshold = static_cast<uint64_t>(std::llround(std::clamp(p, 0.0, 1.0) * 4294967296.0));
  const T scale = p < 1.0 ? static_cast<T>(1.0 / (1.0 - p)) : T(0);
  const int64_t blocks = static_cast<int64_t>(dropout_rng_blocks(n));
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (int64_t b = 0; b < blocks; ++b) {
    const Philox4x32 r = philox4x32_10(state.offset + static_cast<uint64_t>(b), 0, state.seed);
    for (int lane = 0; lane < 4; ++lane) {
      const int64_t i = b * 4 + lane;
      if (i >= n) break;
      out[i] = static_cast<uint64_t>(r.v[lane]) >= threshold ? in[i] * scale : T(0);
    }
  }
}

}  // namespace

template <typename T>
void dropout_forward(T* out, const T* x, int64_t n, double p, RngState state) {
  apply_mask(out, x, n, p, state);
}

template <typename T>
void dropout_backward(T* dx, const T* dout, int64_t n, double p, RngState state) {
  apply_mask(dx, dout, n, p, state);  // d(x * mask * scale)/dx = mask * scale
}

template void dropout_forward<float>(float*, const float*, int64_t, double, RngState);
template void dropout_forward<double>(double*, const double*, int64_t, double, RngState);
template void dropout_backward<float>(float*, const float*, int64_t, double, RngState);
template void dropout_backward<double>(double*, const double*, int64_t, double, RngState);

}  // namespace memtrain::cpu

// ---- the CPU backend's entries ----

namespace memtrain::cpu {

namespace {

// out = kernel(in) in in's compute dtype: both entries are this (the backward applies the forward's mask and
// scale to dout).
template <typename Kernel>
void run_dropout(const CpuBackend& be, const char* op, const Tensor& out, const Tensor& in, Kernel kernel) {
  const Tensor ic = compute_operand(in);
  const Tensor oc = compute_result(out, ic.dtype());
  if (be.runs_kernels()) {
    dispatch_compute(op, ic.dtype(), [&](auto zero) {
      using T = decltype(zero);
      kernel(oc.data<T>(), ic.data<T>(), ic.numel());
    });
  }
  finish_result(out, oc);
}

}  // namespace

void CpuBackend::dropout_forward(const Tensor& out, const Tensor& x, double p, const RngState& state) const {
  run_dropout(*this, "dropout", out, x,
              [&](auto* y, const auto* xp, int64_t n) { cpu::dropout_forward(y, xp, n, p, state); });
}

void CpuBackend::dropout_backward(const Tensor& dx, const Tensor& dout, double p, const RngState& state) const {
  run_dropout(*this, "dropout_backward", dx, dout,
              [&](auto* d, const auto* g, int64_t n) { cpu::dropout_backward(d, g, n, p, state); });
}

}  // namespace memtrain::cpu

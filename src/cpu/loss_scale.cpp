// The loss scaler's unscale on the CPU (the contract's unscale_grads, for amp::DynamicLossScaler): each gradient
// divided by the scale in f64 and rounded once to its dtype, in place. A strided gradient goes through a
// contiguous workspace copy on its own device and back, so meta allocates that copy as the CPU does; the loop
// runs only under runs_kernels(), and on meta nothing overflows.
#include "cpu/cpu_backend.h"

#include "memtrain/core/error.h"
#include "memtrain/core/float_types.h"

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace memtrain::cpu {
namespace {

double widen(double x) { return x; }
double widen(float x) { return x; }
double widen(Half x) { return x.to_float(); }
double widen(BFloat16 x) { return x.to_float(); }

template <typename T>
T narrow(double x) {
  if constexpr (std::is_same_v<T, double>) return x;
  else if constexpr (std::is_same_v<T, float>) return static_cast<float>(x);
  else return T::from_double(x);
}

// Divides n contiguous elements by scale in f64, rounding once to T; true when every result is finite.
template <typename T>
bool unscale_contiguous(T* p, std::int64_t n, double scale) {
  int bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) {
    const T y = narrow<T>(widen(p[i]) / scale);
    p[i] = y;
    bad |= !std::isfinite(widen(y));
  }
  return bad == 0;
}

bool unscale_in_place(const Tensor& g, double scale) {
  const std::int64_t n = g.numel();
  switch (g.dtype()) {
    case DType::f64: return unscale_contiguous(g.data<double>(), n, scale);
    case DType::f32: return unscale_contiguous(g.data<float>(), n, scale);
    case DType::f16: return unscale_contiguous(g.data<Half>(), n, scale);
    case DType::bf16: return unscale_contiguous(g.data<BFloat16>(), n, scale);
    default: break;
  }
  ::memtrain::detail::throw_error("DynamicLossScaler",
                                  fmt::format("unscale_: unsupported dtype {}", dtype_name(g.dtype())));
}

}  // namespace

bool CpuBackend::unscale_grads(const std::vector<Tensor>& grads, double scale) const {
  bool finite = true;
  for (const Tensor& g : grads) {
    if (g.is_contiguous()) {
      if (runs_kernels()) finite &= unscale_in_place(g, scale);
      continue;
    }
    CategoryGuard category(MemoryCategory::workspace);
    const Tensor work = g.contiguous();
    if (runs_kernels()) finite &= unscale_in_place(work, scale);
    Tensor target = g;  // a handle: copy_ writes the caller's storage
    target.copy_(work);
  }
  return !finite;
}

}  // namespace memtrain::cpu

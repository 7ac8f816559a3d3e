#include "cpu/pool.h"

#include "core/pool_shape.h"
#include "cpu/cpu_backend.h"
#include "cpu/instantiate.h"

#include <algorithm>
#include <limits>

namespace memtrain::cpu {

namespace {

// Calls f(ih * W + iw) for each position of window (oh, ow) inside the plane (padding skipped), row by row.
template <typename F>
void for_each_tap(const Pool2dShape& s, int64_t oh, int64_t ow, F f) {
  for (int64_t kh = 0; kh < s.kernel; ++kh) {
    const int64_t ih = oh * s.stride - s.padding + kh;
    if (ih < 0 || ih >= s.H) continue;
    for (int64_t kw = 0; kw < s.kernel; ++kw) {
      const int64_t iw = ow * s.stride - s.padding + kw;
      if (iw >= 0 && iw < s.W) f(ih * s.W + iw);
    }
  }
}

// Position (ih * W + iw) of the first maximum of window (oh, ow) in plane x, or -1 if it is all padding.
template <typename T>
int64_t window_argmax(const T* x, const Pool2dShape& s, int64_t oh, int64_t ow) {
  int64_t best = -1;
  T best_v = -std::numeric_limits<T>::infinity();
  for_each_tap(s, oh, ow, [&](int64_t at) {
    const T v = x[at];
    if (best < 0 || v > best_v || (v != v && best_v == best_v)) {  // NaN propagates, like PyTorch
      best = at;
      best_v = v;
    }
  });
  return best;
}

constexpr int64_t kGrain = 1 << 14;

// Runs f(p) for every plane p; planes are split across threads once the input is large enough to pay for them.
template <typename F>
void for_each_plane(const Pool2dShape& s, F f) {
#pragma omp parallel for schedule(static) if (s.planes * s.H * s.W > kGrain)
  for (int64_t p = 0; p < s.planes; ++p) f(p);
}

// Calls f(oh, ow, oh * OW + ow) for every window of a plane, row by row.
template <typename F>
void for_each_window(const Pool2dShape& s, F f) {
  for (int64_t oh = 0; oh < s.OH; ++oh)
    for (int64_t ow = 0; ow < s.OW; ++ow) f(oh, ow, oh * s.OW + ow);
}

}  // namespace

template <typename T>
void max_pool2d_forward(T* out, const T* x, const Pool2dShape& s) {
  for_each_plane(s, [&](int64_t p) {
    const T* xp = x + p * s.H * s.W;  // (H, W)
    T* op = out + p * s.OH * s.OW;    // (OH, OW)
    for_each_window(s, [&](int64_t oh, int64_t ow, int64_t o) {
      const int64_t a = window_argmax(xp, s, oh, ow);
      op[o] = a < 0 ? -std::numeric_limits<T>::infinity() : xp[a];
    });
  });
}

template <typename T>
void max_pool2d_backward(T* dx, const T* dout, const T* x, const Pool2dShape& s) {
  for_each_plane(s, [&](int64_t p) {
    T* dxp = dx + p * s.H * s.W;  // zeroed: the windows add into it
    std::fill(dxp, dxp + s.H * s.W, T(0));
    const T* xp = x + p * s.H * s.W;
    const T* gp = dout + p * s.OH * s.OW;
    for_each_window(s, [&](int64_t oh, int64_t ow, int64_t o) {
      const int64_t a = window_argmax(xp, s, oh, ow);
      if (a >= 0) dxp[a] += gp[o];
    });
  });
}

template <typename T>
void avg_pool2d_forward(T* out, const T* x, const Pool2dShape& s) {
  const T inv = T(1) / static_cast<T>(s.kernel * s.kernel);
  for_each_plane(s, [&](int64_t p) {
    const T* xp = x + p * s.H * s.W;
    T* op = out + p * s.OH * s.OW;
    for_each_window(s, [&](int64_t oh, int64_t ow, int64_t o) {
      T acc = 0;
      for_each_tap(s, oh, ow, [&](int64_t at) { acc += xp[at]; });
      op[o] = acc * inv;
    });
  });
}

template <typename T>
void avg_pool2d_backward(T* dx, const T* dout, const Pool2dShape& s) {
  const T inv = T(1) / static_cast<T>(s.kernel * s.kernel);
  for_each_plane(s, [&](int64_t p) {
    T* dxp = dx + p * s.H * s.W;  // zeroed: the windows add into it
    std::fill(dxp, dxp + s.H * s.W, T(0));
    const T* gp = dout + p * s.OH * s.OW;
    for_each_window(s, [&](int64_t oh, int64_t ow, int64_t o) {
      const T g = gp[o] * inv;
      for_each_tap(s, oh, ow, [&](int64_t at) { dxp[at] += g; });
    });
  });
}

#define MEMTRAIN_INSTANTIATE(T)                                                              \
  template void max_pool2d_forward<T>(T*, const T*, const Pool2dShape&);                     \
  template void max_pool2d_backward<T>(T*, const T*, const T*, const Pool2dShape&);          \
  template void avg_pool2d_forward<T>(T*, const T*, const Pool2dShape&);                     \
  template void avg_pool2d_backward<T>(T*, const T*, const Pool2dShape&);
MEMTRAIN_CPU_FOR_COMPUTE_TYPES(MEMTRAIN_INSTANTIATE)
#undef MEMTRAIN_INSTANTIATE

// ---- the CPU backend's entries ----

void CpuBackend::pool2d_forward(const Tensor& out, const Tensor& x, std::int64_t kernel, std::int64_t stride,
                                std::int64_t padding, bool is_max) const {
  const Pool2dShape s = ::memtrain::detail::pool2d_shape<Pool2dShape>(x, out, kernel, stride, padding);
  const Tensor xc = compute_operand(x);
  const Tensor y = compute_result(out, xc.dtype());
  if (runs_kernels()) {
    dispatch_compute(is_max ? "max_pool2d" : "avg_pool2d", xc.dtype(), [&](auto zero) {
      using T = decltype(zero);
      if (is_max) {
        cpu::max_pool2d_forward<T>(y.data<T>(), xc.data<T>(), s);
      } else {
        cpu::avg_pool2d_forward<T>(y.data<T>(), xc.data<T>(), s);
      }
    });
  }
  finish_result(out, y);
}

void CpuBackend::pool2d_backward(const Tensor& dx, const Tensor& dout, const Tensor& x, std::int64_t kernel,
                                 std::int64_t stride, std::int64_t padding, bool is_max) const {
  const Pool2dShape s = ::memtrain::detail::pool2d_shape<Pool2dShape>(dx, dout, kernel, stride, padding);
  const Tensor g = compute_operand(dout);
  const Tensor xc = is_max ? compute_operand(x) : Tensor();
  const Tensor d = compute_result(dx, g.dtype());
  if (runs_kernels()) {
    dispatch_compute(is_max ? "max_pool2d" : "avg_pool2d", g.dtype(), [&](auto zero) {
      using T = decltype(zero);
      if (is_max) {
        cpu::max_pool2d_backward<T>(d.data<T>(), g.data<T>(), xc.data<T>(), s);
      } else {
        cpu::avg_pool2d_backward<T>(d.data<T>(), g.data<T>(), s);
      }
    });
  }
  finish_result(dx, d);
}

}  // namespace memtrain::cpu

#include "cpu/conv.h"

#include "cpu/cpu_backend.h"
#include "cpu/instantiate.h"
#include "memtrain/core/allocator.h"

#include "cpu/gemm_typed.h"

#include <omp.h>

#include <algorithm>

namespace memtrain::cpu {

namespace {

bool is_pointwise(const Conv2dShape& s) { return s.KH == 1 && s.KW == 1 && s.stride == 1 && s.padding == 0; }
int64_t col_rows(const Conv2dShape& s) { return s.Cin / s.groups * s.KH * s.KW; }
int64_t col_elems(const Conv2dShape& s) { return is_pointwise(s) ? 0 : col_rows(s) * s.OH * s.OW; }
int64_t weight_elems(const Conv2dShape& s) { return s.Cout * col_rows(s); }

// The walk im2col and its adjoint share: for each row (c, kh, kw) of col (C*KH*KW, OH*OW) and each output row
// oh, calls f(offset of that segment of OW in col, offset of x's row ih in (C, H, W) or -1 when ih lies in the
// padding, kw).
template <typename F>
void for_each_col_segment(int64_t C, const Conv2dShape& s, F f) {
  const int64_t L = s.OH * s.OW;
  for (int64_t c = 0; c < C; ++c)
    for (int64_t kh = 0; kh < s.KH; ++kh)
      for (int64_t kw = 0; kw < s.KW; ++kw) {
        const int64_t row = ((c * s.KH + kh) * s.KW + kw) * L;
        for (int64_t oh = 0; oh < s.OH; ++oh) {
          const int64_t ih = oh * s.stride - s.padding + kh;
          f(row + oh * s.OW, ih < 0 || ih >= s.H ? int64_t{-1} : (c * s.H + ih) * s.W, kw);
        }
      }
}

// col (C*KH*KW, OH*OW) from x (C, H, W); zeros where the window hangs over the padding.
template <typename T>
void im2col(T* col, const T* x, int64_t C, const Conv2dShape& s) {
  for_each_col_segment(C, s, [&](int64_t at, int64_t x_row, int64_t kw) {
    T* dst = col + at;
    if (x_row < 0) {
      std::fill(dst, dst + s.OW, T(0));
      return;
    }
    const T* src = x + x_row;
    for (int64_t ow = 0; ow < s.OW; ++ow) {
      const int64_t iw = ow * s.stride - s.padding + kw;
      dst[ow] = iw >= 0 && iw < s.W ? src[iw] : T(0);
    }
  });
}

// dx (C, H, W) += col2im(col): the adjoint of im2col.
template <typename T>
void col2im_add(T* dx, const T* col, int64_t C, const Conv2dShape& s) {
  for_each_col_segment(C, s, [&](int64_t at, int64_t x_row, int64_t kw) {
    if (x_row < 0) return;
    T* dst = dx + x_row;
    const T* src = col + at;
    for (int64_t ow = 0; ow < s.OW; ++ow) {
      const int64_t iw = ow * s.stride - s.padding + kw;
      if (iw >= 0 && iw < s.W) dst[iw] += src[ow];
    }
  });
}

// ---- depthwise (Cin / groups == 1) by direct loops ----
// Output channel co reads input channel ci = co / M (M = Cout / groups, the channel multiplier) through one
// KH x KW filter. As a GEMM that is one call per image and channel with a single row of K = KH*KW: all call
// overhead. Instead each (image, channel) plane of x is first copied, zero-padded, into S*S phase planes (S the
// stride; one plane at stride 1): phase (r % S, c % S) holds padded row r and column c at (r / S, c / S), with
// row pitch Wq >= OW. Output (oh, ow), at "wide" index i = oh * Wq + ow, then reads the phase plane of tap
// (kh, kw) at i + (kh / S) * Wq + kw / S, for every output at once: each tap is one contiguous multiply-add
// pass over the whole plane, which the compiler vectorises, with no border cases. Wide columns ow >= OW are
// computed and dropped (under one vector per row); one extra zero row per phase plane holds what they read past
// the last row. Every output element is summed by one thread in a fixed order, so results do not depend on the
// thread count.

bool is_depthwise(const Conv2dShape& s) { return s.Cin == s.groups; }
int64_t dw_taps(const Conv2dShape& s) { return s.KH * s.KW; }

struct DwGeometry {
  int64_t Hq, Wq;  // rows (with the extra one) and row pitch of a phase plane; Wq is also the wide pitch
  int64_t xq;      // elements of all S*S phase planes
  int64_t wide;    // elements of a wide output plane (OH, Wq)
};
DwGeometry dw_geometry(const Conv2dShape& s) {
  const int64_t S = s.stride, Hq = (s.H + 2 * s.padding + S - 1) / S + 1, Wq = (s.W + 2 * s.padding + S - 1) / S;
  return {Hq, Wq, S * S * Hq * Wq, s.OH * Wq};
}
// Per-thread scratch: forward xq + a wide y; backward xq (for dx, its adjoint) + a wide dy + KH*KW wide dW sums.
int64_t dw_forward_scratch(const Conv2dShape& s) { return dw_geometry(s).xq + dw_geometry(s).wide; }
int64_t dw_backward_scratch(const Conv2dShape& s) { return dw_geometry(s).xq + dw_geometry(s).wide * (1 + dw_taps(s)); }

// Where tap (kh, kw) reads in xq, relative to the wide index.
int64_t dw_tap_offset(const Conv2dShape& s, const DwGeometry& g, int64_t kh, int64_t kw) {
  const int64_t S = s.stride;
  return ((kh % S) * S + kw % S) * g.Hq * g.Wq + (kh / S) * g.Wq + kw / S;
}
// Calls f(offset in x (H, W), offset in xq, count) for each run of one x row that lands in one phase plane: the
// run is x[h, w0], x[h, w0 + S], ... and lands contiguously in xq.
template <typename F>
void dw_for_each_phase_run(const Conv2dShape& s, const DwGeometry& g, F f) {
  // Divisions hoisted (they cost more than a short run's copy): row r = h + P and column c = w0 + P as
  // (quotient, remainder) by S, stepped along.
  const int64_t S = s.stride, runs = std::min(S, s.W), n_full = s.W / S, n_extra = s.W % S;
  int64_t rq = s.padding / S, rp = s.padding % S;
  for (int64_t h = 0; h < s.H; ++h) {
    int64_t cq = s.padding / S, cp = s.padding % S;
    for (int64_t w0 = 0; w0 < runs; ++w0) {
      f(h * s.W + w0, ((rp * S + cp) * g.Hq + rq) * g.Wq + cq, n_full + (w0 < n_extra ? 1 : 0));
      if (++cp == S) cp = 0, ++cq;
    }
    if (++rp == S) rp = 0, ++rq;
  }
}

// xq = the phase planes of x (H, W) with `padding` zeros around it.
template <typename T>
void dw_pad(T* xq, const T* x, const Conv2dShape& s, const DwGeometry& g) {
  std::fill(xq, xq + g.xq, T(0));
  const int64_t S = s.stride;
  dw_for_each_phase_run(s, g, [&](int64_t from, int64_t to, int64_t n) {
    if (S == 1)
      std::copy_n(x + from, n, xq + to);
    else if (S == 2)  // a constant stride: vectorised with shuffles
      for (int64_t j = 0; j < n; ++j) xq[to + j] = x[from + j * 2];
    else
      for (int64_t j = 0; j < n; ++j) xq[to + j] = x[from + j * S];
  });
}
// The adjoint of dw_pad: dx (H, W) = what the phase planes hold for x's elements.
template <typename T>
void dw_unpad(T* dx, const T* xq, const Conv2dShape& s, const DwGeometry& g) {
  const int64_t S = s.stride;
  dw_for_each_phase_run(s, g, [&](int64_t to, int64_t from, int64_t n) {
    if (S == 1)
      std::copy_n(xq + from, n, dx + to);
    else if (S == 2)
      for (int64_t j = 0; j < n; ++j) dx[to + j * 2] = xq[from + j];
    else
      for (int64_t j = 0; j < n; ++j) dx[to + j * S] = xq[from + j];
  });
}
// wide (OH, Wq) = y (OH, OW) with zeros in the dropped columns, and back.
template <typename T>
void dw_widen(T* wide, const T* y, const Conv2dShape& s, const DwGeometry& g) {
  for (int64_t oh = 0; oh < s.OH; ++oh) {
    std::copy_n(y + oh * s.OW, s.OW, wide + oh * g.Wq);
    std::fill(wide + oh * g.Wq + s.OW, wide + (oh + 1) * g.Wq, T(0));
  }
}
template <typename T>
void dw_narrow(T* y, const T* wide, const Conv2dShape& s, const DwGeometry& g) {
  for (int64_t oh = 0; oh < s.OH; ++oh) std::copy_n(wide + oh * g.Wq, s.OW, y + oh * s.OW);
}

// y[i] += a * x[i] and y[i] += a[i] * x[i], i < n: the inner loops of the taps below. Out of line on purpose:
// inlined, GCC -O3's unroll-and-jam fused two taps into one scalar loop, about half the speed of the vectorised pass.
template <typename T>
[[gnu::noinline]] void dw_axpy(T* __restrict y, const T* __restrict x, T a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}
template <typename T>
[[gnu::noinline]] void dw_mul_add(T* __restrict y, const T* __restrict a, const T* __restrict x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a[i] * x[i];
}

// y_wide += sum over taps of w[kh, kw] * xq shifted: the forward of one output channel.
template <typename T>
void dw_taps_forward(T* __restrict y, const T* __restrict xq, const T* __restrict w, const Conv2dShape& s,
                     const DwGeometry& g) {
  for (int64_t kh = 0; kh < s.KH; ++kh)
    for (int64_t kw = 0; kw < s.KW; ++kw) {
      const T wv = w[kh * s.KW + kw];
      const T* __restrict xt = xq + dw_tap_offset(s, g, kh, kw);
      dw_axpy(y, xt, wv, g.wide);
    }
}

// dxq += the adjoint of dw_taps_forward applied to dy_wide (zeros in its dropped columns, so they add nothing).
template <typename T>
void dw_taps_backward_input(T* dxq, const T* __restrict dy, const T* __restrict w, const Conv2dShape& s,
                            const DwGeometry& g) {
  for (int64_t kh = 0; kh < s.KH; ++kh)
    for (int64_t kw = 0; kw < s.KW; ++kw) {
      const T wv = w[kh * s.KW + kw];
      T* __restrict dxt = dxq + dw_tap_offset(s, g, kh, kw);
      dw_axpy(dxt, dy, wv, g.wide);
    }
}

// acc (KH*KW, OH*Wq) += dy_wide * xq shifted, elementwise: summed over i only at the end (dw_backward), so the
// inner loop is a vertical multiply-add rather than a reduction.
template <typename T>
void dw_taps_backward_weight(T* __restrict acc, const T* __restrict dy, const T* __restrict xq, const Conv2dShape& s,
                             const DwGeometry& g) {
  for (int64_t kh = 0; kh < s.KH; ++kh)
    for (int64_t kw = 0; kw < s.KW; ++kw) {
      T* __restrict at = acc + (kh * s.KW + kw) * g.wide;
      const T* __restrict xt = xq + dw_tap_offset(s, g, kh, kw);
      dw_mul_add(at, dy, xt, g.wide);
    }
}

// Threads split the (image, input channel) planes; each pads its plane once for its M output channels.
template <typename T>
void dw_forward(T* out, const T* x, const T* weight, const T* bias, const Conv2dShape& s, T* workspace,
                int nthreads) {
  const int64_t M = s.Cout / s.groups, taps = dw_taps(s), L = s.OH * s.OW;
  const DwGeometry g = dw_geometry(s);
#pragma omp parallel num_threads(nthreads)
  {
    T* xq = workspace + omp_get_thread_num() * dw_forward_scratch(s);
    T* yw = xq + g.xq;
#pragma omp for schedule(static)
    for (int64_t p = 0; p < s.B * s.Cin; ++p) {  // p = b * Cin + ci
      dw_pad(xq, x + p * s.H * s.W, s, g);
      for (int64_t co = p % s.Cin * M; co < (p % s.Cin + 1) * M; ++co) {
        std::fill(yw, yw + g.wide, bias ? bias[co] : T(0));
        dw_taps_forward(yw, xq, weight + co * taps, s, g);
        dw_narrow(out + (p / s.Cin * s.Cout + co) * L, yw, s, g);
      }
    }
  }
}

// dx: threads split the (image, input channel) planes, each gathering its M output channels; dW: threads split
// the output channels, each summing over all images itself. Neither needs partial sums across threads.
template <typename T>
void dw_backward(T* dx, T* dweight, const T* dout, const T* x, const T* weight, const Conv2dShape& s, T* workspace,
                 int nthreads) {
  const int64_t M = s.Cout / s.groups, taps = dw_taps(s), HW = s.H * s.W, L = s.OH * s.OW;
  const DwGeometry g = dw_geometry(s);
#pragma omp parallel num_threads(nthreads)
  {
    T* xq = workspace + omp_get_thread_num() * dw_backward_scratch(s);  // also dxq
    T* dyw = xq + g.xq;
    T* acc = dyw + g.wide;  // (KH*KW, OH*Wq)
    if (dx) {
#pragma omp for schedule(static)
      for (int64_t p = 0; p < s.B * s.Cin; ++p) {  // p = b * Cin + ci
        std::fill(xq, xq + g.xq, T(0));
        for (int64_t co = p % s.Cin * M; co < (p % s.Cin + 1) * M; ++co) {
          dw_widen(dyw, dout + (p / s.Cin * s.Cout + co) * L, s, g);
          dw_taps_backward_input(xq, dyw, weight + co * taps, s, g);
        }
        dw_unpad(dx + p * HW, xq, s, g);
      }
    }
    if (dweight) {
#pragma omp for schedule(static)
      for (int64_t co = 0; co < s.Cout; ++co) {
        std::fill(acc, acc + taps * g.wide, T(0));
        for (int64_t b = 0; b < s.B; ++b) {
          dw_pad(xq, x + (b * s.Cin + co / M) * HW, s, g);
          dw_widen(dyw, dout + (b * s.Cout + co) * L, s, g);
          dw_taps_backward_weight(acc, dyw, xq, s, g);
        }
        for (int64_t t = 0; t < taps; ++t) {  // the dropped columns hold 0 * x: left out, in case x is inf
          T sum = 0;
          for (int64_t oh = 0; oh < s.OH; ++oh)
            for (int64_t ow = 0; ow < s.OW; ++ow) sum += acc[t * g.wide + oh * g.Wq + ow];
          dweight[co * taps + t] = sum;
        }
      }
    }
  }
}

// dbias[co] = sum of dout over images and positions; one channel per thread, in a fixed order.
template <typename T>
void bias_backward(T* dbias, const T* dout, const Conv2dShape& s, int nthreads) {
  const int64_t L = s.OH * s.OW;
#pragma omp parallel for num_threads(nthreads) schedule(static)
  for (int64_t co = 0; co < s.Cout; ++co) {
    T acc = 0;
    for (int64_t b = 0; b < s.B; ++b) {
      const T* gr = dout + (b * s.Cout + co) * L;
      for (int64_t l = 0; l < L; ++l) acc += gr[l];
    }
    dbias[co] = acc;
  }
}

// The depthwise loops run where the shape is depthwise, unless the general path is asked for.
bool takes_depthwise(const Conv2dShape& s, ConvPath path) { return path == ConvPath::best && is_depthwise(s); }

int64_t im2col_forward_workspace(const Conv2dShape& s, int nthreads) { return nthreads * col_elems(s); }

int64_t im2col_backward_workspace(const Conv2dShape& s, int nthreads) {
  // A column buffer (also dcol) per thread, plus per-thread partial dW.
  return nthreads * (col_elems(s) + weight_elems(s));
}

template <typename T>
void im2col_forward(T* out, const T* x, const T* weight, const T* bias, const Conv2dShape& s, T* workspace,
                    int nthreads) {
  const int64_t G = s.groups, Cin_g = s.Cin / G, Cout_g = s.Cout / G, K = col_rows(s), L = s.OH * s.OW;
  const bool pointwise = is_pointwise(s);
#pragma omp parallel num_threads(nthreads)
  {
    T* col = workspace + omp_get_thread_num() * col_elems(s);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t g = 0; g < G; ++g) {
        const T* xg = x + (b * s.Cin + g * Cin_g) * s.H * s.W;  // (Cin_g, H, W)
        T* og = out + (b * s.Cout + g * Cout_g) * L;            // (Cout_g, OH*OW)
        const T* cg = xg;
        if (!pointwise) {
          im2col(col, xg, Cin_g, s);
          cg = col;
        }
        gemm(false, false, Cout_g, L, K, T(1), weight + g * Cout_g * K, K, cg, L, T(0), og, L);
        if (bias) {
          for (int64_t co = 0; co < Cout_g; ++co) {
            const T bv = bias[g * Cout_g + co];
            for (int64_t l = 0; l < L; ++l) og[co * L + l] += bv;
          }
        }
      }
    }
  }
}

template <typename T>
void im2col_backward(T* dx, T* dweight, T* dbias, const T* dout, const T* x, const T* weight, const Conv2dShape& s,
                     T* workspace, int nthreads) {
  const int64_t G = s.groups, Cin_g = s.Cin / G, Cout_g = s.Cout / G, K = col_rows(s), L = s.OH * s.OW;
  const bool pointwise = is_pointwise(s);
  const int64_t per_thread = col_elems(s) + weight_elems(s);
  if (dx) std::fill(dx, dx + s.B * s.Cin * s.H * s.W, T(0));
  // Zero every partial up front: a team smaller than nthreads (nested call) leaves some slots unused.
  if (dweight)
    for (int t = 0; t < nthreads; ++t) std::fill_n(workspace + t * per_thread + col_elems(s), weight_elems(s), T(0));
#pragma omp parallel num_threads(nthreads)
  {
    T* col = workspace + omp_get_thread_num() * per_thread;  // (K, L)
    T* dw = col + col_elems(s);                              // (Cout, K) partial
#pragma omp for schedule(static)
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t g = 0; g < G; ++g) {
        const T* xg = x + (b * s.Cin + g * Cin_g) * s.H * s.W;
        const T* gg = dout + (b * s.Cout + g * Cout_g) * L;  // (Cout_g, L)
        const T* wg = weight + g * Cout_g * K;               // (Cout_g, K)
        if (dweight) {
          const T* cg = xg;
          if (!pointwise) {
            im2col(col, xg, Cin_g, s);
            cg = col;
          }
          gemm(false, true, Cout_g, K, L, T(1), gg, L, cg, L, T(1), dw + g * Cout_g * K, K);  // dW += dO col^T
        }
        if (dx) {
          T* dxg = dx + (b * s.Cin + g * Cin_g) * s.H * s.W;
          if (pointwise) {
            gemm(true, false, K, L, Cout_g, T(1), wg, K, gg, L, T(1), dxg, L);  // dx += W^T dO
          } else {
            gemm(true, false, K, L, Cout_g, T(1), wg, K, gg, L, T(0), col, L);  // dcol = W^T dO
            col2im_add(dxg, col, Cin_g, s);
          }
        }
      }
    }
  }
  if (dweight) {
    const int64_t n = weight_elems(s);
    std::fill(dweight, dweight + n, T(0));
    for (int t = 0; t < nthreads; ++t) {
      const T* part = workspace + t * per_thread + col_elems(s);
      for (int64_t i = 0; i < n; ++i) dweight[i] += part[i];
    }
  }
  if (dbias) bias_backward(dbias, dout, s, nthreads);
}

}  // namespace

int64_t conv2d_forward_workspace(const Conv2dShape& s, int nthreads, ConvPath path) {
  return takes_depthwise(s, path) ? nthreads * dw_forward_scratch(s) : im2col_forward_workspace(s, nthreads);
}

int64_t conv2d_backward_workspace(const Conv2dShape& s, int nthreads, ConvPath path) {
  return takes_depthwise(s, path) ? nthreads * dw_backward_scratch(s) : im2col_backward_workspace(s, nthreads);
}

template <typename T>
void conv2d_forward(T* out, const T* x, const T* weight, const T* bias, const Conv2dShape& s, T* workspace,
                    int nthreads, ConvPath path) {
  if (takes_depthwise(s, path))
    dw_forward(out, x, weight, bias, s, workspace, nthreads);
  else
    im2col_forward(out, x, weight, bias, s, workspace, nthreads);
}

template <typename T>
void conv2d_backward(T* dx, T* dweight, T* dbias, const T* dout, const T* x, const T* weight, const Conv2dShape& s,
                     T* workspace, int nthreads, ConvPath path) {
  if (!takes_depthwise(s, path)) return im2col_backward(dx, dweight, dbias, dout, x, weight, s, workspace, nthreads);
  dw_backward(dx, dweight, dout, x, weight, s, workspace, nthreads);
  if (dbias) bias_backward(dbias, dout, s, nthreads);
}

#define MEMTRAIN_INSTANTIATE(T)                                                                                  \
  template void conv2d_forward<T>(T*, const T*, const T*, const T*, const Conv2dShape&, T*, int, ConvPath);     \
  template void conv2d_backward<T>(T*, T*, T*, const T*, const T*, const T*, const Conv2dShape&, T*, int,       \
                                   ConvPath);
MEMTRAIN_CPU_FOR_COMPUTE_TYPES(MEMTRAIN_INSTANTIATE)
#undef MEMTRAIN_INSTANTIATE

// ---- the CPU backend's entries ----

namespace {

Conv2dShape conv_shape(const Shape& x, const Shape& w, std::int64_t stride, std::int64_t padding, std::int64_t groups) {
  Conv2dShape s{x[0], x[1], x[2], x[3], w[0], w[2], w[3], stride, padding, groups, 0, 0};
  s.OH = conv_out_size(s.H, s.KH, stride, padding);
  s.OW = conv_out_size(s.W, s.KW, stride, padding);
  return s;
}

// Column buffers: scratch on `device`, counted as workspace.
Tensor conv_workspace(std::int64_t elems, DType dtype, Device device) {
  CategoryGuard guard(MemoryCategory::workspace);
  return Tensor::empty({elems}, dtype, device);
}

}  // namespace

void CpuBackend::conv2d_forward(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                                std::int64_t stride, std::int64_t padding, std::int64_t groups) const {
  const Conv2dShape s = conv_shape(x.shape(), weight.shape(), stride, padding, groups);
  const Tensor xc = compute_operand(x), wc = compute_operand(weight), bc = compute_operand(bias);
  const Tensor y = compute_result(out, xc.dtype());
  const int nthreads = omp_get_max_threads();
  const Tensor ws =
      conv_workspace(std::max<std::int64_t>(conv2d_forward_workspace(s, nthreads), 1), xc.dtype(), x.device());
  if (runs_kernels()) {
    dispatch_compute("conv2d", xc.dtype(), [&](auto zero) {
      using T = decltype(zero);
      cpu::conv2d_forward<T>(y.data<T>(), xc.data<T>(), wc.data<T>(), data_or_null<T>(bc), s, ws.data<T>(), nthreads);
    });
  }
  finish_result(out, y);
}

void CpuBackend::conv2d_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dout,
                                 const Tensor& x, const Tensor& weight, const Shape& x_shape, const Shape& w_shape,
                                 std::int64_t stride, std::int64_t padding, std::int64_t groups) const {
  const Conv2dShape s = conv_shape(x_shape, w_shape, stride, padding, groups);
  const Tensor g = compute_operand(dout);
  const Tensor xc = dw.defined() ? compute_operand(x) : Tensor();
  const Tensor wc = dx.defined() ? compute_operand(weight) : Tensor();
  const DType ct = g.dtype();
  const Tensor dxc = compute_result(dx, ct), dwc = compute_result(dw, ct), dbc = compute_result(db, ct);
  const int nthreads = omp_get_max_threads();
  const Tensor ws =
      conv_workspace(std::max<std::int64_t>(conv2d_backward_workspace(s, nthreads), 1), ct, dout.device());
  if (runs_kernels()) {
    dispatch_compute("conv2d_backward", ct, [&](auto zero) {
      using T = decltype(zero);
      cpu::conv2d_backward<T>(data_or_null<T>(dxc), data_or_null<T>(dwc), data_or_null<T>(dbc), g.data<T>(),
                              data_or_null<T>(xc), data_or_null<T>(wc), s, ws.data<T>(), nthreads);
    });
  }
  finish_result(dx, dxc);
  finish_result(dw, dwc);
  finish_result(db, dbc);
}

}  // namespace memtrain::cpu

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

}  // namespace

int64_t conv2d_forward_workspace(const Conv2dShape& s, int nthreads) { return nthreads * col_elems(s); }

int64_t conv2d_backward_workspace(const Conv2dShape& s, int nthreads) {
  // A column buffer (also dcol) per thread, plus per-thread partial dW.
  return nthreads * (col_elems(s) + weight_elems(s));
}

template <typename T>
void conv2d_forward(T* out, const T* x, const T* weight, const T* bias, const Conv2dShape& s, T* workspace,
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
void conv2d_backward(T* dx, T* dweight, T* dbias, const T* dout, const T* x, const T* weight, const Conv2dShape& s,
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
  if (dbias) {
    for (int64_t co = 0; co < s.Cout; ++co) {
      T acc = 0;
      for (int64_t b = 0; b < s.B; ++b) {
        const T* gr = dout + (b * s.Cout + co) * L;
        for (int64_t l = 0; l < L; ++l) acc += gr[l];
      }
      dbias[co] = acc;
    }
  }
}

#define MEMTRAIN_INSTANTIATE(T)                                                                                  \
  template void conv2d_forward<T>(T*, const T*, const T*, const T*, const Conv2dShape&, T*, int);               \
  template void conv2d_backward<T>(T*, T*, T*, const T*, const T*, const T*, const Conv2dShape&, T*, int);
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
  const Tensor ws = conv_workspace(conv2d_backward_workspace(s, nthreads), ct, dout.device());
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

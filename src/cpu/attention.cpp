#include "cpu/attention.h"

#include "cpu/cpu_backend.h"
#include "cpu/instantiate.h"
#include "memtrain/core/allocator.h"

#include "cpu/fast_exp.h"
#include "cpu/gemm_typed.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace memtrain::cpu {

namespace {
constexpr int64_t Br = kAttentionTileQ, Bc = kAttentionTileK;
}  // namespace

int64_t attention_forward_workspace(int64_t, int64_t, int nthreads) { return nthreads * Br * Bc; }

int64_t attention_backward_workspace(int64_t T_len, int64_t, int nthreads) {
  return nthreads * (T_len + 2 * Br * Bc);
}

namespace {
// First element of head (b, h) = bh of an operand.
inline int64_t head_offset(const HeadLayout& l, int64_t bh, int64_t H) { return (bh / H) * l.batch + (bh % H) * l.head; }
}  // namespace

template <typename T>
void attention_forward(T* out, const HeadLayout& lo, T* lse, const T* q, const HeadLayout& lq, const T* k,
                       const HeadLayout& lk, const T* v, const HeadLayout& lv, int64_t B, int64_t H, int64_t T_len,
                       int64_t D, double scale, bool causal, T* workspace, int nthreads) {
  const int64_t BH = B * H;
  const int64_t tiles = (T_len + Br - 1) / Br;
  const T inf = std::numeric_limits<T>::infinity();
#pragma omp parallel num_threads(nthreads)
  {
    T* S = workspace + omp_get_thread_num() * Br * Bc;  // (Br, Bc) score tile, then probabilities
    T m[Br], l[Br];
#pragma omp for schedule(dynamic, 1) collapse(2)
    for (int64_t bh = 0; bh < BH; ++bh) {
      for (int64_t it = 0; it < tiles; ++it) {
        const int64_t i0 = it * Br, rows = std::min(Br, T_len - i0);
        const T* qi = q + head_offset(lq, bh, H) + i0 * lq.row;  // (rows, D), row stride lq.row
        T* oi = out + head_offset(lo, bh, H) + i0 * lo.row;      // (rows, D) accumulator
        const T* kh = k + head_offset(lk, bh, H);                // (T, D)
        const T* vh = v + head_offset(lv, bh, H);
        for (int64_t r = 0; r < rows; ++r) std::fill(oi + r * lo.row, oi + r * lo.row + D, T(0));
        for (int64_t r = 0; r < rows; ++r) m[r] = -inf, l[r] = 0;
        const int64_t kend = causal ? i0 + rows : T_len;
        for (int64_t j0 = 0; j0 < kend; j0 += Bc) {
          const int64_t cols = std::min(Bc, kend - j0);
          gemm(false, true, rows, cols, D, static_cast<T>(scale), qi, lq.row, kh + j0 * lk.row, lk.row, T(0), S, Bc);
          for (int64_t r = 0; r < rows; ++r) {
            T* s = S + r * Bc;
            // Causal: query i0 + r sees keys <= i0 + r.
            const int64_t visible = causal ? std::clamp<int64_t>(i0 + r - j0 + 1, 0, cols) : cols;
            if (visible == 0) {  // the whole tile row is masked: nothing to add, no rescale
              std::fill(s, s + cols, T(0));
              continue;
            }
            T mx = m[r];
            for (int64_t c = 0; c < visible; ++c) mx = std::max(mx, s[c]);
            const T alpha = std::exp(m[r] - mx);  // 0 on the first tile (m = -inf)
            const T sum = exp_shifted(s, mx, s, visible);  // s <- e^(s - mx), vectorized
            for (int64_t c = visible; c < cols; ++c) s[c] = 0;
            l[r] = l[r] * alpha + sum;
            m[r] = mx;
            if (alpha != T(1)) {
              T* o = oi + r * lo.row;
              for (int64_t d = 0; d < D; ++d) o[d] *= alpha;
            }
          }
          gemm(false, false, rows, D, cols, T(1), S, Bc, vh + j0 * lv.row, lv.row, T(1), oi, lo.row);
        }
        for (int64_t r = 0; r < rows; ++r) {
          const T inv = T(1) / l[r];
          T* o = oi + r * lo.row;
          for (int64_t d = 0; d < D; ++d) o[d] *= inv;
          lse[bh * T_len + i0 + r] = m[r] + std::log(l[r]);
        }
      }
    }
  }
}

template <typename T>
void attention_backward(T* dq, const HeadLayout& ldq, T* dk, const HeadLayout& ldk, T* dv, const HeadLayout& ldv,
                        const T* dout, const HeadLayout& ldo, const T* q, const HeadLayout& lq, const T* k,
                        const HeadLayout& lk, const T* v, const HeadLayout& lv, const T* out, const HeadLayout& lo,
                        const T* lse, int64_t B, int64_t H, int64_t T_len, int64_t D, double scale, bool causal,
                        T* workspace, int nthreads) {
  const int64_t BH = B * H;
  const T sc = static_cast<T>(scale);
#pragma omp parallel num_threads(nthreads)
  {
    T* ws = workspace + omp_get_thread_num() * (T_len + 2 * Br * Bc);
    T* delta = ws;                 // (T) rowsum(dO * O)
    T* P = ws + T_len;             // (Br, Bc)
    T* dS = ws + T_len + Br * Bc;  // (Br, Bc)
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < BH; ++bh) {
      const T *qh = q + head_offset(lq, bh, H), *kh = k + head_offset(lk, bh, H), *vh = v + head_offset(lv, bh, H);
      const T *oh = out + head_offset(lo, bh, H), *gh = dout + head_offset(ldo, bh, H);
      const T* lh = lse + bh * T_len;
      T *dqh = dq + head_offset(ldq, bh, H), *dkh = dk + head_offset(ldk, bh, H), *dvh = dv + head_offset(ldv, bh, H);
      for (int64_t t = 0; t < T_len; ++t) {
        T s = 0;
        for (int64_t d = 0; d < D; ++d) s += gh[t * ldo.row + d] * oh[t * lo.row + d];
        delta[t] = s;
        std::fill(dqh + t * ldq.row, dqh + t * ldq.row + D, T(0));
        std::fill(dkh + t * ldk.row, dkh + t * ldk.row + D, T(0));
        std::fill(dvh + t * ldv.row, dvh + t * ldv.row + D, T(0));
      }
      for (int64_t j0 = 0; j0 < T_len; j0 += Bc) {
        const int64_t cols = std::min(Bc, T_len - j0);
        const T* kj = kh + j0 * lk.row;  // (cols, D)
        const T* vj = vh + j0 * lv.row;
        T* dkj = dkh + j0 * ldk.row;
        T* dvj = dvh + j0 * ldv.row;
        // Causal: only query rows >= j0 see this key tile.
        for (int64_t i0 = causal ? (j0 / Br) * Br : 0; i0 < T_len; i0 += Br) {
          const int64_t rows = std::min(Br, T_len - i0);
          const T* qi = qh + i0 * lq.row;  // (rows, D)
          const T* gi = gh + i0 * ldo.row;
          gemm(false, true, rows, cols, D, sc, qi, lq.row, kj, lk.row, T(0), P, Bc);
          for (int64_t r = 0; r < rows; ++r) {
            T* p = P + r * Bc;
            const int64_t visible = causal ? std::clamp<int64_t>(i0 + r - j0 + 1, 0, cols) : cols;
            exp_shifted(p, lh[i0 + r], p, visible);  // P = e^(S - lse)
            for (int64_t c = visible; c < cols; ++c) p[c] = 0;
          }
          gemm(true, false, cols, D, rows, T(1), P, Bc, gi, ldo.row, T(1), dvj, ldv.row);  // dV_j += P^T dO_i
          gemm(false, true, rows, cols, D, T(1), gi, ldo.row, vj, lv.row, T(0), dS, Bc);  // dP = dO_i V_j^T
          for (int64_t r = 0; r < rows; ++r) {
            const T dl = delta[i0 + r];
            for (int64_t c = 0; c < cols; ++c) dS[r * Bc + c] = P[r * Bc + c] * (dS[r * Bc + c] - dl);
          }
          gemm(false, false, rows, D, cols, sc, dS, Bc, kj, lk.row, T(1), dqh + i0 * ldq.row, ldq.row);  // dQ_i += s dS K_j
          gemm(true, false, cols, D, rows, sc, dS, Bc, qi, lq.row, T(1), dkj, ldk.row);  // dK_j += s dS^T Q_i
        }
      }
    }
  }
}

#define MEMTRAIN_INSTANTIATE(T)                                                                                  \
  template void attention_forward<T>(T*, const HeadLayout&, T*, const T*, const HeadLayout&, const T*,           \
                                     const HeadLayout&, const T*, const HeadLayout&, int64_t, int64_t, int64_t,   \
                                     int64_t, double, bool, T*, int);                                            \
  template void attention_backward<T>(T*, const HeadLayout&, T*, const HeadLayout&, T*, const HeadLayout&,       \
                                      const T*, const HeadLayout&, const T*, const HeadLayout&, const T*,        \
                                      const HeadLayout&, const T*, const HeadLayout&, const T*, const HeadLayout&, \
                                      const T*, int64_t, int64_t, int64_t, int64_t, double, bool, T*, int);
MEMTRAIN_CPU_FOR_COMPUTE_TYPES(MEMTRAIN_INSTANTIATE)
#undef MEMTRAIN_INSTANTIATE

// ---- the CPU backend's entries ----

namespace {

// t detached in its compute dtype, copied only when its last dim is not unit-stride.
Tensor head_input(const Tensor& t) {
  Tensor c = t.detach().to(compute_dtype(t.dtype()));
  return c.stride(3) == 1 || c.size(3) == 1 ? c : c.contiguous();
}

HeadLayout layout_of(const Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

// Score tiles: scratch on `device`, counted as workspace.
Tensor attention_workspace(std::int64_t elems, DType dtype, Device device) {
  CategoryGuard guard(MemoryCategory::workspace);
  return Tensor::empty({elems}, dtype, device);
}

// The kernel on f32/f64 operands: y [B, H, T, D] (any layout_of strides) and lse [B, H, T] written.
void attention_forward_kernel(const Tensor& y, const Tensor& lse, const Tensor& qc, const Tensor& kc, const Tensor& vc,
                              bool causal, bool run) {
  const std::int64_t B = qc.size(0), H = qc.size(1), T_len = qc.size(2), D = qc.size(3);
  const int nthreads = omp_get_max_threads();
  const Tensor ws = attention_workspace(attention_forward_workspace(T_len, D, nthreads), qc.dtype(), qc.device());
  if (!run) return;
  dispatch_compute("scaled_dot_product_attention", qc.dtype(), [&](auto zero) {
    using T = decltype(zero);
    attention_forward<T>(y.data<T>(), layout_of(y), lse.data<T>(), qc.data<T>(), layout_of(qc), kc.data<T>(),
                         layout_of(kc), vc.data<T>(), layout_of(vc), B, H, T_len, D,
                         1.0 / std::sqrt(static_cast<double>(D)), causal, ws.data<T>(), nthreads);
  });
}

}  // namespace

DType CpuBackend::attention_stats_dtype(DType q) const { return compute_dtype(q); }

// f32/f64: one [B, T, 3, H, D] buffer (split(qkv)'s backward takes it over); narrow: three gradients rounded from
// that f32 buffer.
bool CpuBackend::attention_fused_grads(const Tensor& q, const Tensor&, const Tensor&) const {
  return compute_dtype(q.dtype()) == q.dtype();
}

void CpuBackend::attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                                   const Tensor& v, bool causal) const {
  const bool run = runs_kernels();
  if (q.dtype() == DType::bf16 || q.dtype() == DType::f16) {
    // Narrow q, k, v: widened one batch element at a time, so the f32 copies of q, k, v and of the output are
    // 1/B of their full size (mixed precision halves activations; full f32 copies would give that back at the
    // forward's peak). The kernel sees the same rows either way: the same bits as widening everything.
    const std::int64_t T_len = q.size(2), H = q.size(1), D = q.size(3);
    const Tensor yb_bthd = Tensor::empty({1, T_len, H, D}, DType::f32, q.device());
    const Tensor yb = yb_bthd.transpose(1, 2);
    for (std::int64_t b = 0; b < q.size(0); ++b) {
      attention_forward_kernel(yb, lse.narrow(0, b, 1), head_input(q.narrow(0, b, 1)), head_input(k.narrow(0, b, 1)),
                               head_input(v.narrow(0, b, 1)), causal, run);
      out.narrow(0, b, 1).copy_(yb);
    }
    return;
  }
  attention_forward_kernel(out, lse, head_input(q), head_input(k), head_input(v), causal, run);
}

void CpuBackend::attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                                    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                    const Tensor& lse, bool causal) const {
  const Tensor g = head_input(dout), qc = head_input(q), kc = head_input(k), vc = head_input(v), oc = head_input(out);
  const std::int64_t B = q.size(0), H = q.size(1), T_len = q.size(2), D = q.size(3);
  // Narrow gradients are computed in one f32 [B, T, 3, H, D] buffer and rounded into dq, dk, dv.
  const bool direct = dq.dtype() == qc.dtype();
  const Tensor grads = direct ? Tensor() : Tensor::empty({B, T_len, 3, H, D}, qc.dtype(), q.device());
  const Tensor dqc = direct ? dq : grads.select(2, 0).transpose(1, 2),
               dkc = direct ? dk : grads.select(2, 1).transpose(1, 2),
               dvc = direct ? dv : grads.select(2, 2).transpose(1, 2);
  const int nthreads = omp_get_max_threads();
  const Tensor ws = attention_workspace(attention_backward_workspace(T_len, D, nthreads), qc.dtype(), q.device());
  if (runs_kernels()) {
    dispatch_compute("scaled_dot_product_attention_backward", qc.dtype(), [&](auto zero) {
      using T = decltype(zero);
      cpu::attention_backward<T>(dqc.data<T>(), layout_of(dqc), dkc.data<T>(), layout_of(dkc), dvc.data<T>(),
                                 layout_of(dvc), g.data<T>(), layout_of(g), qc.data<T>(), layout_of(qc), kc.data<T>(),
                                 layout_of(kc), vc.data<T>(), layout_of(vc), oc.data<T>(), layout_of(oc),
                                 lse.data<T>(), B, H, T_len, D, 1.0 / std::sqrt(static_cast<double>(D)), causal,
                                 ws.data<T>(), nthreads);
    });
  }
  if (!direct) {
    Tensor(dq).copy_(dqc);
    Tensor(dk).copy_(dkc);
    Tensor(dv).copy_(dvc);
  }
}

}  // namespace memtrain::cpu

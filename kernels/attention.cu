// Scaled dot-product attention (causal or full), FlashAttention-2 style, forward and backward.
//
// Algorithm (the same math as src/cpu/attention.cpp):
//   forward   one block per (head bh, query tile of BR = 64 rows). The scaled query tile stays in shared
//             memory; key/value tiles of BC rows stream through it. Per tile: S = scale * Q K^T, masked
//             (key >= T, or key > query when causal) to -inf; online softmax with a running max m and sum l
//             per row in f32; O = O * alpha + P V with alpha = exp(m_old - m_new). At the end out = O / l and
//             lse = m + log(l). Causal: key tiles wholly above the diagonal are never loaded.
//   backward  three kernels, no atomics, so results are deterministic:
//             delta: delta[bh, t] = rowsum(dO * O) in f32 (one warp per row);
//             dK/dV: one block per (bh, key tile of 64 rows) keeps K_j, V_j in shared memory and dK_j, dV_j
//                    in registers, and loops over the query tiles that see it (causal: from the tile holding
//                    query j0 on): P^T = exp(scale K Q^T - lse), dP^T = V dO^T, dS^T = P^T (dP^T - delta),
//                    dV += P^T dO, dK += scale dS^T Q;
//             dQ:    one block per (bh, query tile of 64 rows) recomputes P and dS over the key tiles it sees
//                    and accumulates dQ = scale dS K in registers.
//             This recomputes S and dP once more than the atomic-dQ variant (7 tile GEMMs instead of 5).
//
// Thread mapping: 256 threads as a 16 x 16 grid, ty = tid / 16, tx = tid % 16. A score-like tile (rows x cols)
// is split so that thread (ty, tx) owns rows ty * R + i (i < R = rows / 16) and columns tx + 16 j (j < cols /
// 16); an output tile (rows x D) likewise with columns tx + 16 c (c < D / 16). The 16 threads owning a row
// are one half-warp, so row reductions (max, sum) are __shfl_xor_sync over lane bits 0..3.
// Shared tiles are f32 with a row stride of D + 4 (or cols + 4): rows stay 16-byte aligned for float4 reads
// along D, and threads with neighbouring column indices read rows 4 banks apart, so reads are conflict-free.
// All math is f32 FMA (no tensor cores): bf16 operands are widened when staged into shared memory, and
// the outputs are rounded once. Element offsets are 64-bit; in-head row indices (< T <= 2^30) are int.
#include "attention.cuh"
#include "device_math.cuh"

#include <algorithm>
#include <cstdint>

namespace memtrain::cuda {
namespace {

constexpr int kThreads = 256;  // 16 x 16 (see the top of the file); every kernel assumes this block size
constexpr int kBigTile = 64;   // query rows (forward, dQ) and key rows (dK/dV) per block
constexpr std::int64_t kMaxGrid = 2147483647;

// The other tile side: smaller for D = 128 to keep shared memory (and registers) in bounds.
__host__ __device__ constexpr int small_tile(int d) { return d >= 128 ? 32 : 64; }

constexpr float kInf = __builtin_huge_valf();

using device::from_f32;
using device::to_f32;

__device__ inline float component(const float4& f, int u) { return u == 0 ? f.x : u == 1 ? f.y : u == 2 ? f.z : f.w; }

// First element of head bh (= b * H + h) of an operand.
__device__ inline std::int64_t head_offset(const AttentionStrides& s, std::int64_t bh, std::int64_t H) {
  return (bh / H) * s.batch + (bh % H) * s.head;
}

// dst[r][d] (row stride D + 4) = src row (row0 + r) as f32, for r < ROWS; rows at or past T_len are zero so
// that masked products stay finite (0 * garbage could be NaN). Neighbouring threads read neighbouring d.
template <int ROWS, int D, typename T>
__device__ inline void load_tile(float* dst, const T* src, std::int64_t row_stride, int row0, int T_len) {
  constexpr int LD = D + 4;
  for (int e = threadIdx.x; e < ROWS * D; e += kThreads) {
    const int r = e / D, d = e % D;
    const int t = row0 + r;
    dst[r * LD + d] = t < T_len ? to_f32(src[static_cast<std::int64_t>(t) * row_stride + d]) : 0.f;
  }
}

// dst[r] = src[base + row0 + r] for r < ROWS (0 past T_len); f32 per-row statistics (lse, delta).
template <int ROWS>
__device__ inline void load_row_stats(float* dst, const float* src, std::int64_t base, int row0, int T_len) {
  for (int r = threadIdx.x; r < ROWS; r += kThreads) dst[r] = row0 + r < T_len ? src[base + row0 + r] : 0.f;
}

// acc[i][j] = sum_d a[ty R + i][d] * b[tx + 16 j][d]; a and b are shared tiles with row stride D + 4.
template <int R, int C, int D>
__device__ inline void dot_tile(const float* a, const float* b, int ty, int tx, float (&acc)[R][C]) {
  constexpr int LD = D + 4;
#pragma unroll
  for (int i = 0; i < R; ++i) {
#pragma unroll
    for (int j = 0; j < C; ++j) acc[i][j] = 0.f;
  }
#pragma unroll 4
  for (int d = 0; d < D; d += 4) {
    float4 av[R], bv[C];
#pragma unroll
    for (int i = 0; i < R; ++i) av[i] = *reinterpret_cast<const float4*>(a + (ty * R + i) * LD + d);
#pragma unroll
    for (int j = 0; j < C; ++j) bv[j] = *reinterpret_cast<const float4*>(b + (tx + 16 * j) * LD + d);
#pragma unroll
    for (int i = 0; i < R; ++i) {
#pragma unroll
      for (int j = 0; j < C; ++j) {
        float s = acc[i][j];
        s = fmaf(av[i].x, bv[j].x, s);
        s = fmaf(av[i].y, bv[j].y, s);
        s = fmaf(av[i].z, bv[j].z, s);
        s = fmaf(av[i].w, bv[j].w, s);
        acc[i][j] = s;
      }
    }
  }
}

// acc[i][c] += sum_n p[ty R + i][n] * v[n][tx + 16 c] for n < N; p has row stride N + 4, v has D + 4.
template <int R, int N, int D>
__device__ inline void accumulate_pv(const float* p, const float* v, int ty, int tx, float (&acc)[R][D / 16]) {
  constexpr int LD = D + 4, LP = N + 4, DC = D / 16;
#pragma unroll 2
  for (int n = 0; n < N; n += 4) {
    float4 pv[R];
#pragma unroll
    for (int i = 0; i < R; ++i) pv[i] = *reinterpret_cast<const float4*>(p + (ty * R + i) * LP + n);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      float vv[DC];
#pragma unroll
      for (int c = 0; c < DC; ++c) vv[c] = v[(n + u) * LD + tx + 16 * c];
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const float pu = component(pv[i], u);
#pragma unroll
        for (int c = 0; c < DC; ++c) acc[i][c] = fmaf(pu, vv[c], acc[i][c]);
      }
    }
  }
}

__device__ inline float half_warp_max(float x) {
#pragma unroll
  for (int off = 8; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}
__device__ inline float half_warp_sum(float x) {
#pragma unroll
  for (int off = 8; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

// ---- shared memory sizes (floats), one formula per kernel, used by kernel and launcher alike ----

template <int D>
constexpr int forward_smem_floats() {
  constexpr int BR = kBigTile, BC = small_tile(D);
  return (BR + 2 * BC) * (D + 4) + BR * (BC + 4);
}
template <int D>
constexpr int dkdv_smem_floats() {
  constexpr int BK = kBigTile, BQ = small_tile(D);
  return (2 * BK + 2 * BQ) * (D + 4) + 2 * BK * (BQ + 4) + 2 * BQ;
}
template <int D>
constexpr int dq_smem_floats() {
  constexpr int BQ = kBigTile, BK = small_tile(D);
  return (2 * BQ + 2 * BK) * (D + 4) + BQ * (BK + 4) + 2 * BQ;
}

// ---- forward ----

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(T* __restrict__ out, AttentionStrides lo, float* __restrict__ lse,
                             const T* __restrict__ q, AttentionStrides lq, const T* __restrict__ k,
                             AttentionStrides lk, const T* __restrict__ v, AttentionStrides lv, std::int64_t H,
                             int T_len, int tiles, float scale, bool causal) {
  constexpr int BR = kBigTile, BC = small_tile(D), LD = D + 4, LP = BC + 4;
  constexpr int R = BR / 16, C = BC / 16, DC = D / 16;
  extern __shared__ __align__(16) float smem[];
  float* q_s = smem;             // (BR, D)
  float* k_s = q_s + BR * LD;    // (BC, D)
  float* v_s = k_s + BC * LD;    // (BC, D)
  float* p_s = v_s + BC * LD;    // (BR, BC) probabilities of the current key tile

  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const std::int64_t block = blockIdx.x;
  const std::int64_t bh = block / tiles;
  // Last query tiles first: under causal masking they have the most key tiles to visit.
  const int i0 = (tiles - 1 - static_cast<int>(block % tiles)) * BR;
  const T* qh = q + head_offset(lq, bh, H);
  const T* kh = k + head_offset(lk, bh, H);
  const T* vh = v + head_offset(lv, bh, H);
  T* oh = out + head_offset(lo, bh, H);

  load_tile<BR, D>(q_s, qh, lq.row, i0, T_len);
  float m[R], l[R], o[R][DC];  // l: this thread's share of the row sum, rescaled like the whole
#pragma unroll
  for (int i = 0; i < R; ++i) {
    m[i] = -kInf;
    l[i] = 0.f;
#pragma unroll
    for (int c = 0; c < DC; ++c) o[i][c] = 0.f;
  }

  const int kend = causal ? min(T_len, i0 + BR) : T_len;  // query i sees keys <= i
  for (int j0 = 0; j0 < kend; j0 += BC) {
    load_tile<BC, D>(k_s, kh, lk.row, j0, T_len);
    load_tile<BC, D>(v_s, vh, lv.row, j0, T_len);
    __syncthreads();  // q_s (first pass), k_s, v_s ready

    float s[R][C];
    dot_tile<R, C, D>(q_s, k_s, ty, tx, s);
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int row = i0 + ty * R + i;
      float mx = -kInf;
#pragma unroll
      for (int j = 0; j < C; ++j) {
        const int col = j0 + tx + 16 * j;
        const bool visible = col < T_len && (!causal || col <= row);
        s[i][j] = visible ? s[i][j] * scale : -kInf;
        mx = fmaxf(mx, s[i][j]);
      }
      const float m_new = fmaxf(m[i], half_warp_max(mx));
      // A row with nothing visible yet keeps m = -inf, p = 0 and alpha = 0 (never exp(-inf - -inf)).
      const float alpha = m[i] == -kInf ? 0.f : expf(m[i] - m_new);
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < C; ++j) {
        const float p = s[i][j] == -kInf ? 0.f : expf(s[i][j] - m_new);
        p_s[(ty * R + i) * LP + tx + 16 * j] = p;
        sum += p;
      }
      l[i] = l[i] * alpha + sum;
      m[i] = m_new;
#pragma unroll
      for (int c = 0; c < DC; ++c) o[i][c] *= alpha;
    }
    __syncthreads();  // p_s complete
    accumulate_pv<R, BC, D>(p_s, v_s, ty, tx, o);
    __syncthreads();  // k_s, v_s, p_s free for the next tile
  }

#pragma unroll
  for (int i = 0; i < R; ++i) {
    const float total = half_warp_sum(l[i]);  // every lane takes part, before the row bound check
    const int row = i0 + ty * R + i;
    if (row < T_len) {
      const float inv = 1.f / total;
      T* orow = oh + static_cast<std::int64_t>(row) * lo.row;
#pragma unroll
      for (int c = 0; c < DC; ++c) orow[tx + 16 * c] = from_f32<T>(o[i][c] * inv);
      if (tx == 0) lse[bh * T_len + row] = m[i] + logf(total);
    }
  }
}

// ---- backward ----

// delta[r] = sum_d dout[r][d] * out[r][d] for the flat row r = bh * T + t; one warp per row.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    attention_delta_kernel(float* __restrict__ delta, const T* __restrict__ dout, AttentionStrides ldo,
                           const T* __restrict__ out, AttentionStrides lo, std::int64_t H, int T_len, int D,
                           std::int64_t rows) {
  const int lane = threadIdx.x % 32;
  const std::int64_t warp = (static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (kThreads / 32);
  for (std::int64_t r = warp; r < rows; r += warps) {  // warp-uniform loop: the shuffles see all lanes
    const std::int64_t bh = r / T_len, t = r % T_len;
    const T* g = dout + head_offset(ldo, bh, H) + t * ldo.row;
    const T* o = out + head_offset(lo, bh, H) + t * lo.row;
    float s = 0.f;
    for (int d = lane; d < D; d += 32) s = fmaf(to_f32(g[d]), to_f32(o[d]), s);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) delta[r] = s;
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads, 1)
    attention_backward_dkdv_kernel(T* __restrict__ dk, AttentionStrides ldk, T* __restrict__ dv,
                                   AttentionStrides ldv, const T* __restrict__ dout, AttentionStrides ldo,
                                   const T* __restrict__ q, AttentionStrides lq, const T* __restrict__ k,
                                   AttentionStrides lk, const T* __restrict__ v, AttentionStrides lv,
                                   const float* __restrict__ lse, const float* __restrict__ delta, std::int64_t H,
                                   int T_len, int tiles, float scale, bool causal) {
  constexpr int BK = kBigTile, BQ = small_tile(D), LD = D + 4, LP = BQ + 4;
  constexpr int R = BK / 16, C = BQ / 16, DC = D / 16;
  extern __shared__ __align__(16) float smem[];
  float* k_s = smem;                 // (BK, D)
  float* v_s = k_s + BK * LD;        // (BK, D)
  float* q_s = v_s + BK * LD;        // (BQ, D)
  float* do_s = q_s + BQ * LD;       // (BQ, D)
  float* pt_s = do_s + BQ * LD;      // (BK, BQ) P^T
  float* dst_s = pt_s + BK * LP;     // (BK, BQ) dS^T
  float* lse_s = dst_s + BK * LP;    // (BQ)
  float* delta_s = lse_s + BQ;       // (BQ)

  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const std::int64_t block = blockIdx.x;
  const std::int64_t bh = block / tiles;
  const int j0 = static_cast<int>(block % tiles) * BK;  // first tiles first: under causal masking they see the most
  const T* qh = q + head_offset(lq, bh, H);
  const T* kh = k + head_offset(lk, bh, H);
  const T* vh = v + head_offset(lv, bh, H);
  const T* gh = dout + head_offset(ldo, bh, H);
  const std::int64_t stats = bh * T_len;

  load_tile<BK, D>(k_s, kh, lk.row, j0, T_len);
  load_tile<BK, D>(v_s, vh, lv.row, j0, T_len);
  float dk_acc[R][DC], dv_acc[R][DC];
#pragma unroll
  for (int i = 0; i < R; ++i) {
#pragma unroll
    for (int c = 0; c < DC; ++c) dk_acc[i][c] = dv_acc[i][c] = 0.f;
  }

  for (int i0 = causal ? (j0 / BQ) * BQ : 0; i0 < T_len; i0 += BQ) {  // causal: queries >= j0 only
    load_tile<BQ, D>(q_s, qh, lq.row, i0, T_len);
    load_tile<BQ, D>(do_s, gh, ldo.row, i0, T_len);
    load_row_stats<BQ>(lse_s, lse, stats, i0, T_len);
    load_row_stats<BQ>(delta_s, delta, stats, i0, T_len);
    __syncthreads();

    float st[R][C], dpt[R][C];
    dot_tile<R, C, D>(k_s, q_s, ty, tx, st);    // S^T = K Q^T (unscaled)
    dot_tile<R, C, D>(v_s, do_s, ty, tx, dpt);  // dP^T = V dO^T
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int key = j0 + ty * R + i;
#pragma unroll
      for (int j = 0; j < C; ++j) {
        const int qc = tx + 16 * j, query = i0 + qc;
        const bool visible = key < T_len && query < T_len && (!causal || key <= query);
        const float p = visible ? expf(st[i][j] * scale - lse_s[qc]) : 0.f;
        pt_s[(ty * R + i) * LP + qc] = p;
        dst_s[(ty * R + i) * LP + qc] = p * (dpt[i][j] - delta_s[qc]);
      }
    }
    __syncthreads();
    accumulate_pv<R, BQ, D>(pt_s, do_s, ty, tx, dv_acc);  // dV_j += P^T dO_i
    accumulate_pv<R, BQ, D>(dst_s, q_s, ty, tx, dk_acc);  // dK_j += dS^T Q_i (scale applied at the end)
    __syncthreads();
  }

  T* dkh = dk + head_offset(ldk, bh, H);
  T* dvh = dv + head_offset(ldv, bh, H);
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int key = j0 + ty * R + i;
    if (key >= T_len) continue;
    T* dkrow = dkh + static_cast<std::int64_t>(key) * ldk.row;
    T* dvrow = dvh + static_cast<std::int64_t>(key) * ldv.row;
#pragma unroll
    for (int c = 0; c < DC; ++c) {
      dkrow[tx + 16 * c] = from_f32<T>(dk_acc[i][c] * scale);
      dvrow[tx + 16 * c] = from_f32<T>(dv_acc[i][c]);
    }
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads, 1)
    attention_backward_dq_kernel(T* __restrict__ dq, AttentionStrides ldq, const T* __restrict__ dout,
                                 AttentionStrides ldo, const T* __restrict__ q, AttentionStrides lq,
                                 const T* __restrict__ k, AttentionStrides lk, const T* __restrict__ v,
                                 AttentionStrides lv, const float* __restrict__ lse, const float* __restrict__ delta,
                                 std::int64_t H, int T_len, int tiles, float scale, bool causal) {
  constexpr int BQ = kBigTile, BK = small_tile(D), LD = D + 4, LP = BK + 4;
  constexpr int R = BQ / 16, C = BK / 16, DC = D / 16;
  extern __shared__ __align__(16) float smem[];
  float* q_s = smem;                // (BQ, D)
  float* do_s = q_s + BQ * LD;      // (BQ, D)
  float* k_s = do_s + BQ * LD;      // (BK, D)
  float* v_s = k_s + BK * LD;       // (BK, D)
  float* ds_s = v_s + BK * LD;      // (BQ, BK) dS
  float* lse_s = ds_s + BQ * LP;    // (BQ)
  float* delta_s = lse_s + BQ;      // (BQ)

  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const std::int64_t block = blockIdx.x;
  const std::int64_t bh = block / tiles;
  const int i0 = (tiles - 1 - static_cast<int>(block % tiles)) * BQ;  // last tiles (most work) first
  const T* qh = q + head_offset(lq, bh, H);
  const T* kh = k + head_offset(lk, bh, H);
  const T* vh = v + head_offset(lv, bh, H);
  const T* gh = dout + head_offset(ldo, bh, H);
  const std::int64_t stats = bh * T_len;

  load_tile<BQ, D>(q_s, qh, lq.row, i0, T_len);
  load_tile<BQ, D>(do_s, gh, ldo.row, i0, T_len);
  load_row_stats<BQ>(lse_s, lse, stats, i0, T_len);
  load_row_stats<BQ>(delta_s, delta, stats, i0, T_len);
  float dq_acc[R][DC];
#pragma unroll
  for (int i = 0; i < R; ++i) {
#pragma unroll
    for (int c = 0; c < DC; ++c) dq_acc[i][c] = 0.f;
  }

  const int kend = causal ? min(T_len, i0 + BQ) : T_len;  // >= 1, so the loop's first barrier covers q_s etc.
  for (int j0 = 0; j0 < kend; j0 += BK) {
    load_tile<BK, D>(k_s, kh, lk.row, j0, T_len);
    load_tile<BK, D>(v_s, vh, lv.row, j0, T_len);
    __syncthreads();

    float s[R][C], dp[R][C];
    dot_tile<R, C, D>(q_s, k_s, ty, tx, s);    // S = Q K^T (unscaled)
    dot_tile<R, C, D>(do_s, v_s, ty, tx, dp);  // dP = dO V^T
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int r = ty * R + i, query = i0 + r;
#pragma unroll
      for (int j = 0; j < C; ++j) {
        const int key = j0 + tx + 16 * j;
        const bool visible = key < T_len && query < T_len && (!causal || key <= query);
        const float p = visible ? expf(s[i][j] * scale - lse_s[r]) : 0.f;
        ds_s[r * LP + tx + 16 * j] = p * (dp[i][j] - delta_s[r]);
      }
    }
    __syncthreads();
    accumulate_pv<R, BK, D>(ds_s, k_s, ty, tx, dq_acc);  // dQ_i += dS K_j (scale applied at the end)
    __syncthreads();
  }

  T* dqh = dq + head_offset(ldq, bh, H);
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int query = i0 + ty * R + i;
    if (query >= T_len) continue;
    T* dqrow = dqh + static_cast<std::int64_t>(query) * ldq.row;
#pragma unroll
    for (int c = 0; c < DC; ++c) dqrow[tx + 16 * c] = from_f32<T>(dq_acc[i][c] * scale);
  }
}

// ---- launchers ----

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Opts the kernel in to `bytes` of dynamic shared memory when that is past the 48 KiB default.
template <typename Kernel>
cudaError_t allow_smem(Kernel kernel, std::size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

template <typename T, int D>
cudaError_t forward_for(T* out, AttentionStrides lo, float* lse, const T* q, AttentionStrides lq, const T* k,
                        AttentionStrides lk, const T* v, AttentionStrides lv, std::int64_t BH, std::int64_t H,
                        std::int64_t T_len, float scale, bool causal, cudaStream_t stream) {
  const std::int64_t tiles = ceil_div(T_len, kBigTile);
  if (BH * tiles > kMaxGrid) return cudaErrorInvalidConfiguration;
  const std::size_t smem = sizeof(float) * forward_smem_floats<D>();
  if (cudaError_t err = allow_smem(attention_forward_kernel<T, D>, smem); err != cudaSuccess) return err;
  attention_forward_kernel<T, D><<<static_cast<unsigned>(BH * tiles), kThreads, smem, stream>>>(
      out, lo, lse, q, lq, k, lk, v, lv, H, static_cast<int>(T_len), static_cast<int>(tiles), scale, causal);
  return cudaGetLastError();
}

template <typename T, int D>
cudaError_t backward_for(T* dq, AttentionStrides ldq, T* dk, AttentionStrides ldk, T* dv, AttentionStrides ldv,
                         const T* dout, AttentionStrides ldo, const T* q, AttentionStrides lq, const T* k,
                         AttentionStrides lk, const T* v, AttentionStrides lv, const T* out, AttentionStrides lo,
                         const float* lse, float* delta, std::int64_t BH, std::int64_t H, std::int64_t T_len,
                         float scale, bool causal, cudaStream_t stream) {
  const std::int64_t tiles = ceil_div(T_len, kBigTile);  // key tiles (dK/dV) and query tiles (dQ): both 64 rows
  if (BH * tiles > kMaxGrid) return cudaErrorInvalidConfiguration;
  const int t32 = static_cast<int>(T_len), tiles32 = static_cast<int>(tiles);

  const std::int64_t rows = BH * T_len;
  const std::int64_t delta_blocks = std::min<std::int64_t>(ceil_div(rows, kThreads / 32), 8192);
  attention_delta_kernel<T><<<static_cast<unsigned>(delta_blocks), kThreads, 0, stream>>>(delta, dout, ldo, out, lo,
                                                                                           H, t32, D, rows);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;

  const std::size_t smem_dkdv = sizeof(float) * dkdv_smem_floats<D>();
  if (cudaError_t err = allow_smem(attention_backward_dkdv_kernel<T, D>, smem_dkdv); err != cudaSuccess) return err;
  attention_backward_dkdv_kernel<T, D><<<static_cast<unsigned>(BH * tiles), kThreads, smem_dkdv, stream>>>(
      dk, ldk, dv, ldv, dout, ldo, q, lq, k, lk, v, lv, lse, delta, H, t32, tiles32, scale, causal);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;

  const std::size_t smem_dq = sizeof(float) * dq_smem_floats<D>();
  if (cudaError_t err = allow_smem(attention_backward_dq_kernel<T, D>, smem_dq); err != cudaSuccess) return err;
  attention_backward_dq_kernel<T, D><<<static_cast<unsigned>(BH * tiles), kThreads, smem_dq, stream>>>(
      dq, ldq, dout, ldo, q, lq, k, lk, v, lv, lse, delta, H, t32, tiles32, scale, causal);
  return cudaGetLastError();
}

template <typename T>
cudaError_t forward_any(T* out, AttentionStrides lo, float* lse, const T* q, AttentionStrides lq, const T* k,
                        AttentionStrides lk, const T* v, AttentionStrides lv, std::int64_t BH, std::int64_t H,
                        std::int64_t T_len, int D, float scale, bool causal, cudaStream_t stream) {
  if (BH <= 0 || T_len <= 0) return cudaSuccess;
  return with_head_dim(D, [&](auto d) {
    return forward_for<T, decltype(d)::value>(out, lo, lse, q, lq, k, lk, v, lv, BH, H, T_len, scale, causal, stream);
  });
}

template <typename T>
cudaError_t backward_any(T* dq, AttentionStrides ldq, T* dk, AttentionStrides ldk, T* dv, AttentionStrides ldv,
                         const T* dout, AttentionStrides ldo, const T* q, AttentionStrides lq, const T* k,
                         AttentionStrides lk, const T* v, AttentionStrides lv, const T* out, AttentionStrides lo,
                         const float* lse, float* delta, std::int64_t BH, std::int64_t H, std::int64_t T_len, int D,
                         float scale, bool causal, cudaStream_t stream) {
  if (BH <= 0 || T_len <= 0) return cudaSuccess;
  return with_head_dim(D, [&](auto d) {
    return backward_for<T, decltype(d)::value>(dq, ldq, dk, ldk, dv, ldv, dout, ldo, q, lq, k, lk, v, lv, out, lo, lse,
                                               delta, BH, H, T_len, scale, causal, stream);
  });
}

}  // namespace

cudaError_t launch_attention_forward_f32(float* out, AttentionStrides lo, float* lse, const float* q,
                                         AttentionStrides lq, const float* k, AttentionStrides lk, const float* v,
                                         AttentionStrides lv, std::int64_t BH, std::int64_t H, std::int64_t T,
                                         int D, float scale, bool causal, cudaStream_t stream) {
  return forward_any(out, lo, lse, q, lq, k, lk, v, lv, BH, H, T, D, scale, causal, stream);
}

cudaError_t launch_attention_forward_bf16(__nv_bfloat16* out, AttentionStrides lo, float* lse,
                                          const __nv_bfloat16* q, AttentionStrides lq, const __nv_bfloat16* k,
                                          AttentionStrides lk, const __nv_bfloat16* v, AttentionStrides lv,
                                          std::int64_t BH, std::int64_t H, std::int64_t T, int D, float scale,
                                          bool causal, cudaStream_t stream) {
  return forward_any(out, lo, lse, q, lq, k, lk, v, lv, BH, H, T, D, scale, causal, stream);
}

cudaError_t launch_attention_backward_f32(float* dq, AttentionStrides ldq, float* dk, AttentionStrides ldk,
                                          float* dv, AttentionStrides ldv, const float* dout, AttentionStrides ldo,
                                          const float* q, AttentionStrides lq, const float* k, AttentionStrides lk,
                                          const float* v, AttentionStrides lv, const float* out,
                                          AttentionStrides lo, const float* lse, float* delta, std::int64_t BH,
                                          std::int64_t H, std::int64_t T, int D, float scale, bool causal,
                                          cudaStream_t stream) {
  return backward_any(dq, ldq, dk, ldk, dv, ldv, dout, ldo, q, lq, k, lk, v, lv, out, lo, lse, delta, BH, H, T, D,
                      scale, causal, stream);
}

cudaError_t launch_attention_backward_bf16(__nv_bfloat16* dq, AttentionStrides ldq, __nv_bfloat16* dk,
                                           AttentionStrides ldk, __nv_bfloat16* dv, AttentionStrides ldv,
                                           const __nv_bfloat16* dout, AttentionStrides ldo, const __nv_bfloat16* q,
                                           AttentionStrides lq, const __nv_bfloat16* k, AttentionStrides lk,
                                           const __nv_bfloat16* v, AttentionStrides lv, const __nv_bfloat16* out,
                                           AttentionStrides lo, const float* lse, float* delta, std::int64_t BH,
                                           std::int64_t H, std::int64_t T, int D, float scale, bool causal,
                                           cudaStream_t stream) {
  return backward_any(dq, ldq, dk, ldk, dv, ldv, dout, ldo, q, lq, k, lk, v, lv, out, lo, lse, delta, BH, H, T, D,
                      scale, causal, stream);
}

std::int64_t attention_forward_blocks(std::int64_t BH, std::int64_t T, int) { return BH * ceil_div(T, kBigTile); }
std::int64_t attention_backward_blocks(std::int64_t BH, std::int64_t T, int) { return BH * ceil_div(T, kBigTile); }

}  // namespace memtrain::cuda

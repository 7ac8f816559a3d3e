// Scaled dot-product attention (causal or full) on tensor cores, bf16 / f16 operands, FlashAttention-2 style.
// The same math and contract as attention.cu (see there and src/cpu/attention.cpp); only the GEMMs differ:
// they run as nvcuda::wmma 16x16x16 fragment products (bf16 or f16 inputs, f32 accumulation).
//
// Algorithm
//   forward  one block per (head bh, query tile of 64 rows); 4 warps, warp w owns query rows 16w..16w+15 of the
//            tile. Key/value tiles of BC rows (64, or 32 for D = 128) stream through shared memory. Per tile each
//            warp computes its 16 x BC slice of S = Q K^T into shared f32, then (plain loops, f32) scales and
//            masks it, updates the running row max m and sum l, writes P = exp(S - m) as bf16/f16, rescales its
//            rows of the f32 output accumulator O (shared) by alpha = exp(m_old - m_new), and adds P V to O on
//            tensor cores (accumulator fragments loaded from and stored back to shared memory: the fragment
//            layout is opaque, so the per-row rescale is done on the shared copy). At the end out = O / l and
//            lse = m + log(l). Causal: key tiles wholly above the diagonal are never loaded.
//   backward three kernels, no atomics (deterministic), as in attention.cu:
//            delta  delta[bh, t] = rowsum(dO * O) in f32, one warp per row;
//            dK/dV  one block per (bh, key tile of 64 rows), warp w owns key rows 16w..; loops over the query tiles
//                   of BQ rows (64, or 32 for D = 128) that see it: S^T = K Q^T and dP^T = V dO^T on tensor cores
//                   into shared f32, then P^T = exp(scale S^T - lse), dS^T = P^T (dP^T - delta) in f32, stored as
//                   bf16/f16, and dV += P^T dO, dK += dS^T Q on tensor cores with the accumulators in registers
//                   for the whole loop (no rescale is ever needed there); dK gets the scale once at the end;
//            dQ     one block per (bh, query tile of 64 rows), warp w owns 16 query rows, loops over key tiles:
//                   S = Q K^T, dP = dO V^T, dS = P (dP - delta), dQ += dS K (registers), scale at the end.
//            The separate dQ pass recomputes S and dP (7 tile GEMMs instead of 5) to avoid f32 atomics.
//
// Thread mapping: 128 threads = 4 warps. All tensor-core work and every elementwise pass touch only the warp's
// own 16 rows, so inside a tile step warps synchronize with __syncwarp only; __syncthreads guards the shared
// K/V (or Q/dO) tiles that all warps read. Elementwise passes over a warp's 16 x N slice use e = lane + 32 i,
// row e / N, column e % N (consecutive lanes, consecutive columns: conflict-free f32 reads); the forward's row
// statistics use the pair of lanes 2r, 2r + 1 per row r, combined with one __shfl_xor_sync.
// Shared tiles: bf16/f16 rows padded by 8 elements, f32 rows by 4, so every row is 16-byte aligned (wmma's
// ldm rule) and every fragment pointer (row a multiple of 16, column a multiple of 16) is 32-byte aligned;
// each region starts on a 128-byte boundary. Rows past T are staged as zeros so masked products stay finite.
// Element offsets are 64-bit; in-head row indices (< T <= 2^30) are int.
#include "attention_tc.cuh"
#include "device_math.cuh"

#include <mma.h>

#include <algorithm>
#include <cstdint>

// wmma with bf16 inputs needs sm_80; on an older target the kernels compile to a trap, and the host side
// (src/cuda/cuda_attention.cpp) never launches them on a device older than 8.0.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define MT_ATTENTION_TC_ARCH_OK 0
#else
#define MT_ATTENTION_TC_ARCH_OK 1
#endif

namespace memtrain::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;  // every kernel here assumes this block size
constexpr int kRows = 16 * kWarps;     // query rows (forward, dQ) or key rows (dK/dV) per block
constexpr std::int64_t kMaxGrid = 2147483647;
constexpr float kInf = __builtin_huge_valf();
constexpr unsigned kFullMask = 0xffffffffu;

// The streamed side of a tile step (keys in forward/dQ, queries in dK/dV): smaller for D = 128 so that shared
// memory stays under 100 KB per block.
__host__ __device__ constexpr int step_rows(int d) { return d >= 128 ? 32 : 64; }
__host__ __device__ constexpr int align128(int bytes) { return (bytes + 127) / 128 * 128; }

using device::from_f32;
using device::to_f32;

template <typename T>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;
using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// First element of head bh (= b * H + h) of an operand.
__device__ inline std::int64_t head_offset(const AttentionStrides& s, std::int64_t bh, std::int64_t H) {
  return (bh / H) * s.batch + (bh % H) * s.head;
}

// dst[r][d] (row stride D + 8) = row (row0 + r) of a head whose rows lie row_stride elements apart, r < ROWS;
// rows at or past T_len are zero. vec: the launcher checked that every row start is 16-byte aligned, so 8
// elements move as one uint4. Neighbouring threads take neighbouring chunks of a row (coalesced).
template <int ROWS, int D, typename T>
__device__ inline void load_tile(T* dst, const T* src, std::int64_t row_stride, int row0, int T_len, bool vec) {
  constexpr int LDT = D + 8;
  if (vec) {
    constexpr int V = D / 8;
    for (int e = threadIdx.x; e < ROWS * V; e += kThreads) {
      const int r = e / V, c = (e % V) * 8, t = row0 + r;
      uint4 x = make_uint4(0u, 0u, 0u, 0u);
      if (t < T_len) x = *reinterpret_cast<const uint4*>(src + static_cast<std::int64_t>(t) * row_stride + c);
      *reinterpret_cast<uint4*>(dst + r * LDT + c) = x;
    }
  } else {
    for (int e = threadIdx.x; e < ROWS * D; e += kThreads) {
      const int r = e / D, c = e % D, t = row0 + r;
      dst[r * LDT + c] = t < T_len ? src[static_cast<std::int64_t>(t) * row_stride + c] : from_f32<T>(0.f);
    }
  }
}

// dst[r] = src[base + row0 + r] for r < ROWS (0 past T_len): the f32 row statistics lse and delta.
template <int ROWS>
__device__ inline void load_stats(float* dst, const float* src, std::int64_t base, int row0, int T_len) {
  for (int r = threadIdx.x; r < ROWS; r += kThreads) dst[r] = row0 + r < T_len ? src[base + row0 + r] : 0.f;
}

// One warp: c[r][n] = sum_k a[r][k] * b[n][k] for r < 16, n < N, k < K, i.e. C = A B^T with A (16 x K) and
// B (N x K) row-major bf16/f16 tiles; C is f32, row-major, row stride ldc.
template <int N, int K, typename T>
__device__ inline void warp_gemm_abt(float* c, int ldc, const T* a, int lda, const T* b, int ldb) {
#pragma unroll
  for (int n = 0; n < N / 16; ++n) {
    FragAcc acc;
    wmma::fill_fragment(acc, 0.f);
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk) {
      FragA<T> fa;
      FragBCol<T> fb;  // column-major view of B's rows: element (k, n) at b[n * ldb + k]
      wmma::load_matrix_sync(fa, a + kk * 16, lda);
      wmma::load_matrix_sync(fb, b + n * 16 * ldb + kk * 16, ldb);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(c + n * 16, acc, ldc, wmma::mem_row_major);
  }
}

// One warp: acc[n] += A B[:, 16n .. 16n + 15] for n < DN, with A (16 x K) and B (K x 16 DN) row-major tiles.
template <int DN, int K, typename T>
__device__ inline void warp_gemm_ab(FragAcc (&acc)[DN], const T* a, int lda, const T* b, int ldb) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    FragA<T> fa;
    wmma::load_matrix_sync(fa, a + kk * 16, lda);
#pragma unroll
    for (int n = 0; n < DN; ++n) {
      FragBRow<T> fb;
      wmma::load_matrix_sync(fb, b + kk * 16 * ldb + n * 16, ldb);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// One warp: rows row0 .. row0 + 15 (those < T_len) of a head = mul * the 16 x 16 DN accumulator tiles, through
// the warp's private 16 x 16 f32 scratch (row stride lds).
template <int DN, typename T>
__device__ inline void store_acc_rows(FragAcc (&acc)[DN], float mul, float* scratch, int lds, T* dst,
                                      std::int64_t row_stride, int row0, int T_len) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < DN; ++n) {
    __syncwarp();  // every lane is done reading the scratch of the previous tile
    wmma::store_matrix_sync(scratch, acc[n], lds, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {
      const int r = e / 16, c = e % 16, row = row0 + r;
      if (row < T_len) dst[static_cast<std::int64_t>(row) * row_stride + n * 16 + c] = from_f32<T>(scratch[r * lds + c] * mul);
    }
  }
}

// ---- shared memory layouts (byte offsets), one per kernel, used by kernel and launcher alike ----

template <int D>
struct ForwardSmem {
  static constexpr int BR = kRows, BC = step_rows(D);
  static constexpr int LDT = D + 8, LDS = BC + 4, LDP = BC + 8, LDO = D + 4;
  static constexpr int q = 0;                               // (BR, D)  bf16/f16
  static constexpr int k = q + align128(BR * LDT * 2);      // (BC, D)  bf16/f16
  static constexpr int v = k + align128(BC * LDT * 2);      // (BC, D)  bf16/f16
  static constexpr int s = v + align128(BC * LDT * 2);      // (BR, BC) f32 scores
  static constexpr int p = s + align128(BR * LDS * 4);      // (BR, BC) bf16/f16 probabilities
  static constexpr int o = p + align128(BR * LDP * 2);      // (BR, D)  f32 output accumulator
  static constexpr int rows = o + align128(BR * LDO * 4);   // (BR)     f32 alpha, then 1 / l
  static constexpr int bytes = rows + align128(BR * 4);
};

template <int D>
struct DkdvSmem {
  static constexpr int BK = kRows, BQ = step_rows(D);
  static constexpr int LDT = D + 8, LDS = BQ + 4, LDP = BQ + 8;
  static constexpr int k = 0;                               // (BK, D)  bf16/f16
  static constexpr int v = k + align128(BK * LDT * 2);      // (BK, D)
  static constexpr int q = v + align128(BK * LDT * 2);      // (BQ, D)
  static constexpr int dout = q + align128(BQ * LDT * 2);   // (BQ, D)
  static constexpr int st = dout + align128(BQ * LDT * 2);  // (BK, BQ) f32 S^T
  static constexpr int dpt = st + align128(BK * LDS * 4);   // (BK, BQ) f32 dP^T
  static constexpr int pt = dpt + align128(BK * LDS * 4);   // (BK, BQ) bf16/f16 P^T
  static constexpr int dst = pt + align128(BK * LDP * 2);   // (BK, BQ) bf16/f16 dS^T
  static constexpr int lse = dst + align128(BK * LDP * 2);  // (BQ) f32
  static constexpr int delta = lse + align128(BQ * 4);      // (BQ) f32
  static constexpr int bytes = delta + align128(BQ * 4);
};

template <int D>
struct DqSmem {
  static constexpr int BR = kRows, BK = step_rows(D);
  static constexpr int LDT = D + 8, LDS = BK + 4, LDP = BK + 8;
  static constexpr int q = 0;                               // (BR, D)  bf16/f16
  static constexpr int dout = q + align128(BR * LDT * 2);   // (BR, D)
  static constexpr int k = dout + align128(BR * LDT * 2);   // (BK, D)
  static constexpr int v = k + align128(BK * LDT * 2);      // (BK, D)
  static constexpr int s = v + align128(BK * LDT * 2);      // (BR, BK) f32 S
  static constexpr int dp = s + align128(BR * LDS * 4);     // (BR, BK) f32 dP
  static constexpr int ds = dp + align128(BR * LDS * 4);    // (BR, BK) bf16/f16 dS
  static constexpr int lse = ds + align128(BR * LDP * 2);   // (BR) f32
  static constexpr int delta = lse + align128(BR * 4);      // (BR) f32
  static constexpr int bytes = delta + align128(BR * 4);
};

// At most 99 KiB per block: the opt-in limit of sm_86/sm_89, which run the sm_80 code (sm_80 and sm_90 allow
// more); it also keeps two blocks per SM on an H100/H200.
constexpr int kMaxSmemBytes = 99 * 1024;
static_assert(ForwardSmem<32>::bytes <= kMaxSmemBytes && ForwardSmem<64>::bytes <= kMaxSmemBytes &&
              ForwardSmem<128>::bytes <= kMaxSmemBytes);
static_assert(DkdvSmem<32>::bytes <= kMaxSmemBytes && DkdvSmem<64>::bytes <= kMaxSmemBytes &&
              DkdvSmem<128>::bytes <= kMaxSmemBytes);
static_assert(DqSmem<32>::bytes <= kMaxSmemBytes && DqSmem<64>::bytes <= kMaxSmemBytes &&
              DqSmem<128>::bytes <= kMaxSmemBytes);

// ---- forward ----

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    attention_forward_tc_kernel(T* __restrict__ out, AttentionStrides lo, float* __restrict__ lse,
                                const T* __restrict__ q, AttentionStrides lq, const T* __restrict__ k,
                                AttentionStrides lk, const T* __restrict__ v, AttentionStrides lv, std::int64_t H,
                                int T_len, int tiles, float scale, bool causal, bool vec) {
#if MT_ATTENTION_TC_ARCH_OK
  using L = ForwardSmem<D>;
  constexpr int BR = L::BR, BC = L::BC, LDT = L::LDT, LDS = L::LDS, LDP = L::LDP, LDO = L::LDO, DN = D / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem + L::q);
  T* k_s = reinterpret_cast<T*>(smem + L::k);
  T* v_s = reinterpret_cast<T*>(smem + L::v);
  float* s_s = reinterpret_cast<float*>(smem + L::s);
  T* p_s = reinterpret_cast<T*>(smem + L::p);
  float* o_s = reinterpret_cast<float*>(smem + L::o);
  float* row_s = reinterpret_cast<float*>(smem + L::rows);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int64_t block = blockIdx.x;
  const std::int64_t bh = block / tiles;
  // Last query tiles first: under causal masking they have the most key tiles to visit.
  const int i0 = (tiles - 1 - static_cast<int>(block % tiles)) * BR;
  const T* qh = q + head_offset(lq, bh, H);
  const T* kh = k + head_offset(lk, bh, H);
  const T* vh = v + head_offset(lv, bh, H);

  load_tile<BR, D>(q_s, qh, lq.row, i0, T_len, vec);
  for (int e = threadIdx.x; e < BR * LDO; e += kThreads) o_s[e] = 0.f;  // alpha = 0 on the first tile needs finite O

  const int w0 = warp * 16;                    // the warp's first row in the tile
  const int r = lane / 2, pair_lane = lane % 2;     // row statistics: lanes 2r and 2r + 1 share row w0 + r
  const int query = i0 + w0 + r;
  float* s_w = s_s + w0 * LDS;
  T* p_w = p_s + w0 * LDP;
  float* o_w = o_s + w0 * LDO;
  float* srow = s_w + r * LDS;
  T* prow = p_w + r * LDP;
  float m = -kInf, l = 0.f;  // both lanes of a pair hold the row's values

  const int kend = causal ? min(T_len, i0 + BR) : T_len;  // query i sees keys <= i
  for (int j0 = 0; j0 < kend; j0 += BC) {
    __syncthreads();  // every warp is done with the previous k_s, v_s
    load_tile<BC, D>(k_s, kh, lk.row, j0, T_len, vec);
    load_tile<BC, D>(v_s, vh, lv.row, j0, T_len, vec);
    __syncthreads();  // k_s, v_s (and on the first pass q_s, o_s) ready

    warp_gemm_abt<BC, D>(s_w, LDS, q_s + w0 * LDT, LDT, k_s, LDT);  // S = Q K^T (unscaled), this warp's rows
    __syncwarp();

    float mx = -kInf;
    for (int c = pair_lane; c < BC; c += 2) {
      const int key = j0 + c;
      const bool visible = key < T_len && (!causal || key <= query);
      const float x = visible ? srow[c] * scale : -kInf;
      srow[c] = x;
      mx = fmaxf(mx, x);
    }
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
    const float m_new = fmaxf(m, mx);
    // A row with nothing visible yet keeps m = -inf, p = 0 and alpha = 0 (never exp(-inf - -inf)).
    const float alpha = m == -kInf ? 0.f : expf(m - m_new);
    float sum = 0.f;
    for (int c = pair_lane; c < BC; c += 2) {
      const float x = srow[c];
      const float p = x == -kInf ? 0.f : expf(x - m_new);
      prow[c] = from_f32<T>(p);
      sum += p;  // the f32 value: lse must not carry P's rounding
    }
    sum += __shfl_xor_sync(kFullMask, sum, 1);
    l = l * alpha + sum;
    m = m_new;
    if (pair_lane == 0) row_s[w0 + r] = alpha;
    __syncwarp();  // p_w and the alphas visible to the whole warp

    for (int e = lane; e < 16 * D; e += 32) o_w[(e / D) * LDO + e % D] *= row_s[w0 + e / D];
    __syncwarp();

    FragAcc acc[DN];
#pragma unroll
    for (int n = 0; n < DN; ++n) wmma::load_matrix_sync(acc[n], o_w + n * 16, LDO, wmma::mem_row_major);
    warp_gemm_ab<DN, BC>(acc, p_w, LDP, v_s, LDT);  // O += P V
#pragma unroll
    for (int n = 0; n < DN; ++n) wmma::store_matrix_sync(o_w + n * 16, acc[n], LDO, wmma::mem_row_major);
    __syncwarp();  // o_w written before the next rescale or the epilogue reads it
  }

  // kend >= 1, so every row that exists (< T_len) saw at least key 0: l > 0.
  if (pair_lane == 0) {
    row_s[w0 + r] = 1.f / l;
    if (query < T_len) lse[bh * T_len + query] = m + logf(l);
  }
  __syncwarp();
  T* oh = out + head_offset(lo, bh, H);
  for (int e = lane; e < 16 * D; e += 32) {
    const int rr = e / D, c = e % D, row = i0 + w0 + rr;
    if (row < T_len) oh[static_cast<std::int64_t>(row) * lo.row + c] = from_f32<T>(o_w[rr * LDO + c] * row_s[w0 + rr]);
  }
#else
  __trap();
#endif
}

// ---- backward ----

// delta[r] = sum_d dout[r, d] * out[r, d] in f32, for the flat rows r = bh * T_len + t < rows; one warp per row.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    attention_delta_tc_kernel(float* __restrict__ delta, const T* __restrict__ dout, AttentionStrides ldo,
                              const T* __restrict__ out, AttentionStrides lo, std::int64_t H, int T_len, int D,
                              std::int64_t rows) {
  const int lane = threadIdx.x % 32;
  const std::int64_t warp = (static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * kWarps;
  for (std::int64_t r = warp; r < rows; r += warps) {  // warp-uniform loop: the shuffles see all lanes
    const std::int64_t bh = r / T_len, t = r % T_len;
    const T* g = dout + head_offset(ldo, bh, H) + t * ldo.row;
    const T* o = out + head_offset(lo, bh, H) + t * lo.row;
    float s = 0.f;
    for (int d = lane; d < D; d += 32) s = fmaf(to_f32(g[d]), to_f32(o[d]), s);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(kFullMask, s, off);
    if (lane == 0) delta[r] = s;
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dkdv_tc_kernel(T* __restrict__ dk, AttentionStrides ldk, T* __restrict__ dv,
                                      AttentionStrides ldv, const T* __restrict__ dout, AttentionStrides ldo,
                                      const T* __restrict__ q, AttentionStrides lq, const T* __restrict__ k,
                                      AttentionStrides lk, const T* __restrict__ v, AttentionStrides lv,
                                      const float* __restrict__ lse, const float* __restrict__ delta, std::int64_t H,
                                      int T_len, int tiles, float scale, bool causal, bool vec) {
#if MT_ATTENTION_TC_ARCH_OK
  using L = DkdvSmem<D>;
  constexpr int BK = L::BK, BQ = L::BQ, LDT = L::LDT, LDS = L::LDS, LDP = L::LDP, DN = D / 16;
  static_assert(BK % BQ == 0, "causal start i0 = j0 must be a query tile boundary");
  extern __shared__ __align__(128) unsigned char smem[];
  T* k_s = reinterpret_cast<T*>(smem + L::k);
  T* v_s = reinterpret_cast<T*>(smem + L::v);
  T* q_s = reinterpret_cast<T*>(smem + L::q);
  T* do_s = reinterpret_cast<T*>(smem + L::dout);
  float* st_s = reinterpret_cast<float*>(smem + L::st);
  float* dpt_s = reinterpret_cast<float*>(smem + L::dpt);
  T* pt_s = reinterpret_cast<T*>(smem + L::pt);
  T* dst_s = reinterpret_cast<T*>(smem + L::dst);
  float* lse_s = reinterpret_cast<float*>(smem + L::lse);
  float* delta_s = reinterpret_cast<float*>(smem + L::delta);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int64_t block = blockIdx.x;
  const std::int64_t bh = block / tiles;
  const int j0 = static_cast<int>(block % tiles) * BK;  // first key tiles first: under causal masking they see the most
  const T* qh = q + head_offset(lq, bh, H);
  const T* kh = k + head_offset(lk, bh, H);
  const T* vh = v + head_offset(lv, bh, H);
  const T* gh = dout + head_offset(ldo, bh, H);
  const std::int64_t stats = bh * T_len;

  load_tile<BK, D>(k_s, kh, lk.row, j0, T_len, vec);
  load_tile<BK, D>(v_s, vh, lv.row, j0, T_len, vec);

  const int w0 = warp * 16;  // the warp's first key row in the tile
  float* st_w = st_s + w0 * LDS;
  float* dpt_w = dpt_s + w0 * LDS;
  T* pt_w = pt_s + w0 * LDP;
  T* dst_w = dst_s + w0 * LDP;
  FragAcc dk_acc[DN], dv_acc[DN];
#pragma unroll
  for (int n = 0; n < DN; ++n) {
    wmma::fill_fragment(dk_acc[n], 0.f);
    wmma::fill_fragment(dv_acc[n], 0.f);
  }

  for (int i0 = causal ? j0 : 0; i0 < T_len; i0 += BQ) {  // causal: only queries >= j0 see these keys
    __syncthreads();  // every warp is done with the previous q_s, do_s, lse_s, delta_s
    load_tile<BQ, D>(q_s, qh, lq.row, i0, T_len, vec);
    load_tile<BQ, D>(do_s, gh, ldo.row, i0, T_len, vec);
    load_stats<BQ>(lse_s, lse, stats, i0, T_len);
    load_stats<BQ>(delta_s, delta, stats, i0, T_len);
    __syncthreads();  // (first pass: k_s, v_s too)

    warp_gemm_abt<BQ, D>(st_w, LDS, k_s + w0 * LDT, LDT, q_s, LDT);    // S^T = K Q^T (unscaled)
    warp_gemm_abt<BQ, D>(dpt_w, LDS, v_s + w0 * LDT, LDT, do_s, LDT);  // dP^T = V dO^T
    __syncwarp();
    for (int e = lane; e < 16 * BQ; e += 32) {
      const int rr = e / BQ, c = e % BQ, key = j0 + w0 + rr, query = i0 + c;
      const bool visible = key < T_len && query < T_len && (!causal || key <= query);
      const float p = visible ? expf(st_w[rr * LDS + c] * scale - lse_s[c]) : 0.f;
      pt_w[rr * LDP + c] = from_f32<T>(p);
      dst_w[rr * LDP + c] = from_f32<T>(p * (dpt_w[rr * LDS + c] - delta_s[c]));
    }
    __syncwarp();
    warp_gemm_ab<DN, BQ>(dv_acc, pt_w, LDP, do_s, LDT);  // dV_j += P^T dO_i
    warp_gemm_ab<DN, BQ>(dk_acc, dst_w, LDP, q_s, LDT);  // dK_j += dS^T Q_i (scale applied below)
  }

  // st_w (16 x BQ >= 16 x 16 f32, this warp's own) is free now: the scratch for the stores.
  store_acc_rows<DN>(dk_acc, scale, st_w, LDS, dk + head_offset(ldk, bh, H), ldk.row, j0 + w0, T_len);
  store_acc_rows<DN>(dv_acc, 1.f, st_w, LDS, dv + head_offset(ldv, bh, H), ldv.row, j0 + w0, T_len);
#else
  __trap();
#endif
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dq_tc_kernel(T* __restrict__ dq, AttentionStrides ldq, const T* __restrict__ dout,
                                    AttentionStrides ldo, const T* __restrict__ q, AttentionStrides lq,
                                    const T* __restrict__ k, AttentionStrides lk, const T* __restrict__ v,
                                    AttentionStrides lv, const float* __restrict__ lse,
                                    const float* __restrict__ delta, std::int64_t H, int T_len, int tiles,
                                    float scale, bool causal, bool vec) {
#if MT_ATTENTION_TC_ARCH_OK
  using L = DqSmem<D>;
  constexpr int BR = L::BR, BK = L::BK, LDT = L::LDT, LDS = L::LDS, LDP = L::LDP, DN = D / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem + L::q);
  T* do_s = reinterpret_cast<T*>(smem + L::dout);
  T* k_s = reinterpret_cast<T*>(smem + L::k);
  T* v_s = reinterpret_cast<T*>(smem + L::v);
  float* s_s = reinterpret_cast<float*>(smem + L::s);
  float* dp_s = reinterpret_cast<float*>(smem + L::dp);
  T* ds_s = reinterpret_cast<T*>(smem + L::ds);
  float* lse_s = reinterpret_cast<float*>(smem + L::lse);
  float* delta_s = reinterpret_cast<float*>(smem + L::delta);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int64_t block = blockIdx.x;
  const std::int64_t bh = block / tiles;
  const int i0 = (tiles - 1 - static_cast<int>(block % tiles)) * BR;  // last tiles (most work) first
  const T* qh = q + head_offset(lq, bh, H);
  const T* kh = k + head_offset(lk, bh, H);
  const T* vh = v + head_offset(lv, bh, H);
  const T* gh = dout + head_offset(ldo, bh, H);
  const std::int64_t stats = bh * T_len;

  load_tile<BR, D>(q_s, qh, lq.row, i0, T_len, vec);
  load_tile<BR, D>(do_s, gh, ldo.row, i0, T_len, vec);
  load_stats<BR>(lse_s, lse, stats, i0, T_len);
  load_stats<BR>(delta_s, delta, stats, i0, T_len);

  const int w0 = warp * 16;  // the warp's first query row in the tile
  float* s_w = s_s + w0 * LDS;
  float* dp_w = dp_s + w0 * LDS;
  T* ds_w = ds_s + w0 * LDP;
  FragAcc dq_acc[DN];
#pragma unroll
  for (int n = 0; n < DN; ++n) wmma::fill_fragment(dq_acc[n], 0.f);

  const int kend = causal ? min(T_len, i0 + BR) : T_len;  // >= 1: the loop's barrier also covers q_s etc.
  for (int j0 = 0; j0 < kend; j0 += BK) {
    __syncthreads();  // every warp is done with the previous k_s, v_s
    load_tile<BK, D>(k_s, kh, lk.row, j0, T_len, vec);
    load_tile<BK, D>(v_s, vh, lv.row, j0, T_len, vec);
    __syncthreads();

    warp_gemm_abt<BK, D>(s_w, LDS, q_s + w0 * LDT, LDT, k_s, LDT);    // S = Q K^T (unscaled)
    warp_gemm_abt<BK, D>(dp_w, LDS, do_s + w0 * LDT, LDT, v_s, LDT);  // dP = dO V^T
    __syncwarp();
    for (int e = lane; e < 16 * BK; e += 32) {
      const int rr = e / BK, c = e % BK, query = i0 + w0 + rr, key = j0 + c;
      const bool visible = key < T_len && query < T_len && (!causal || key <= query);
      const float p = visible ? expf(s_w[rr * LDS + c] * scale - lse_s[w0 + rr]) : 0.f;
      ds_w[rr * LDP + c] = from_f32<T>(p * (dp_w[rr * LDS + c] - delta_s[w0 + rr]));
    }
    __syncwarp();
    warp_gemm_ab<DN, BK>(dq_acc, ds_w, LDP, k_s, LDT);  // dQ_i += dS K_j (scale applied below)
  }

  store_acc_rows<DN>(dq_acc, scale, s_w, LDS, dq + head_offset(ldq, bh, H), ldq.row, i0 + w0, T_len);
#else
  __trap();
#endif
}

// ---- launchers ----

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Every row of the operand starts 16 bytes aligned: then load_tile may move rows as uint4.
bool rows_aligned16(const void* p, const AttentionStrides& s) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0 && s.batch % 8 == 0 && s.head % 8 == 0 && s.row % 8 == 0;
}

// Opts the kernel in to `bytes` of dynamic shared memory when that is past the 48 KiB default.
template <typename Kernel>
cudaError_t allow_smem(Kernel kernel, int bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

template <typename T, int D>
cudaError_t forward_for(T* out, AttentionStrides lo, float* lse, const T* q, AttentionStrides lq, const T* k,
                        AttentionStrides lk, const T* v, AttentionStrides lv, std::int64_t BH, std::int64_t H,
                        std::int64_t T_len, float scale, bool causal, cudaStream_t stream) {
  const std::int64_t tiles = ceil_div(T_len, kRows);
  if (BH * tiles > kMaxGrid) return cudaErrorInvalidConfiguration;
  const bool vec = rows_aligned16(q, lq) && rows_aligned16(k, lk) && rows_aligned16(v, lv);
  constexpr int smem = ForwardSmem<D>::bytes;
  if (cudaError_t err = allow_smem(attention_forward_tc_kernel<T, D>, smem); err != cudaSuccess) return err;
  attention_forward_tc_kernel<T, D><<<static_cast<unsigned>(BH * tiles), kThreads, smem, stream>>>(
      out, lo, lse, q, lq, k, lk, v, lv, H, static_cast<int>(T_len), static_cast<int>(tiles), scale, causal, vec);
  return cudaGetLastError();
}

template <typename T, int D>
cudaError_t backward_for(T* dq, AttentionStrides ldq, T* dk, AttentionStrides ldk, T* dv, AttentionStrides ldv,
                         const T* dout, AttentionStrides ldo, const T* q, AttentionStrides lq, const T* k,
                         AttentionStrides lk, const T* v, AttentionStrides lv, const T* out, AttentionStrides lo,
                         const float* lse, float* delta, std::int64_t BH, std::int64_t H, std::int64_t T_len,
                         float scale, bool causal, cudaStream_t stream) {
  const std::int64_t tiles = ceil_div(T_len, kRows);  // key tiles (dK/dV) and query tiles (dQ): both kRows rows
  if (BH * tiles > kMaxGrid) return cudaErrorInvalidConfiguration;
  const int t32 = static_cast<int>(T_len), tiles32 = static_cast<int>(tiles);
  const bool vec = rows_aligned16(q, lq) && rows_aligned16(k, lk) && rows_aligned16(v, lv) &&
                   rows_aligned16(dout, ldo);

  const std::int64_t rows = BH * T_len;
  const std::int64_t delta_blocks = std::min<std::int64_t>(ceil_div(rows, kWarps), 8192);
  attention_delta_tc_kernel<T><<<static_cast<unsigned>(delta_blocks), kThreads, 0, stream>>>(delta, dout, ldo, out,
                                                                                              lo, H, t32, D, rows);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;

  constexpr int smem_dkdv = DkdvSmem<D>::bytes;
  if (cudaError_t err = allow_smem(attention_backward_dkdv_tc_kernel<T, D>, smem_dkdv); err != cudaSuccess) return err;
  attention_backward_dkdv_tc_kernel<T, D><<<static_cast<unsigned>(BH * tiles), kThreads, smem_dkdv, stream>>>(
      dk, ldk, dv, ldv, dout, ldo, q, lq, k, lk, v, lv, lse, delta, H, t32, tiles32, scale, causal, vec);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;

  constexpr int smem_dq = DqSmem<D>::bytes;
  if (cudaError_t err = allow_smem(attention_backward_dq_tc_kernel<T, D>, smem_dq); err != cudaSuccess) return err;
  attention_backward_dq_tc_kernel<T, D><<<static_cast<unsigned>(BH * tiles), kThreads, smem_dq, stream>>>(
      dq, ldq, dout, ldo, q, lq, k, lk, v, lv, lse, delta, H, t32, tiles32, scale, causal, vec);
  return cudaGetLastError();
}

}  // namespace

template <typename T>
cudaError_t launch_attention_forward_tc(T* out, AttentionStrides lo, float* lse, const T* q, AttentionStrides lq,
                                        const T* k, AttentionStrides lk, const T* v, AttentionStrides lv,
                                        std::int64_t BH, std::int64_t H, std::int64_t T_len, int D, float scale,
                                        bool causal, cudaStream_t stream) {
  if (BH <= 0 || T_len <= 0) return cudaSuccess;
  return with_head_dim(D, [&](auto d) {
    return forward_for<T, decltype(d)::value>(out, lo, lse, q, lq, k, lk, v, lv, BH, H, T_len, scale, causal, stream);
  });
}

template <typename T>
cudaError_t launch_attention_backward_tc(T* dq, AttentionStrides ldq, T* dk, AttentionStrides ldk, T* dv,
                                         AttentionStrides ldv, const T* dout, AttentionStrides ldo, const T* q,
                                         AttentionStrides lq, const T* k, AttentionStrides lk, const T* v,
                                         AttentionStrides lv, const T* out, AttentionStrides lo, const float* lse,
                                         float* delta, std::int64_t BH, std::int64_t H, std::int64_t T_len, int D,
                                         float scale, bool causal, cudaStream_t stream) {
  if (BH <= 0 || T_len <= 0) return cudaSuccess;
  return with_head_dim(D, [&](auto d) {
    return backward_for<T, decltype(d)::value>(dq, ldq, dk, ldk, dv, ldv, dout, ldo, q, lq, k, lk, v, lv, out, lo, lse,
                                               delta, BH, H, T_len, scale, causal, stream);
  });
}

std::int64_t attention_tc_blocks(std::int64_t BH, std::int64_t T_len) { return BH * ceil_div(T_len, kRows); }

#define MT_INSTANTIATE_ATTENTION_TC(T)                                                                             \
  template cudaError_t launch_attention_forward_tc<T>(T*, AttentionStrides, float*, const T*, AttentionStrides,     \
                                                      const T*, AttentionStrides, const T*, AttentionStrides,       \
                                                      std::int64_t, std::int64_t, std::int64_t, int, float, bool,   \
                                                      cudaStream_t);                                                \
  template cudaError_t launch_attention_backward_tc<T>(                                                            \
      T*, AttentionStrides, T*, AttentionStrides, T*, AttentionStrides, const T*, AttentionStrides, const T*,        \
      AttentionStrides, const T*, AttentionStrides, const T*, AttentionStrides, const T*, AttentionStrides,         \
      const float*, float*, std::int64_t, std::int64_t, std::int64_t, int, float, bool, cudaStream_t);
MT_INSTANTIATE_ATTENTION_TC(__nv_bfloat16)
MT_INSTANTIATE_ATTENTION_TC(__half)
#undef MT_INSTANTIATE_ATTENTION_TC

}  // namespace memtrain::cuda

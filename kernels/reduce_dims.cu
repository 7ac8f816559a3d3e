// Reductions along the middle axis of a contiguous [outer, reduce, inner] array: sum (f64 accumulation,
// rounded once, as the CPU's ops::sum), sum of squares (f64 out, for gradient norms) and max/argmax.
//
// Sum, thread mapping (no float atomics: every output is added in an order fixed by the shape):
//   inner == 1 (rows): one warp per (row, chunk) when chunk_len < kBlockPerRowLen, else one block; lanes
//     stride the chunk, then a fixed butterfly (and, for a block, warps 0..7 in order).
//   inner > 1 (columns): one thread per (o, chunk, i); it walks r in order, so a warp reads 32 adjacent i
//     (coalesced) per step.
//   chunks > 1 (few outputs, long reduce axis; see plan_sum_dim): the above writes f64 partials laid out
//     [outer, chunks, inner]; a finalize kernel adds each output's partials in chunk order and rounds.
// Max/argmax: the same row/column mapping without chunks. Per element the winner is chosen by a total
// order (NaN above every number, then value, then the smaller position), which makes the parallel result
// equal the CPU's sequential scan: first NaN if any, else the first position of the maximum.
// All loops are grid-strided with 64-bit indices; loop bounds inside a warp/block depend only on the
// warp/block index, so every lane reaches each shuffle and every thread each barrier.
#include "reduce_dims.cuh"
#include "device_math.cuh"

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace memtrain::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr std::int64_t kMaxBlocks = 65535;
constexpr std::int64_t kBlockPerRowLen = 4096;  // rows (chunks) at least this long get a block, not a warp

// Chunking targets: enough independent work to fill an H200 (132 SMs) when there are few outputs.
constexpr std::int64_t kRowMinChunk = 4096;        // elements per (row, chunk) item
constexpr std::int64_t kRowTargetItems = 1024;     // warps/blocks
constexpr std::int64_t kColMinChunk = 64;          // reduce steps per (o, chunk, i) thread
constexpr std::int64_t kColTargetItems = 1 << 16;  // threads
constexpr std::int64_t kMaxChunks = 1024;

unsigned grid_for(std::int64_t work, std::int64_t per_block) {
  const std::int64_t blocks = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(std::clamp<std::int64_t>(blocks, 1, kMaxBlocks));
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

template <FloatFormat F>
using S = cvt::StorageT<F>;

// An element widened exactly to double (as the CPU's static_cast<double> of its f32/f64 compute value).
template <FloatFormat F>
__device__ inline double load_f64(const S<F>* __restrict__ src, std::size_t i) {
  if constexpr (F == FloatFormat::f64) {
    return __longlong_as_double(static_cast<long long>(src[i]));
  } else {
    return static_cast<double>(cvt::float_of(cvt::widen_to_f32<F>(src[i])));
  }
}

template <FloatFormat F, bool kSquare>
__device__ inline double term(const S<F>* __restrict__ src, std::size_t i) {
  const double v = load_f64<F>(src, i);
  return kSquare ? v * v : v;
}

// One rounding from double, as cpu::convert from f64.
template <FloatFormat Out>
__device__ inline S<Out> round_from_f64(double v) {
  return cvt::narrow_from_f64<Out>(static_cast<std::uint64_t>(__double_as_longlong(v)));
}

using device::warp_sum;
// Sum over the block (blockDim.x == kThreads), valid in thread 0 (device_math.cuh).
__device__ inline double block_sum(double v, double* shared) { return device::block_sum_to_thread0<kWarps>(v, shared); }

// Item w of the row kernels is (row w / chunks, chunk w % chunks); with one chunk it is the output index,
// with several it is the index of its partial in [outer, chunks, 1].
template <FloatFormat Out>
__device__ inline void write_sum(double acc, std::int64_t w, std::int64_t chunks, S<Out>* __restrict__ out,
                                 double* __restrict__ partials) {
  if (chunks == 1) {
    out[w] = round_from_f64<Out>(acc);
  } else {
    partials[w] = acc;
  }
}

template <FloatFormat In, FloatFormat Out, bool kSquare>
__global__ void sum_rows_warp_kernel(const S<In>* __restrict__ src, std::int64_t items, std::int64_t reduce,
                                     std::int64_t chunks, std::int64_t chunk_len, S<Out>* __restrict__ out,
                                     double* __restrict__ partials) {
  const int lane = threadIdx.x & 31;
  const std::int64_t warp_stride = static_cast<std::int64_t>(gridDim.x) * kWarps;
  for (std::int64_t w = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; w < items;
       w += warp_stride) {
    const std::int64_t row = w / chunks, begin = (w % chunks) * chunk_len;
    const std::int64_t end = min(reduce, begin + chunk_len);
    const std::size_t base = static_cast<std::size_t>(row) * static_cast<std::size_t>(reduce);
    double acc = 0.0;
    for (std::int64_t r = begin + lane; r < end; r += 32) acc += term<In, kSquare>(src, base + r);
    acc = warp_sum(acc);
    if (lane == 0) write_sum<Out>(acc, w, chunks, out, partials);
  }
}

template <FloatFormat In, FloatFormat Out, bool kSquare>
__global__ void sum_rows_block_kernel(const S<In>* __restrict__ src, std::int64_t items, std::int64_t reduce,
                                      std::int64_t chunks, std::int64_t chunk_len, S<Out>* __restrict__ out,
                                      double* __restrict__ partials) {
  __shared__ double shared[kWarps];
  for (std::int64_t w = blockIdx.x; w < items; w += gridDim.x) {
    const std::int64_t row = w / chunks, begin = (w % chunks) * chunk_len;
    const std::int64_t end = min(reduce, begin + chunk_len);
    const std::size_t base = static_cast<std::size_t>(row) * static_cast<std::size_t>(reduce);
    double acc = 0.0;
    for (std::int64_t r = begin + threadIdx.x; r < end; r += kThreads) acc += term<In, kSquare>(src, base + r);
    const double total = block_sum(acc, shared);
    if (threadIdx.x == 0) write_sum<Out>(total, w, chunks, out, partials);
  }
}

// Thread t is (o, chunk c, i) with t = (o * chunks + c) * inner + i: the index of its partial, or of its
// output when chunks == 1.
template <FloatFormat In, FloatFormat Out, bool kSquare>
__global__ void sum_cols_kernel(const S<In>* __restrict__ src, std::int64_t items, std::int64_t reduce,
                                std::int64_t inner, std::int64_t chunks, std::int64_t chunk_len,
                                S<Out>* __restrict__ out, double* __restrict__ partials) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < items; t += stride) {
    const std::int64_t i = t % inner, rest = t / inner;
    const std::int64_t o = rest / chunks, begin = (rest % chunks) * chunk_len;
    const std::int64_t end = min(reduce, begin + chunk_len);
    const std::size_t base = (static_cast<std::size_t>(o) * static_cast<std::size_t>(reduce)) *
                                 static_cast<std::size_t>(inner) + static_cast<std::size_t>(i);
    double acc = 0.0;
    for (std::int64_t r = begin; r < end; ++r) {
      acc += term<In, kSquare>(src, base + static_cast<std::size_t>(r) * static_cast<std::size_t>(inner));
    }
    write_sum<Out>(acc, t, chunks, out, partials);
  }
}

// Pass 2: out[o * inner + i] = sum over c (in order) of partials[(o * chunks + c) * inner + i].
template <FloatFormat Out>
__global__ void sum_finalize_kernel(const double* __restrict__ partials, std::int64_t outputs, std::int64_t inner,
                                    std::int64_t chunks, S<Out>* __restrict__ out) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t m = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; m < outputs; m += stride) {
    const std::int64_t o = m / inner, i = m % inner;
    const double* p = partials + o * chunks * inner + i;
    double acc = 0.0;
    for (std::int64_t c = 0; c < chunks; ++c) acc += p[c * inner];
    out[m] = round_from_f64<Out>(acc);
  }
}

template <FloatFormat In, FloatFormat Out, bool kSquare>
cudaError_t sum_typed(const void* src_v, void* out_v, std::int64_t outer, std::int64_t reduce, std::int64_t inner,
                      const SumPlan& plan, double* partials, cudaStream_t stream) {
  const auto* src = static_cast<const S<In>*>(src_v);
  auto* out = static_cast<S<Out>*>(out_v);
  const std::int64_t chunks = plan.chunks, len = plan.chunk_len;
  if (inner == 1) {
    const std::int64_t items = outer * chunks;
    if (len >= kBlockPerRowLen) {
      sum_rows_block_kernel<In, Out, kSquare>
          <<<grid_for(items, 1), kThreads, 0, stream>>>(src, items, reduce, chunks, len, out, partials);
    } else {
      sum_rows_warp_kernel<In, Out, kSquare>
          <<<grid_for(items, kWarps), kThreads, 0, stream>>>(src, items, reduce, chunks, len, out, partials);
    }
  } else {
    const std::int64_t items = outer * chunks * inner;
    sum_cols_kernel<In, Out, kSquare>
        <<<grid_for(items, kThreads), kThreads, 0, stream>>>(src, items, reduce, inner, chunks, len, out, partials);
  }
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  if (chunks > 1) {
    const std::int64_t outputs = outer * inner;
    sum_finalize_kernel<Out><<<grid_for(outputs, kThreads), kThreads, 0, stream>>>(partials, outputs, inner, chunks, out);
  }
  return cudaGetLastError();
}

// ---- max / argmax ----

template <FloatFormat F>
struct Compute {
  using type = float;  // f32, f16, bf16 compare as f32, as the CPU (exact widening)
};
template <>
struct Compute<FloatFormat::f64> {
  using type = double;
};
template <FloatFormat F>
using C = typename Compute<F>::type;

template <FloatFormat F>
__device__ inline C<F> load_c(const S<F>* __restrict__ src, std::size_t i) {
  if constexpr (F == FloatFormat::f64) {
    return __longlong_as_double(static_cast<long long>(src[i]));
  } else {
    return cvt::float_of(cvt::widen_to_f32<F>(src[i]));
  }
}

// Back to storage as the CPU's values.to(dtype) does (exact, except that a NaN is re-encoded as it is there).
template <FloatFormat F>
__device__ inline S<F> store_c(C<F> v) {
  if constexpr (F == FloatFormat::f64) {
    return static_cast<S<F>>(__double_as_longlong(v));
  } else {
    return cvt::narrow_from_f32<F>(cvt::bits_of(v));
  }
}

template <typename T>
struct Best {
  T v;
  std::int64_t idx;  // < 0: no element seen yet
};

// The winner of two candidates: NaN above every number, then the larger value, then the smaller position
// (so equal values and NaNs keep the first). Commutative and associative: any combining order gives the
// same winner.
template <typename T>
__device__ inline Best<T> pick(Best<T> a, Best<T> b) {
  if (b.idx < 0) return a;
  if (a.idx < 0) return b;
  const bool na = isnan(a.v), nb = isnan(b.v);
  if (na != nb) return na ? a : b;
  if (!na && a.v != b.v) return a.v > b.v ? a : b;
  return a.idx <= b.idx ? a : b;
}

template <typename T>
__device__ inline Best<T> warp_pick(Best<T> b) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    Best<T> other;
    other.v = __shfl_xor_sync(0xffffffffu, b.v, offset);
    other.idx = __shfl_xor_sync(0xffffffffu, b.idx, offset);
    b = pick(b, other);
  }
  return b;
}

template <FloatFormat F>
__device__ inline void write_max(const Best<C<F>>& b, std::int64_t m, S<F>* __restrict__ values,
                                 std::int64_t* __restrict__ indices) {
  if (values != nullptr) values[m] = store_c<F>(b.v);
  if (indices != nullptr) indices[m] = b.idx;
}

// inner == 1, reduce < kBlockPerRowLen: one warp per row.
template <FloatFormat F>
__global__ void max_rows_warp_kernel(const S<F>* __restrict__ src, std::int64_t rows, std::int64_t reduce,
                                     S<F>* __restrict__ values, std::int64_t* __restrict__ indices) {
  const int lane = threadIdx.x & 31;
  const std::int64_t warp_stride = static_cast<std::int64_t>(gridDim.x) * kWarps;
  for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; row < rows;
       row += warp_stride) {
    const std::size_t base = static_cast<std::size_t>(row) * static_cast<std::size_t>(reduce);
    Best<C<F>> best{C<F>(0), -1};
    for (std::int64_t r = lane; r < reduce; r += 32) best = pick(best, Best<C<F>>{load_c<F>(src, base + r), r});
    best = warp_pick(best);
    if (lane == 0) write_max<F>(best, row, values, indices);
  }
}

// inner == 1, long rows: one block per row.
template <FloatFormat F>
__global__ void max_rows_block_kernel(const S<F>* __restrict__ src, std::int64_t rows, std::int64_t reduce,
                                      S<F>* __restrict__ values, std::int64_t* __restrict__ indices) {
  __shared__ C<F> shared_v[kWarps];
  __shared__ std::int64_t shared_i[kWarps];
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const std::size_t base = static_cast<std::size_t>(row) * static_cast<std::size_t>(reduce);
    Best<C<F>> best{C<F>(0), -1};
    for (std::int64_t r = threadIdx.x; r < reduce; r += kThreads) {
      best = pick(best, Best<C<F>>{load_c<F>(src, base + r), r});
    }
    best = warp_pick(best);
    if ((threadIdx.x & 31) == 0) {
      shared_v[threadIdx.x / 32] = best.v;
      shared_i[threadIdx.x / 32] = best.idx;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      Best<C<F>> total{shared_v[0], shared_i[0]};
      for (int w = 1; w < kWarps; ++w) total = pick(total, Best<C<F>>{shared_v[w], shared_i[w]});
      write_max<F>(total, row, values, indices);
    }
    __syncthreads();  // shared_* are rewritten by the next row
  }
}

// inner > 1: one thread per (o, i), scanning r in order exactly as the CPU does.
template <FloatFormat F>
__global__ void max_cols_kernel(const S<F>* __restrict__ src, std::int64_t outputs, std::int64_t reduce,
                                std::int64_t inner, S<F>* __restrict__ values, std::int64_t* __restrict__ indices) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t m = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; m < outputs; m += stride) {
    const std::int64_t o = m / inner, i = m % inner;
    const std::size_t base = (static_cast<std::size_t>(o) * static_cast<std::size_t>(reduce)) *
                                 static_cast<std::size_t>(inner) + static_cast<std::size_t>(i);
    const std::size_t step = static_cast<std::size_t>(inner);
    C<F> best = load_c<F>(src, base);
    std::int64_t best_r = 0;
    for (std::int64_t r = 1; r < reduce && !isnan(best); ++r) {
      const C<F> v = load_c<F>(src, base + static_cast<std::size_t>(r) * step);
      if (v > best || isnan(v)) {
        best = v;
        best_r = r;
      }
    }
    write_max<F>(Best<C<F>>{best, best_r}, m, values, indices);
  }
}

template <FloatFormat F>
cudaError_t max_typed(const void* src_v, void* values_v, std::int64_t* indices, std::int64_t outer,
                      std::int64_t reduce, std::int64_t inner, cudaStream_t stream) {
  const auto* src = static_cast<const S<F>*>(src_v);
  auto* values = static_cast<S<F>*>(values_v);
  if (inner == 1) {
    if (reduce >= kBlockPerRowLen) {
      max_rows_block_kernel<F><<<grid_for(outer, 1), kThreads, 0, stream>>>(src, outer, reduce, values, indices);
    } else {
      max_rows_warp_kernel<F><<<grid_for(outer, kWarps), kThreads, 0, stream>>>(src, outer, reduce, values, indices);
    }
  } else {
    const std::int64_t outputs = outer * inner;
    max_cols_kernel<F>
        <<<grid_for(outputs, kThreads), kThreads, 0, stream>>>(src, outputs, reduce, inner, values, indices);
  }
  return cudaGetLastError();
}

std::size_t storage_bytes(FloatFormat f) {
  switch (f) {
    case FloatFormat::f64: return 8;
    case FloatFormat::f32: return 4;
    case FloatFormat::f16:
    case FloatFormat::bf16: return 2;
    default: return 1;
  }
}

// fn(std::integral_constant<FloatFormat, F>{}) for a format the reductions read (f64, f32, f16, bf16),
// else cudaErrorInvalidValue.
template <typename Fn>
cudaError_t with_reduce_format(FloatFormat format, Fn&& fn) {
  using F = FloatFormat;
  switch (format) {
    case F::f64: return fn(std::integral_constant<F, F::f64>{});
    case F::f32: return fn(std::integral_constant<F, F::f32>{});
    case F::f16: return fn(std::integral_constant<F, F::f16>{});
    case F::bf16: return fn(std::integral_constant<F, F::bf16>{});
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

SumPlan plan_sum_dim(std::int64_t outer, std::int64_t reduce, std::int64_t inner) {
  SumPlan plan;
  plan.chunk_len = std::max<std::int64_t>(reduce, 1);
  const std::int64_t outputs = outer * inner;
  if (outputs <= 0 || reduce <= 0) return plan;
  const bool rows = inner == 1;
  const std::int64_t wanted = ceil_div(rows ? kRowTargetItems : kColTargetItems, outputs);
  const std::int64_t most = ceil_div(reduce, rows ? kRowMinChunk : kColMinChunk);
  const std::int64_t chunks = std::clamp<std::int64_t>(std::min(wanted, most), 1, kMaxChunks);
  plan.chunk_len = ceil_div(reduce, chunks);
  plan.chunks = ceil_div(reduce, plan.chunk_len);  // no empty trailing chunk
  return plan;
}

std::int64_t sum_dim_partials(const SumPlan& plan, std::int64_t outer, std::int64_t inner) {
  return plan.chunks > 1 ? outer * plan.chunks * inner : 0;
}

cudaError_t launch_sum_dim(const void* src, FloatFormat src_format, void* out, FloatFormat out_format, bool square,
                           std::int64_t outer, std::int64_t reduce, std::int64_t inner, const SumPlan& plan,
                           double* partials, cudaStream_t stream) {
  const std::int64_t outputs = outer * inner;
  if (outputs <= 0) return cudaSuccess;
  if (reduce <= 0) {  // an empty sum: +0, which is all-zero bits in every format
    return cudaMemsetAsync(out, 0, static_cast<std::size_t>(outputs) * storage_bytes(out_format), stream);
  }
  if (plan.chunks < 1 || plan.chunk_len < 1 || (plan.chunks > 1 && partials == nullptr)) return cudaErrorInvalidValue;
  using F = FloatFormat;
  if (!square) {
    if (out_format != src_format) return cudaErrorInvalidValue;
    return with_reduce_format(src_format, [&](auto in) {
      constexpr FloatFormat kIn = decltype(in)::value;
      return sum_typed<kIn, kIn, false>(src, out, outer, reduce, inner, plan, partials, stream);
    });
  }
  if (out_format != F::f64) return cudaErrorInvalidValue;
  return with_reduce_format(src_format, [&](auto in) {
    return sum_typed<decltype(in)::value, F::f64, true>(src, out, outer, reduce, inner, plan, partials, stream);
  });
}

cudaError_t launch_max_dim(const void* src, FloatFormat src_format, void* values, std::int64_t* indices,
                           std::int64_t outer, std::int64_t reduce, std::int64_t inner, cudaStream_t stream) {
  if (outer * inner <= 0) return cudaSuccess;
  if (reduce <= 0) return cudaErrorInvalidValue;
  return with_reduce_format(src_format, [&](auto in) {
    return max_typed<decltype(in)::value>(src, values, indices, outer, reduce, inner, stream);
  });
}

}  // namespace memtrain::cuda

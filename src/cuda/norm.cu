// layer_norm and rms_norm on CUDA: the CUDA backend's normalisation entries (src/core/backend_entries.def) at
// the bottom, and the kernels they launch above them, so one file holds a norm's whole CUDA side (reference:
// src/cpu/norm.cpp). Host code compiled by nvcc as C++20 (cmake/memtrain_cuda.cmake says why and how).
//
// Algorithm: one block per row of x viewed as (N, C) (blocks loop over rows, row = blockIdx.x, += gridDim.x).
// Forward: two-pass statistics in f32 (sum -> mean, then sum of squared deviations; RMS: sum of squares),
// each a block reduction (warp shuffles, then one warp over the per-warp sums), then one pass writing the
// output. Backward: per row, one pass for the two (layer norm) or one (RMS) row sums dx needs, then one pass
// writing dx; x is read again instead of a saved normalised copy, as in llm.c.
// dweight / dbias, deterministically: the backward runs G = norm_partial_blocks(N, C) blocks; thread t of
// block b owns columns t, t + blockDim, ... of its block's accumulator row (in shared memory when the
// sums fit in kNormSmemBytes, else directly in its scratch row partials[b, :]) and adds its rows' terms
// there in row order (no atomics, no sharing, so no barrier: a thread only ever touches its own columns),
// then copies it to partials[b, :]. A second kernel sums the G partials per column in a fixed order:
// a block owns 32 columns (one coalesced 128-byte read per warp and partial row); its thread (x, y) sums
// rows b = y, y + 32, ... of column x in f64, then thread (x, 0) adds the 32 results in y order and
// rounds once to T. G depends only on (N, C), not on the device, so a rerun gives the same bits.
// Thread mapping: thread t of a row block handles columns t, t + blockDim, ...: each warp reads 32
// consecutive elements per step (coalesced).
#include "cuda/cuda_backend_entries.h"
#include "cuda/cuda_common.h"
#include "cuda/device_ops.h"
#include "cuda/type_dispatch.h"
#include "kernels/nn.cuh"
#include "memtrain/core/error.h"

#include <cmath>
#include <cstdint>
#include <initializer_list>

namespace memtrain::cuda {

namespace {

using namespace nn_device;

// ---- kernels ----

// Blocks of the backward when it sums dweight/dbias: about 256K threads in flight, at least 128 blocks
// and at most 1024 (the partials then take ~8 MiB for two sums at C = 4096), never more than N.
std::int64_t norm_partial_blocks(std::int64_t N, std::int64_t C) {
  const std::int64_t target = 262144 / static_cast<std::int64_t>(nn_row_threads(C));
  const std::int64_t g = target < 128 ? 128 : (target > 1024 ? 1024 : target);
  return N < g ? (N < 1 ? 1 : N) : g;
}

// Scratch floats the backwards need for `sums` per-column sums (0, 1 or 2) over N rows of C.
std::size_t norm_backward_partial_floats(std::int64_t N, std::int64_t C, int sums) {
  if (N <= 0 || C <= 0 || sums <= 0) return 0;
  return static_cast<std::size_t>(norm_partial_blocks(N, C) * C * sums);
}

// Shared memory a backward block may use for its dweight/dbias accumulators: C <= 4096 for two sums, 8192
// for one. Well under the 48 KiB a launch may ask for without opt-in (with the 128 static bytes of `red`),
// and 2 blocks of 1024 threads per SM still fit.
constexpr std::int64_t kNormSmemBytes = 32 * 1024;

std::size_t norm_smem_bytes(std::int64_t C, int sums) {
  const std::int64_t bytes = C * sums * static_cast<std::int64_t>(sizeof(float));
  return bytes <= kNormSmemBytes ? static_cast<std::size_t>(bytes) : 0;
}

template <typename T>
__device__ __forceinline__ float weight_at(const T* w, std::int64_t c) {
  return w != nullptr ? to_f32(w[c]) : 1.0f;
}

// Both forwards, one kernel: layer norm (kCentre) centres each row on its mean and adds the bias; RMS norm
// scales the raw values (no mean, no bias). mean and rstd (N) are written when non-null.
template <typename T, bool kCentre>
__global__ void norm_forward_kernel(T* out, float* mean, float* rstd, const T* x, const T* weight, const T* bias,
                                    std::int64_t N, std::int64_t C, float eps) {
  __shared__ float red[32];
  const float inv_c = 1.0f / static_cast<float>(C);
  for (std::int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* xr = x + row * C;  // (C)
    T* yr = out + row * C;
    float m = 0.0f;
    if constexpr (kCentre) {
      float s = 0.0f;
      for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) s += to_f32(xr[c]);
      m = block_sum(s, red) * inv_c;
    }
    float v = 0.0f;  // sum of squares of the centred (layer norm) or raw (RMS) values
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float d = kCentre ? to_f32(xr[c]) - m : to_f32(xr[c]);
      v += d * d;
    }
    const float r = 1.0f / sqrtf(block_sum(v, red) * inv_c + eps);
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      if constexpr (kCentre) {
        const float norm = (to_f32(xr[c]) - m) * r;
        yr[c] = from_f32<T>(norm * weight_at(weight, c) + (bias != nullptr ? to_f32(bias[c]) : 0.0f));
      } else {
        yr[c] = from_f32<T>(to_f32(xr[c]) * r * weight_at(weight, c));
      }
    }
    if (threadIdx.x == 0) {
      if (kCentre && mean != nullptr) mean[row] = m;
      if (rstd != nullptr) rstd[row] = r;
    }
  }
}

// dw_part / db_part: this launch's [gridDim.x, C] partials, or null when that sum is not wanted.
// use_smem: accumulate in dynamic shared memory (one (C) row per wanted sum) and copy to the partials at
// the end; else accumulate in the partials directly.
template <typename T>
__global__ void layer_norm_backward_kernel(T* dx, float* dw_part, float* db_part, const T* dout, const T* x,
                                           const T* weight, const float* mean, const float* rstd, std::int64_t N,
                                           std::int64_t C, bool use_smem) {
  __shared__ float red[32];
  extern __shared__ float acc[];  // (sums, C) when use_smem
  const float inv_c = 1.0f / static_cast<float>(C);
  float* dw_out = dw_part != nullptr ? dw_part + blockIdx.x * C : nullptr;  // this block's (C)
  float* db_out = db_part != nullptr ? db_part + blockIdx.x * C : nullptr;
  float* dw = dw_out != nullptr && use_smem ? acc : dw_out;
  float* db = db_out != nullptr && use_smem ? acc + (dw_out != nullptr ? C : 0) : db_out;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    if (dw != nullptr) dw[c] = 0.0f;
    if (db != nullptr) db[c] = 0.0f;
  }
  for (std::int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* xr = x + row * C;  // (C)
    const T* gr = dout + row * C;
    T* dxr = dx + row * C;
    const float m = mean[row], r = rstd[row];
    // dnorm = dout * w; dx = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm))
    float sum_dn = 0.0f, sum_dn_norm = 0.0f;
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float norm = (to_f32(xr[c]) - m) * r;
      const float g = to_f32(gr[c]);
      const float dn = g * weight_at(weight, c);
      sum_dn += dn;
      sum_dn_norm += dn * norm;
      if (dw != nullptr) dw[c] += g * norm;  // only this thread touches column c of this block's row
      if (db != nullptr) db[c] += g;
    }
    const float mean_dn = block_sum(sum_dn, red) * inv_c;
    const float mean_dn_norm = block_sum(sum_dn_norm, red) * inv_c;
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float norm = (to_f32(xr[c]) - m) * r;
      const float dn = to_f32(gr[c]) * weight_at(weight, c);
      dxr[c] = from_f32<T>(r * (dn - mean_dn - norm * mean_dn_norm));
    }
  }
  if (use_smem) {  // same thread, same columns as the accumulation: no barrier needed
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      if (dw_out != nullptr) dw_out[c] = dw[c];
      if (db_out != nullptr) db_out[c] = db[c];
    }
  }
}

template <typename T>
__global__ void rms_norm_backward_kernel(T* dx, float* dw_part, const T* dout, const T* x, const T* weight,
                                         const float* rstd, std::int64_t N, std::int64_t C, bool use_smem) {
  __shared__ float red[32];
  extern __shared__ float acc[];  // (C) when use_smem
  const float inv_c = 1.0f / static_cast<float>(C);
  float* dw_out = dw_part != nullptr ? dw_part + blockIdx.x * C : nullptr;  // this block's (C)
  float* dw = dw_out != nullptr && use_smem ? acc : dw_out;
  if (dw != nullptr) {
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) dw[c] = 0.0f;
  }
  for (std::int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* xr = x + row * C;  // (C)
    const T* gr = dout + row * C;
    T* dxr = dx + row * C;
    const float r = rstd[row];
    // dx = rstd * (dout * w - norm * mean(dout * w * norm)), norm = x * rstd
    float s = 0.0f;
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float norm = to_f32(xr[c]) * r;
      const float g = to_f32(gr[c]);
      s += g * weight_at(weight, c) * norm;
      if (dw != nullptr) dw[c] += g * norm;
    }
    const float mean_s = block_sum(s, red) * inv_c;
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float xv = to_f32(xr[c]);
      dxr[c] = from_f32<T>(r * (to_f32(gr[c]) * weight_at(weight, c) - xv * r * mean_s));
    }
  }
  if (use_smem && dw_out != nullptr) {  // same thread, same columns as the accumulation: no barrier needed
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) dw_out[c] = dw[c];
  }
}

// Column sums of the partials, for s = blockIdx.y < gridDim.y (1 or 2): dst_s[c] = sum over b < G of
// partials[s, b, c], in f64 in a fixed order, rounded once to T (dst_1 used only when gridDim.y == 2).
// Block (kSumCols, kSumRows): blocks loop over chunks of kSumCols columns; thread (x, y) sums rows
// b = y, y + kSumRows, ... of column x, then thread (x, 0) adds the kSumRows results in y order.
constexpr int kSumCols = 32, kSumRows = 32;

template <typename T>
__global__ void column_sum_kernel(T* dst0, T* dst1, const float* partials, std::int64_t G, std::int64_t C) {
  __shared__ double part[kSumRows][kSumCols];
  T* dst = blockIdx.y == 0 ? dst0 : dst1;
  const float* p = partials + static_cast<std::int64_t>(blockIdx.y) * G * C;  // (G, C)
  const std::int64_t chunks = (C + kSumCols - 1) / kSumCols;
  // chunk depends only on blockIdx.x, so every thread of the block runs the same iterations (barriers).
  for (std::int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    const std::int64_t c = chunk * kSumCols + threadIdx.x;
    double s = 0.0;
    if (c < C) {
#pragma unroll 4
      for (std::int64_t b = threadIdx.y; b < G; b += kSumRows) s += p[b * C + c];
    }
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
      double t = 0.0;
#pragma unroll
      for (int j = 0; j < kSumRows; ++j) t += part[j][threadIdx.x];
      dst[c] = from_f32<T>(static_cast<float>(t));
    }
    __syncthreads();  // part is rewritten by the next chunk
  }
}

// ---- launchers: enqueue on `stream` (N, C > 0, checked by the entries) and return the launch's error ----

// Sums `sums` (1 or 2) consecutive (G, C) partial blocks into dst0 and (when sums == 2) dst1.
template <typename T>
cudaError_t launch_column_sum(T* dst0, T* dst1, const float* partials, int sums, std::int64_t G, std::int64_t C,
                              cudaStream_t stream) {
  const std::int64_t chunks = (C + kSumCols - 1) / kSumCols;
  const dim3 grid(static_cast<unsigned>(chunks < kMaxRowBlocks ? chunks : kMaxRowBlocks), static_cast<unsigned>(sums));
  column_sum_kernel<T><<<grid, dim3(kSumCols, kSumRows), 0, stream>>>(dst0, dst1, partials, G, C);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_layer_norm_forward(T* out, float* mean, float* rstd, const T* x, const T* weight, const T* bias,
                                      std::int64_t N, std::int64_t C, float eps, cudaStream_t stream) {
  norm_forward_kernel<T, true>
      <<<nn_row_blocks(N), nn_row_threads(C), 0, stream>>>(out, mean, rstd, x, weight, bias, N, C, eps);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_rms_norm_forward(T* out, float* rstd, const T* x, const T* weight, std::int64_t N, std::int64_t C,
                                    float eps, cudaStream_t stream) {
  norm_forward_kernel<T, false>
      <<<nn_row_blocks(N), nn_row_threads(C), 0, stream>>>(out, nullptr, rstd, x, weight, nullptr, N, C, eps);
  return cudaGetLastError();
}

// dweight, dbias (C) overwritten when non-null, summed over rows through `partials`
// (norm_backward_partial_floats(N, C, count of non-null dweight/dbias) floats, or null when both are null).
template <typename T>
cudaError_t launch_layer_norm_backward(T* dx, T* dweight, T* dbias, const T* dout, const T* x, const T* weight,
                                       const float* mean, const float* rstd, std::int64_t N, std::int64_t C,
                                       float* partials, cudaStream_t stream) {
  const bool sums = dweight != nullptr || dbias != nullptr;
  const std::int64_t G = sums ? norm_partial_blocks(N, C) : nn_row_blocks(N);
  float* dw_part = dweight != nullptr ? partials : nullptr;
  float* db_part = dbias != nullptr ? partials + (dweight != nullptr ? G * C : 0) : nullptr;
  const int nsums = (dweight != nullptr ? 1 : 0) + (dbias != nullptr ? 1 : 0);
  const std::size_t smem = norm_smem_bytes(C, nsums);
  layer_norm_backward_kernel<T><<<static_cast<unsigned>(G), nn_row_threads(C), smem, stream>>>(
      dx, dw_part, db_part, dout, x, weight, mean, rstd, N, C, smem > 0);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  if (!sums) return cudaSuccess;
  // partials holds [dw (G, C)][db (G, C)] for the wanted sums, in that order.
  return launch_column_sum(dweight != nullptr ? dweight : dbias, dbias, partials, nsums, G, C, stream);
}

template <typename T>
cudaError_t launch_rms_norm_backward(T* dx, T* dweight, const T* dout, const T* x, const T* weight, const float* rstd,
                                     std::int64_t N, std::int64_t C, float* partials, cudaStream_t stream) {
  const std::int64_t G = dweight != nullptr ? norm_partial_blocks(N, C) : nn_row_blocks(N);
  float* dw_part = dweight != nullptr ? partials : nullptr;
  const std::size_t smem = dweight != nullptr ? norm_smem_bytes(C, 1) : 0;
  rms_norm_backward_kernel<T><<<static_cast<unsigned>(G), nn_row_threads(C), smem, stream>>>(
      dx, dw_part, dout, x, weight, rstd, N, C, smem > 0);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  if (dweight != nullptr) return launch_column_sum(dweight, static_cast<T*>(nullptr), dw_part, 1, G, C, stream);
  return cudaSuccess;
}

// ---- the entries' checks ----

using detail::launch_stream;
using detail::Scratch;

// The kernels' typed view of a tensor's data; null for an undefined (not wanted) tensor.
template <typename T>
T* data_of(const Tensor& t) {
  return static_cast<T*>(out_or_null(t));
}

// x [..., C] as the kernels' (N, C) rows; x has at least one dim (the front-end's check).
struct Rows {
  std::int64_t N, C;
};
Rows rows_of(const Tensor& x) {
  const std::int64_t C = x.size(-1);
  std::int64_t N = 1;
  for (std::int64_t d = 0; d + 1 < x.dim(); ++d) N *= x.size(d);
  return {N, C};
}

// What the forward kernels cannot take beyond check_nn_operands; false when there are no rows.
bool check_forward(const char* op, Rows rows, double eps) {
  MT_CHECK(std::isfinite(eps) && eps >= 0.0, op, "eps={} must be finite and >= 0", eps);
  if (rows.N == 0) return false;
  MT_CHECK(rows.C > 0, op, "C is 0: nothing to normalise over in {} rows", rows.N);
  return true;
}

// A backward over no rows (or rows of no columns) launches nothing: the wanted sums over rows are 0.
void zero_sums(const Tensor& x, Rows rows, std::initializer_list<const Tensor*> sums) {
  if (rows.C == 0) return;
  for (const Tensor* s : sums) {
    if (s->defined()) fill(s->data_ptr(), x.dtype(), static_cast<std::size_t>(rows.C), 0.0, x.device().index);
  }
}

}  // namespace

// ---- the backend contract's normalisation entries: f32, bf16 or f16, one dtype for x, weight and bias,
// contiguous; stats in f32 ----

DType CudaBackend::norm_stats_dtype(DType) const { return DType::f32; }

void CudaBackend::layer_norm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                                     const Tensor& weight, const Tensor& bias, double eps) const {
  constexpr const char* op = "layer_norm";
  check_nn_operands(op, x, {{"weight", &weight}, {"bias", &bias}});
  const Rows rows = rows_of(x);
  if (!check_forward(op, rows, eps)) return;
  detail::on_device_with_float_type(op, x.device().index, x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    MT_CUDA_CHECK(op, launch_layer_norm_forward<T>, data_of<T>(out), mean.data<float>(), rstd.data<float>(),
                  data_of<T>(x), data_of<T>(weight), data_of<T>(bias), rows.N, rows.C, static_cast<float>(eps),
                  launch_stream());
  });
}

void CudaBackend::layer_norm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dout,
                                      const Tensor& x, const Tensor& weight, const Tensor& mean,
                                      const Tensor& rstd) const {
  constexpr const char* op = "layer_norm_backward";
  check_nn_operands(op, x, {{"output gradient", &dout}, {"weight", &weight}});
  const Rows rows = rows_of(x);
  const int device = x.device().index;
  if (rows.N == 0 || rows.C == 0) return zero_sums(x, rows, {&dw, &db});
  detail::require_device(op, device);
  const int sums = dw.defined() + db.defined();
  Scratch partials(device, norm_backward_partial_floats(rows.N, rows.C, sums) * sizeof(float));
  detail::DeviceGuard guard(device, op);
  detail::with_float_type(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    MT_CUDA_CHECK(op, launch_layer_norm_backward<T>, data_of<T>(dx), data_of<T>(dw), data_of<T>(db), data_of<T>(dout),
                  data_of<T>(x), data_of<T>(weight), mean.data<float>(), rstd.data<float>(), rows.N, rows.C,
                  partials.as<float>(), launch_stream());
  });
}

void CudaBackend::rms_norm_forward(const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                                   double eps) const {
  constexpr const char* op = "rms_norm";
  check_nn_operands(op, x, {{"weight", &weight}});
  const Rows rows = rows_of(x);
  if (!check_forward(op, rows, eps)) return;
  detail::on_device_with_float_type(op, x.device().index, x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    MT_CUDA_CHECK(op, launch_rms_norm_forward<T>, data_of<T>(out), rstd.data<float>(), data_of<T>(x),
                  data_of<T>(weight), rows.N, rows.C, static_cast<float>(eps), launch_stream());
  });
}

void CudaBackend::rms_norm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dout, const Tensor& x,
                                    const Tensor& weight, const Tensor& rstd) const {
  constexpr const char* op = "rms_norm_backward";
  check_nn_operands(op, x, {{"output gradient", &dout}, {"weight", &weight}});
  const Rows rows = rows_of(x);
  const int device = x.device().index;
  if (rows.N == 0 || rows.C == 0) return zero_sums(x, rows, {&dw});
  detail::require_device(op, device);
  Scratch partials(device, norm_backward_partial_floats(rows.N, rows.C, dw.defined() ? 1 : 0) * sizeof(float));
  detail::DeviceGuard guard(device, op);
  detail::with_float_type(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    MT_CUDA_CHECK(op, launch_rms_norm_backward<T>, data_of<T>(dx), data_of<T>(dw), data_of<T>(dout), data_of<T>(x),
                  data_of<T>(weight), rstd.data<float>(), rows.N, rows.C, partials.as<float>(), launch_stream());
  });
}

}  // namespace memtrain::cuda

// CUDA backend, host side of src/cuda/convert.h: argument checks and the dispatch from DType
// to the launchers in kernels/convert.cuh (conversion and FP8 in convert.cu, reductions in reduce.cu).
//
// Every entry point checks its arguments first (so bad arguments throw before any device is touched),
// then requires the device, switches to it and enqueues on its current stream (cuda/stream.h).
#include "cuda/convert.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "cuda/device_ops.h"
#include "cuda/cuda_common.h"
#include "cuda/float_format.h"
#include "kernels/convert.cuh"

#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <vector>

namespace memtrain::cuda {

namespace {

using detail::launch_stream;

using detail::float_format;

bool is_fp8(DType t) { return t == DType::f8_e4m3 || t == DType::f8_e5m2; }
bool is_f32_or_bf16(DType t) { return t == DType::f32 || t == DType::bf16; }
bool is_reducible(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto pa = reinterpret_cast<std::uintptr_t>(a);
  const auto pb = reinterpret_cast<std::uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

void check_matrix(const char* op, std::int64_t rows, std::int64_t cols) {
  MT_CHECK(rows >= 0 && cols >= 0, op, "negative shape ({}, {})", rows, cols);
  MT_CHECK(cols == 0 || rows <= std::numeric_limits<std::int64_t>::max() / 4 / cols, op,
           "shape ({}, {}) is too large", rows, cols);
}

void check_quantize(const char* op, const void* src, DType src_dtype, const void* dst, DType dst_dtype, std::size_t n) {
  MT_CHECK(is_f32_or_bf16(src_dtype), op, "source dtype {} is not supported (f32, bf16)", dtype_name(src_dtype));
  MT_CHECK(is_fp8(dst_dtype), op, "destination dtype {} is not an FP8 dtype (f8_e4m3, f8_e5m2)",
           dtype_name(dst_dtype));
  MT_CHECK(n == 0 || (src != nullptr && dst != nullptr), op, "null pointer for {} elements", n);
  MT_CHECK(n == 0 || !overlaps(src, n * dtype_size(src_dtype), dst, n), op, "source and destination overlap");
}

void check_dequantize(const char* op, const void* src, DType src_dtype, const void* dst, DType dst_dtype,
                      std::size_t n) {
  MT_CHECK(is_fp8(src_dtype), op, "source dtype {} is not an FP8 dtype (f8_e4m3, f8_e5m2)", dtype_name(src_dtype));
  MT_CHECK(is_f32_or_bf16(dst_dtype), op, "destination dtype {} is not supported (f32, bf16)",
           dtype_name(dst_dtype));
  MT_CHECK(n == 0 || (src != nullptr && dst != nullptr), op, "null pointer for {} elements", n);
  MT_CHECK(n == 0 || !overlaps(src, n, dst, n * dtype_size(dst_dtype)), op, "source and destination overlap");
}

void quantize_impl(const char* op, const void* src, DType src_dtype, float scale, const float* scale_ptr, void* dst,
                   DType dst_dtype, std::size_t n, float* amax_out, int device) {
  check_quantize(op, src, src_dtype, dst, dst_dtype, n);
  MT_CHECK(amax_out == nullptr || amax_out != scale_ptr, op, "amax and scale must be different floats");
  if (n == 0 && amax_out == nullptr) return;
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  MT_CUDA_CHECK(op, launch_quantize_fp8, src, *float_format(src_dtype), scale, scale_ptr,
                static_cast<std::uint8_t*>(dst), dst_dtype == DType::f8_e4m3, n, amax_out, launch_stream());
}

void dequantize_impl(const char* op, const void* src, DType src_dtype, float inv_scale, const float* inv_scale_ptr,
                     void* dst, DType dst_dtype, std::size_t n, int device) {
  check_dequantize(op, src, src_dtype, dst, dst_dtype, n);
  if (n == 0) return;
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  MT_CUDA_CHECK(op, launch_dequantize_fp8, static_cast<const std::uint8_t*>(src), src_dtype == DType::f8_e4m3,
                inv_scale, inv_scale_ptr, dst, *float_format(dst_dtype), n, launch_stream());
}

// Scratch for sum's per-block partials: one buffer per device, allocated on first use (category workspace,
// so it shows in the memory report) and kept for the process, like gemm's cuBLAS workspace. The lock is
// held while both kernels of a sum are enqueued: sums on the legacy stream run in order, so a later
// sum's kernels run only after this one's have finished with the scratch (other streams: see sum()).
std::mutex sum_mutex;

double* sum_scratch(int device) {
  static std::vector<double*> scratch;  // guarded by sum_mutex
  if (scratch.empty()) scratch.resize(static_cast<std::size_t>(detail::usable_device_count()), nullptr);
  double*& p = scratch.at(static_cast<std::size_t>(device));
  if (p == nullptr) {
    const Block block =
        Allocator::get(Device::cuda(device)).allocate(kSumMaxBlocks * sizeof(double), MemoryCategory::workspace);
    p = static_cast<double*>(block.ptr);
  }
  return p;
}

// The checks the blockwise fp8 entries share after their dtype checks; false when there are no elements.
bool blockwise_has_work(const char* op, std::size_t n, const float* inv_scales, int device) {
  if (n == 0) return false;
  MT_CHECK(inv_scales != nullptr, op, "null inverse-scale pointer");
  detail::require_device(op, device);
  return true;
}

}  // namespace

void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n, int device) {
  constexpr const char* op = "cuda::cast";
  const std::optional<FloatFormat> from = float_format(src_dtype);
  const std::optional<FloatFormat> to = float_format(dst_dtype);
  MT_CHECK(from && to, op, "{} -> {} is not supported (floating dtypes: f64, f32, f16, bf16, f8_e4m3, f8_e5m2)",
           dtype_name(src_dtype), dtype_name(dst_dtype));
  if (n == 0) return;
  MT_CHECK(src != nullptr && dst != nullptr, op, "null pointer for {} elements", n);
  const std::size_t src_bytes = n * dtype_size(src_dtype), dst_bytes = n * dtype_size(dst_dtype);
  MT_CHECK((src == dst && src_bytes == dst_bytes) || !overlaps(src, src_bytes, dst, dst_bytes), op,
           "source and destination overlap ({} -> {}); only an in-place cast between same-size dtypes is allowed",
           dtype_name(src_dtype), dtype_name(dst_dtype));
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  MT_CUDA_CHECK(op, launch_cast, src, *from, dst, *to, n, launch_stream());
}

void quantize_fp8(const void* src, DType src_dtype, float scale, void* dst, DType dst_dtype, std::size_t n,
                  float* amax_out, int device) {
  quantize_impl("cuda::quantize_fp8", src, src_dtype, scale, nullptr, dst, dst_dtype, n, amax_out, device);
}

void quantize_fp8(const void* src, DType src_dtype, const float* scale, void* dst, DType dst_dtype, std::size_t n,
                  float* amax_out, int device) {
  constexpr const char* op = "cuda::quantize_fp8";
  MT_CHECK(scale != nullptr, op, "null scale pointer");
  quantize_impl(op, src, src_dtype, 1.0f, scale, dst, dst_dtype, n, amax_out, device);
}

void dequantize_fp8(const void* src, DType src_dtype, float inv_scale, void* dst, DType dst_dtype, std::size_t n,
                    int device) {
  dequantize_impl("cuda::dequantize_fp8", src, src_dtype, inv_scale, nullptr, dst, dst_dtype, n, device);
}

void dequantize_fp8(const void* src, DType src_dtype, const float* inv_scale, void* dst, DType dst_dtype,
                    std::size_t n, int device) {
  constexpr const char* op = "cuda::dequantize_fp8";
  MT_CHECK(inv_scale != nullptr, op, "null inverse-scale pointer");
  dequantize_impl(op, src, src_dtype, 1.0f, inv_scale, dst, dst_dtype, n, device);
}

void quantize_fp8_blockwise(const void* src, DType src_dtype, void* dst, DType dst_dtype, float* inv_scales,
                            std::int64_t rows, std::int64_t cols, Fp8Tiling tiling, int device) {
  constexpr const char* op = "cuda::quantize_fp8_blockwise";
  check_matrix(op, rows, cols);
  const auto n = static_cast<std::size_t>(rows * cols);
  check_quantize(op, src, src_dtype, dst, dst_dtype, n);
  if (!blockwise_has_work(op, n, inv_scales, device)) return;
  detail::DeviceGuard guard(device, op);
  MT_CUDA_CHECK(op, launch_quantize_fp8_blockwise, src, *float_format(src_dtype), static_cast<std::uint8_t*>(dst),
                dst_dtype == DType::f8_e4m3, inv_scales, rows, cols, static_cast<int>(fp8_tile_rows(tiling)),
                launch_stream());
}

void dequantize_fp8_blockwise(const void* src, DType src_dtype, const float* inv_scales, void* dst, DType dst_dtype,
                              std::int64_t rows, std::int64_t cols, Fp8Tiling tiling, int device) {
  constexpr const char* op = "cuda::dequantize_fp8_blockwise";
  check_matrix(op, rows, cols);
  const auto n = static_cast<std::size_t>(rows * cols);
  check_dequantize(op, src, src_dtype, dst, dst_dtype, n);
  if (!blockwise_has_work(op, n, inv_scales, device)) return;
  detail::DeviceGuard guard(device, op);
  MT_CUDA_CHECK(op, launch_dequantize_fp8_blockwise, static_cast<const std::uint8_t*>(src),
                src_dtype == DType::f8_e4m3, inv_scales, dst, *float_format(dst_dtype), rows, cols,
                static_cast<int>(fp8_tile_rows(tiling)), launch_stream());
}

void amax(const void* src, DType dtype, std::size_t n, float* out, int device) {
  constexpr const char* op = "cuda::amax";
  MT_CHECK(is_reducible(dtype), op, "dtype {} is not supported (f32, bf16, f16)", dtype_name(dtype));
  MT_CHECK(out != nullptr && (n == 0 || src != nullptr), op, "null pointer for {} elements", n);
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  MT_CUDA_CHECK(op, launch_amax, src, *float_format(dtype), n, out, launch_stream());
}

void sum(const void* src, DType dtype, std::size_t n, float* out, int device) {
  constexpr const char* op = "cuda::sum";
  MT_CHECK(is_reducible(dtype), op, "dtype {} is not supported (f32, bf16, f16)", dtype_name(dtype));
  MT_CHECK(out != nullptr && (n == 0 || src != nullptr), op, "null pointer for {} elements", n);
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  // The persistent scratch serves the legacy stream, whose sums run in order; a sum on another stream
  // gets its own, so two streams never share one.
  std::unique_lock lock(sum_mutex, std::defer_lock);
  std::optional<detail::CallScratch> own;
  double* partials = nullptr;
  if (n != 0 && launch_stream() == nullptr) {
    lock.lock();
    partials = sum_scratch(device);
  } else if (n != 0) {
    own.emplace(device, kSumMaxBlocks * sizeof(double));
    partials = static_cast<double*>(own->get());
  }
  MT_CUDA_CHECK(op, launch_sum, src, *float_format(dtype), n, partials, out, launch_stream());
}

void sum_rows(const void* src, DType dtype, std::int64_t rows, std::int64_t cols, float* out, int device) {
  constexpr const char* op = "cuda::sum_rows";
  MT_CHECK(is_reducible(dtype), op, "dtype {} is not supported (f32, bf16, f16)", dtype_name(dtype));
  check_matrix(op, rows, cols);
  if (rows == 0) return;
  MT_CHECK(out != nullptr && (cols == 0 || src != nullptr), op, "null pointer for a ({}, {}) input", rows, cols);
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  MT_CUDA_CHECK(op, launch_sum_rows, src, *float_format(dtype), rows, cols, out, launch_stream());
}

}  // namespace memtrain::cuda

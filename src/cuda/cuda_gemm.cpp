// Row-major gemm through cuBLAS (cublasGemmEx, f32 accumulation), one cuBLAS handle per device,
// enqueued on the current stream of the device (src/cuda/stream.h).
//
// Row-major <-> column-major: a row-major [r, c] matrix with row stride ld is, to cuBLAS, the
// column-major [c, r] matrix with leading dimension ld, i.e. its transpose. So row-major
// C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: call cuBLAS with B first, A second, and
// the sizes (n, m, k); each operand keeps its own transpose flag.
#include "cuda/device_ops.h"

#include "memtrain/core/allocator.h"
#include "cuda/cuda_common.h"
#include "cuda/type_dispatch.h"

#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <mutex>
#include <optional>
#include <vector>

namespace memtrain::cuda {

namespace {

// cuBLAS's recommended workspace: 32 MiB on Hopper, 4 MiB elsewhere. We hand it memory from our
// allocator (category workspace) so it shows up in the memory report instead of being a hidden
// cudaMalloc inside cuBLAS.
std::size_t workspace_bytes(int device) {
  int major = 0;
  detail::check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cuda::gemm",
                     "cudaDeviceGetAttribute");
  return major >= 9 ? (std::size_t{32} << 20) : (std::size_t{4} << 20);
}

// One handle per device with its workspace; created on first use with `device` current. Handles and
// workspaces are never destroyed: at process exit cuBLAS and the CUDA runtime may already be torn down,
// and the driver frees everything.
struct HandleState {
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

// Held from looking the handle up until its gemm is enqueued: the handle is shared by every thread and
// stream of its device, and its stream and workspace are set for each call.
std::mutex handle_mutex;

// Call with handle_mutex held and `device` current.
const HandleState& handle_for(int device) {
  constexpr const char* op = "cuda::gemm";
  static std::vector<HandleState> handles;
  if (handles.empty()) handles.resize(static_cast<std::size_t>(detail::usable_device_count()));
  HandleState& h = handles.at(static_cast<std::size_t>(device));
  if (h.handle != nullptr) return h;
  cublasHandle_t created = nullptr;
  MT_CUBLAS_CHECK(op, cublasCreate, &created);
  try {
    // Split-K partial sums stay in f32 even when C is bf16: the default would add them in bf16.
    MT_CUBLAS_CHECK(op, cublasSetMathMode, created,
                    static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    const std::size_t bytes = workspace_bytes(device);
    const Block ws = Allocator::get(Device::cuda(device)).allocate(bytes, MemoryCategory::workspace);
    h = HandleState{created, ws.ptr, bytes};
  } catch (...) {
    cublasDestroy(created);
    throw;
  }
  return h;
}

cudaDataType_t cuda_type(DType t) {
  if (t == DType::f32) return CUDA_R_32F;
  return t == DType::f16 ? CUDA_R_16F : CUDA_R_16BF;
}

}  // namespace

void gemm(DType dtype, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
          const void* a, std::int64_t lda, const void* b, std::int64_t ldb, float beta, void* c, std::int64_t ldc,
          int device) {
  constexpr const char* op = "cuda::gemm";
  detail::check_float_dtype(op, dtype);
  MT_CHECK(m >= 0 && n >= 0 && k >= 0, op, "negative size m={} n={} k={}", m, n, k);
  // Stored (row-major) shapes: A is [m, k], or [k, m] when trans_a; B is [k, n], or [n, k] when trans_b.
  const std::int64_t a_cols = trans_a ? m : k;
  const std::int64_t b_cols = trans_b ? k : n;
  MT_CHECK(lda >= std::max<std::int64_t>(1, a_cols), op, "lda={} is less than the {} columns of A ({}x{}{})", lda,
           a_cols, trans_a ? k : m, a_cols, trans_a ? ", transposed" : "");
  MT_CHECK(ldb >= std::max<std::int64_t>(1, b_cols), op, "ldb={} is less than the {} columns of B ({}x{}{})", ldb,
           b_cols, trans_b ? n : k, b_cols, trans_b ? ", transposed" : "");
  MT_CHECK(ldc >= std::max<std::int64_t>(1, n), op, "ldc={} is less than the {} columns of C ({}x{})", ldc, n, m, n);
  MT_CHECK(std::max({m, n, k, lda, ldb, ldc}) <= INT_MAX, op,
           "sizes beyond 32 bits are not supported (m={} n={} k={} lda={} ldb={} ldc={})", m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  MT_CHECK(c != nullptr && (k == 0 || (a != nullptr && b != nullptr)), op, "null pointer (m={} n={} k={})", m, n,
           k);
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  const cudaStream_t stream = detail::current_stream(device);
  std::lock_guard lock(handle_mutex);
  const HandleState& h = handle_for(device);
  const cublasHandle_t handle = h.handle;
  MT_CUBLAS_CHECK(op, cublasSetStream, handle, stream);
  // cublasSetStream resets the workspace to cuBLAS's own pool; point it at ours again. The device's
  // workspace serves the legacy stream (its gemms run in order); a gemm on another stream gets its own
  // for the call, so two streams never share one.
  std::optional<detail::CallScratch> own;
  void* workspace = h.workspace;
  if (stream != nullptr) {
    own.emplace(device, h.workspace_bytes);
    workspace = own->get();
  }
  MT_CUBLAS_CHECK(op, cublasSetWorkspace, handle, workspace, h.workspace_bytes);
  const cudaDataType_t type = cuda_type(dtype);
  MT_CUBLAS_CHECK(op, cublasGemmEx, handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                  static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b, type,
                  static_cast<int>(ldb), a, type, static_cast<int>(lda), &beta, c, type, static_cast<int>(ldc),
                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

}  // namespace memtrain::cuda

// Dense linear algebra for GaLore's projector on CUDA (src/cuda/optim.h): Householder QR
// (cusolverDnSgeqrf + cusolverDnSorgqr), a thin SVD by Jacobi rotations (cusolverDnSgesvdj) and a transpose.
// One cuSOLVER handle per device, created on first use and kept for the process (as cuda_gemm.cpp's cuBLAS
// handles), set to the current stream at each call so its work is ordered with every other memtrain kernel. Scratch is
// memtrain allocator memory (MemoryCategory::workspace): returned to the caching allocator while cuSOLVER's
// work may still be queued, which is safe because everything runs on one stream. A basis refresh is rare
// (every update_gap steps), so each call waits for its info flag and reports failures at once.
#include "cuda/optim.h"

#include "cuda/cuda_common.h"
#include "kernels/galore.cuh"
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"

#include <cusolverDn.h>

#include <algorithm>
#include <climits>
#include <mutex>
#include <vector>

namespace memtrain::cuda {
namespace {

// Where this file's launches go: the current stream of the current device (src/cuda/stream.h);
// every entry point calls it under its DeviceGuard, so that is the entry point's device.
cudaStream_t launch_stream() { return detail::current_stream(); }

const char* cusolver_status_name(cusolverStatus_t s) {
  switch (s) {
    case CUSOLVER_STATUS_SUCCESS: return "CUSOLVER_STATUS_SUCCESS";
    case CUSOLVER_STATUS_NOT_INITIALIZED: return "CUSOLVER_STATUS_NOT_INITIALIZED";
    case CUSOLVER_STATUS_ALLOC_FAILED: return "CUSOLVER_STATUS_ALLOC_FAILED";
    case CUSOLVER_STATUS_INVALID_VALUE: return "CUSOLVER_STATUS_INVALID_VALUE";
    case CUSOLVER_STATUS_ARCH_MISMATCH: return "CUSOLVER_STATUS_ARCH_MISMATCH";
    case CUSOLVER_STATUS_EXECUTION_FAILED: return "CUSOLVER_STATUS_EXECUTION_FAILED";
    case CUSOLVER_STATUS_INTERNAL_ERROR: return "CUSOLVER_STATUS_INTERNAL_ERROR";
    case CUSOLVER_STATUS_NOT_SUPPORTED: return "CUSOLVER_STATUS_NOT_SUPPORTED";
    default: return "unknown cusolverStatus_t";
  }
}

// As detail::check_cuda for cuSOLVER: "<where>: <fn> failed: <status name> (<code>)".
void check_cusolver(cusolverStatus_t status, const char* where, const char* fn) {
  if (status == CUSOLVER_STATUS_SUCCESS) return;
  cudaGetLastError();
  ::memtrain::detail::throw_error(where,
                                  fmt::format("{} failed: {} ({})", fn, cusolver_status_name(status), static_cast<int>(status)));
}

#define MT_CUSOLVER_CHECK(where, fn, ...) check_cusolver(fn(__VA_ARGS__), (where), #fn)

// Call with `device` current. Never destroyed (see cuda_gemm.cpp's handles). Each lookup points the handle
// at the current stream, where the caller's cuSOLVER calls then go.
cusolverDnHandle_t solver_for(const char* op, int device) {
  static std::mutex mutex;
  static std::vector<cusolverDnHandle_t> handles;
  std::lock_guard lock(mutex);
  const auto index = static_cast<std::size_t>(device);
  if (handles.size() <= index) handles.resize(index + 1, nullptr);
  cusolverDnHandle_t& h = handles[index];
  if (h == nullptr) {
    cusolverDnHandle_t created = nullptr;
    MT_CUSOLVER_CHECK(op, cusolverDnCreate, &created);
    h = created;
  }
  MT_CUSOLVER_CHECK(op, cusolverDnSetStream, h, launch_stream());
  return h;
}

// Device scratch from the allocator, returned on scope exit.
class Scratch {
 public:
  Scratch(int device, std::size_t nbytes)
      : allocator_(Allocator::get(Device::cuda(device))),
        block_(allocator_.allocate(std::max<std::size_t>(nbytes, 1), MemoryCategory::workspace)) {}
  ~Scratch() { allocator_.deallocate(block_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* get() const {
    return static_cast<T*>(block_.ptr);
  }

 private:
  Allocator& allocator_;
  Block block_;
};

// Waits for the device and throws unless every info flag is 0. cudaMemcpy runs on the legacy stream,
// which waits for the solver's work on any (blocking) memtrain stream.
void check_info(const char* op, const int* dev_info, int count, const char* const* calls) {
  int host[2] = {0, 0};
  MT_CUDA_CHECK(op, cudaMemcpy, host, dev_info, static_cast<std::size_t>(count) * sizeof(int),
                cudaMemcpyDeviceToHost);
  for (int i = 0; i < count; ++i) {
    MT_CHECK(host[i] == 0, op, "{} reported info = {} ({})", calls[i], host[i],
             host[i] < 0 ? "an invalid argument" : "no convergence within the sweep limit");
  }
}

void check_int_sizes(const char* op, std::int64_t rows, std::int64_t cols) {
  MT_CHECK(rows <= INT_MAX && cols <= INT_MAX, op, "sizes beyond 32 bits are not supported ({} x {})", rows, cols);
}

class GesvdjParams {
 public:
  explicit GesvdjParams(const char* op) { MT_CUSOLVER_CHECK(op, cusolverDnCreateGesvdjInfo, &params_); }
  ~GesvdjParams() { cusolverDnDestroyGesvdjInfo(params_); }
  GesvdjParams(const GesvdjParams&) = delete;
  GesvdjParams& operator=(const GesvdjParams&) = delete;
  gesvdjInfo_t get() const { return params_; }

 private:
  gesvdjInfo_t params_ = nullptr;
};

}  // namespace

void orthonormalize_columns(float* a, std::int64_t rows, std::int64_t cols, int device) {
  constexpr const char* op = "cuda::orthonormalize_columns";
  MT_CHECK(rows >= cols && cols >= 1, op, "needs rows >= cols >= 1, got {} x {}", rows, cols);
  MT_CHECK(a != nullptr, op, "null pointer for a {} x {} matrix", rows, cols);
  check_int_sizes(op, rows, cols);
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  cusolverDnHandle_t h = solver_for(op, device);
  const int m = static_cast<int>(rows), n = static_cast<int>(cols);
  Scratch tau(device, static_cast<std::size_t>(n) * sizeof(float));
  Scratch info(device, 2 * sizeof(int));
  int lwork_qr = 0, lwork_q = 0;
  MT_CUSOLVER_CHECK(op, cusolverDnSgeqrf_bufferSize, h, m, n, a, m, &lwork_qr);
  MT_CUSOLVER_CHECK(op, cusolverDnSorgqr_bufferSize, h, m, n, n, a, m, tau.get<float>(), &lwork_q);
  const int lwork = std::max({lwork_qr, lwork_q, 1});
  Scratch work(device, static_cast<std::size_t>(lwork) * sizeof(float));
  MT_CUSOLVER_CHECK(op, cusolverDnSgeqrf, h, m, n, a, m, tau.get<float>(), work.get<float>(), lwork,
                    info.get<int>());
  MT_CUSOLVER_CHECK(op, cusolverDnSorgqr, h, m, n, n, a, m, tau.get<float>(), work.get<float>(), lwork,
                    info.get<int>() + 1);
  const char* const calls[] = {"cusolverDnSgeqrf", "cusolverDnSorgqr"};
  check_info(op, info.get<int>(), 2, calls);
}

void top_singular_vectors(const float* a, std::int64_t rows, std::int64_t cols, std::int64_t r, float* u, float* v,
                          int device) {
  constexpr const char* op = "cuda::top_singular_vectors";
  MT_CHECK(rows >= 1 && cols >= 1 && r >= 1 && r <= std::min(rows, cols), op,
           "needs 1 <= r <= min(rows, cols), got r = {} for a {} x {} matrix", r, rows, cols);
  MT_CHECK(a != nullptr && u != nullptr, op, "null pointer (a or u) for a {} x {} matrix", rows, cols);
  check_int_sizes(op, rows, cols);
  MT_CHECK(rows * cols <= INT_MAX, op, "a {} x {} matrix has more than 2^31 elements", rows, cols);
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  cusolverDnHandle_t h = solver_for(op, device);
  const int m = static_cast<int>(rows), n = static_cast<int>(cols), mn = std::min(m, n);
  const auto fbytes = [](std::int64_t count) { return static_cast<std::size_t>(count) * sizeof(float); };
  // gesvdj overwrites its input, so it works on a copy.
  Scratch a_copy(device, fbytes(rows * cols));
  Scratch s(device, fbytes(mn));
  Scratch uu(device, fbytes(rows * mn));
  Scratch vv(device, fbytes(cols * mn));
  Scratch info(device, sizeof(int));
  MT_CUDA_CHECK(op, cudaMemcpyAsync, a_copy.get<float>(), a, fbytes(rows * cols), cudaMemcpyDeviceToDevice,
                launch_stream());
  GesvdjParams params(op);  // defaults: tolerance at machine precision, 100 sweeps, sorted descending
  int lwork = 0;
  MT_CUSOLVER_CHECK(op, cusolverDnSgesvdj_bufferSize, h, CUSOLVER_EIG_MODE_VECTOR, /*econ=*/1, m, n,
                    a_copy.get<float>(), m, s.get<float>(), uu.get<float>(), m, vv.get<float>(), n, &lwork,
                    params.get());
  lwork = std::max(lwork, 1);
  Scratch work(device, fbytes(lwork));
  MT_CUSOLVER_CHECK(op, cusolverDnSgesvdj, h, CUSOLVER_EIG_MODE_VECTOR, /*econ=*/1, m, n, a_copy.get<float>(), m,
                    s.get<float>(), uu.get<float>(), m, vv.get<float>(), n, work.get<float>(), lwork, info.get<int>(),
                    params.get());
  const char* const calls[] = {"cusolverDnSgesvdj"};
  check_info(op, info.get<int>(), 1, calls);
  // Column-major with leading dimensions rows / cols: the first r columns are contiguous.
  MT_CUDA_CHECK(op, cudaMemcpyAsync, u, uu.get<float>(), fbytes(rows * r), cudaMemcpyDeviceToDevice, launch_stream());
  if (v != nullptr) {
    MT_CUDA_CHECK(op, cudaMemcpyAsync, v, vv.get<float>(), fbytes(cols * r), cudaMemcpyDeviceToDevice,
                  launch_stream());
  }
}

void transpose(const float* src, std::int64_t rows, std::int64_t cols, float* dst, int device) {
  constexpr const char* op = "cuda::transpose";
  MT_CHECK(rows >= 0 && cols >= 0, op, "negative size {} x {}", rows, cols);
  if (rows == 0 || cols == 0) return;
  MT_CHECK(src != nullptr && dst != nullptr && src != dst, op,
           "needs distinct non-null buffers (not in place) for a {} x {} matrix", rows, cols);
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  MT_CUDA_CHECK(op, launch_transpose_f32, src, rows, cols, dst, launch_stream());
}

}  // namespace memtrain::cuda

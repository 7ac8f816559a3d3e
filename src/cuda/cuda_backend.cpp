// CUDA backend, host side: device discovery, copies, and the dispatch from DType to the launchers in
// kernels/elementwise.cuh. gemm lives in cuda_gemm.cpp, device memory in cuda_memory.cpp.
//
// Ordering: every kernel and cuBLAS call goes to the current stream of its device (the legacy default
// stream unless a cuda::StreamGuard is active; src/cuda/stream.h), so memtrain's work on one
// stream runs in call order; copies (cudaMemcpy, on the legacy stream) and synchronize() wait for it.
#include "cuda/device_ops.h"

#include "cpu/convert.h"
#include "cuda/cuda_common.h"
#include "kernels/elementwise.cuh"

#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace memtrain::cuda {

using ::memtrain::detail::throw_error;

namespace {

using detail::launch_stream;

struct Availability {
  int count = 0;       // usable devices; 0 when reason is set
  std::string reason;  // why nothing is usable
};

std::string error_text(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}

// Can `device` run the kernels compiled into this build? A device older than every architecture we
// compiled for (or a driver too old for our PTX) fails here instead of at the first launch.
std::string probe_device(int device) {
  int previous = 0;
  if (cudaError_t err = cudaGetDevice(&previous); err != cudaSuccess) {
    cudaGetLastError();
    return "cudaGetDevice failed: " + error_text(err);
  }
  std::string problem;
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
    problem = "cudaSetDevice failed: " + error_text(err);
  } else if (cudaError_t err = probe_elementwise_kernels(); err != cudaSuccess) {
    cudaDeviceProp prop{};
    const bool named = cudaGetDeviceProperties(&prop, device) == cudaSuccess;
    problem = fmt::format("{} (compute capability {}.{}) cannot run memtrain's kernels: {}",
                          named ? prop.name : "device", prop.major, prop.minor, error_text(err));
  }
  cudaGetLastError();
  cudaSetDevice(previous);
  return problem;
}

Availability probe() {
  Availability a;
  try {
    int count = 0;
    if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
      cudaGetLastError();
      a.reason = "cudaGetDeviceCount failed: " + error_text(err);
      return a;
    }
    if (count <= 0) {
      a.reason = "no CUDA device found";
      return a;
    }
    // Only device 0 is probed here (it creates a context); other devices are probed on first use.
    if (std::string problem = probe_device(0); !problem.empty()) {
      a.reason = "cuda:0: " + problem;
      return a;
    }
    a.count = count;
  } catch (const std::exception& e) {
    a = Availability{0, std::string("probing CUDA failed: ") + e.what()};
  } catch (...) {
    a = Availability{0, "probing CUDA failed with an unknown exception"};
  }
  return a;
}

const Availability& availability() {
  static const Availability a = probe();
  return a;
}

using detail::in;
using detail::out;

// Checks shared by add and mul; false when there is nothing to do.
bool prepare_binary(const char* op, const void* a, const void* b, void* c, DType dtype, std::size_t n,
                    int device) {
  MT_CHECK(dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16, op,
           "dtype {} is not supported on CUDA (f32, f16, bf16)", dtype_name(dtype));
  if (n == 0) return false;
  MT_CHECK(a != nullptr && b != nullptr && c != nullptr, op, "null pointer for {} elements", n);
  detail::require_device(op, device);
  return true;
}

// The kernels/elementwise.cuh launchers of one binary op, with the names its errors give (MT_CUDA_CHECK's).
struct BinaryLaunchers {
  cudaError_t (*f32)(const float*, const float*, float*, std::size_t, cudaStream_t);
  cudaError_t (*f16)(const __half*, const __half*, __half*, std::size_t, cudaStream_t);
  cudaError_t (*bf16)(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, std::size_t, cudaStream_t);
  const char* f32_name;
  const char* f16_name;
  const char* bf16_name;
};
#define MEMTRAIN_BINARY_LAUNCHERS(name)                                                                       \
  BinaryLaunchers {                                                                                           \
    launch_##name##_f32, launch_##name##_f16, launch_##name##_bf16, "launch_" #name "_f32",                   \
        "launch_" #name "_f16", "launch_" #name "_bf16"                                                       \
  }

// c = a op b elementwise: prepare_binary's checks, then op's launcher for dtype.
void run_binary(const char* op, const BinaryLaunchers& l, const void* a, const void* b, void* c, DType dtype,
                std::size_t n, int device) {
  if (!prepare_binary(op, a, b, c, dtype, n, device)) return;
  detail::DeviceGuard guard(device, op);
  if (dtype == DType::f32) {
    detail::check_cuda(l.f32(in<float>(a), in<float>(b), out<float>(c), n, launch_stream()), op, l.f32_name);
  } else if (dtype == DType::f16) {
    detail::check_cuda(l.f16(in<__half>(a), in<__half>(b), out<__half>(c), n, launch_stream()), op, l.f16_name);
  } else {
    detail::check_cuda(l.bf16(in<__nv_bfloat16>(a), in<__nv_bfloat16>(b), out<__nv_bfloat16>(c), n, launch_stream()),
                       op, l.bf16_name);
  }
}

}  // namespace

namespace detail {

void check_cuda(cudaError_t err, const char* where, const char* fn) {
  if (err == cudaSuccess) return;
  cudaGetLastError();
  throw_error(where, fmt::format("{} failed: {}", fn, error_text(err)));
}

void check_cublas(cublasStatus_t status, const char* where, const char* fn) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  cudaGetLastError();
  throw_error(where, fmt::format("{} failed: {}: {}", fn, cublasGetStatusName(status), cublasGetStatusString(status)));
}

void require_device(const char* where, int device) {
  const Availability& a = availability();
  if (a.count == 0) throw_error(where, "no usable CUDA device: " + a.reason);
  MT_CHECK(device >= 0 && device < a.count, where, "device index {} out of range ({} CUDA device(s))", device,
           a.count);
  if (device == 0) return;  // probed by availability()
  // Other devices are probed once, on first use, so a process that only uses cuda:0 creates one context.
  static std::mutex mutex;
  static std::vector<std::optional<std::string>> problems;  // nullopt: not probed yet; "": usable
  std::lock_guard lock(mutex);
  if (problems.empty()) problems.resize(static_cast<std::size_t>(a.count));
  std::optional<std::string>& problem = problems[static_cast<std::size_t>(device)];
  if (!problem) problem = probe_device(device);
  if (!problem->empty()) throw_error(where, fmt::format("cuda:{}: {}", device, *problem));
}

DeviceGuard::DeviceGuard(int device, const char* where) : device_(device) {
  MT_CUDA_CHECK(where, cudaGetDevice, &previous_);
  if (previous_ != device_) MT_CUDA_CHECK(where, cudaSetDevice, device_);
}

DeviceGuard::~DeviceGuard() {
  // Restoring cannot sensibly fail after the switch succeeded; a destructor must not throw anyway.
  if (previous_ >= 0 && previous_ != device_) cudaSetDevice(previous_);
}

}  // namespace detail

namespace detail {
int usable_device_count() { return availability().count; }
std::string unusable_reason() { return availability().reason; }
}  // namespace detail

void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t nbytes) {
  constexpr const char* op = "cuda::copy";
  if (nbytes == 0) return;
  MT_CHECK(dst != nullptr && src != nullptr, op, "null pointer copying {} bytes from {} to {}", nbytes,
           src_device.str(), dst_device.str());
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memmove(dst, src, nbytes);
    return;
  }
  if (dst_device.is_cuda()) detail::require_device(op, dst_device.index);
  if (src_device.is_cuda()) detail::require_device(op, src_device.index);
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device.index != src_device.index) {
    MT_CUDA_CHECK(op, cudaMemcpyPeer, dst, dst_device.index, src, src_device.index, nbytes);
    return;
  }
  const cudaMemcpyKind kind = dst_device.is_cuda()
                                  ? (src_device.is_cuda() ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                  : cudaMemcpyDeviceToHost;
  detail::DeviceGuard guard(dst_device.is_cuda() ? dst_device.index : src_device.index, op);
  // cudaMemcpy goes to the legacy default stream, whatever stream is current. memtrain's streams are
  // blocking ones, which the legacy stream waits for and which wait for it: the copy starts after all
  // work enqueued before it on any of them, and work enqueued after it sees the copied bytes.
  MT_CUDA_CHECK(op, cudaMemcpy, dst, src, nbytes, kind);
}

void detail::synchronize_device(int device) {
  constexpr const char* op = "cuda::synchronize";
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  MT_CUDA_CHECK(op, cudaDeviceSynchronize);
}

void fill(void* dst, DType dtype, std::size_t n, double value, int device) {
  constexpr const char* op = "cuda::fill";
  if (n == 0) return;
  MT_CHECK(dst != nullptr, op, "null pointer for {} elements of {}", n, dtype_name(dtype));
  detail::require_device(op, device);
  // The value is converted once on the host, by the CPU rules (rounding, saturation, clamping), and the
  // kernel copies its bit pattern; little-endian, so the low bytes of `pattern` hold it.
  std::uint64_t pattern = 0;
  cpu::write_from_double(&pattern, dtype, value);
  detail::DeviceGuard guard(device, op);
  switch (dtype_size(dtype)) {
    case 1:
      MT_CUDA_CHECK(op, launch_fill_u8, out<std::uint8_t>(dst), static_cast<std::uint8_t>(pattern), n, launch_stream());
      break;
    case 2:
      MT_CUDA_CHECK(op, launch_fill_u16, out<std::uint16_t>(dst), static_cast<std::uint16_t>(pattern), n,
                    launch_stream());
      break;
    case 4:
      MT_CUDA_CHECK(op, launch_fill_u32, out<std::uint32_t>(dst), static_cast<std::uint32_t>(pattern), n,
                    launch_stream());
      break;
    case 8:
      MT_CUDA_CHECK(op, launch_fill_u64, out<std::uint64_t>(dst), pattern, n, launch_stream());
      break;
    default:
      throw_error(op, fmt::format("unexpected element size {} of {}", dtype_size(dtype), dtype_name(dtype)));
  }
}

void add(const void* a, const void* b, void* c, DType dtype, std::size_t n, int device) {
  run_binary("cuda::add", MEMTRAIN_BINARY_LAUNCHERS(add), a, b, c, dtype, n, device);
}

void mul(const void* a, const void* b, void* c, DType dtype, std::size_t n, int device) {
  run_binary("cuda::mul", MEMTRAIN_BINARY_LAUNCHERS(mul), a, b, c, dtype, n, device);
}

#undef MEMTRAIN_BINARY_LAUNCHERS

}  // namespace memtrain::cuda

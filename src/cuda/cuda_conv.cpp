// CUDA backend, conv2d (cuda/conv.h): argument checks, then cuDNN when the build has it
// (MEMTRAIN_HAVE_CUDNN, set by cmake/memtrain_cuda.cmake) or the im2col fallback.
//
// im2col fallback, for a chunk of nb images at a time (Kg = Cin/groups * KH * KW, L = OH * OW):
//   col (Cin*KH*KW, nb*L) = im2col(x chunk)                 rows of group g: [g*Kg, (g+1)*Kg)
//   y (Cout, nb*L) = W_g (Cout_g, Kg) x col_g, per group      one GEMM covers the whole chunk
//   out chunk = y transposed back per image, + bias
// Backward: dout chunk -> channel-major dy (Cout, nb*L); dW_g += dy_g x col_g^T (f32, beta = 1 after the
// first chunk); col_g = W_g^T dy_g, then col2im gathers it into dx. All GEMMs are f32 (bf16/f16 operands are
// widened by the kernels that build col / dy / W), so bf16 rounds once at the end, as on the CPU.
// Chunks keep the column buffers near kFallbackBytes. Scratch is workspace from the device's Allocator,
// returned to its cache once the kernels are enqueued (see cuda_nn.cpp: same stream, so never overtaken).
#include "cuda/conv.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "cuda/device_ops.h"
#include "cuda/cuda_common.h"
#include "cuda/type_dispatch.h"
#include "kernels/conv.cuh"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#if MEMTRAIN_HAVE_CUDNN
#include <cudnn.h>

#include <mutex>
#include <vector>
#endif

namespace memtrain::cuda {

namespace {

using detail::launch_stream;
constexpr std::int64_t kFallbackBytes = std::int64_t{256} << 20;

using detail::Tag;
using detail::with_float_type;

using detail::Scratch;

bool fits_mul(std::int64_t a, std::int64_t b) { return a == 0 || b <= std::numeric_limits<std::int64_t>::max() / a; }

void check_shape(const char* op, DType dtype, const Conv2dShape& s) {
  detail::check_float_dtype(op, dtype);
  MT_CHECK(s.B >= 0 && s.Cin >= 1 && s.H >= 1 && s.W >= 1 && s.Cout >= 1 && s.KH >= 1 && s.KW >= 1, op,
           "bad sizes: x [{}, {}, {}, {}], weight [{}, ., {}, {}]", s.B, s.Cin, s.H, s.W, s.Cout, s.KH, s.KW);
  MT_CHECK(s.stride >= 1 && s.padding >= 0 && s.groups >= 1, op,
           "needs stride >= 1, padding >= 0, groups >= 1, got {}, {}, {}", s.stride, s.padding, s.groups);
  MT_CHECK(s.Cin % s.groups == 0 && s.Cout % s.groups == 0, op, "Cin={} and Cout={} must divide by groups={}", s.Cin,
           s.Cout, s.groups);
  MT_CHECK(s.OH == (s.H + 2 * s.padding - s.KH) / s.stride + 1 && s.OW == (s.W + 2 * s.padding - s.KW) / s.stride + 1 &&
               s.OH >= 1 && s.OW >= 1 && s.H + 2 * s.padding >= s.KH && s.W + 2 * s.padding >= s.KW,
           op, "output {}x{} does not match input {}x{}, kernel {}x{}, stride {}, padding {}", s.OH, s.OW, s.H, s.W,
           s.KH, s.KW, s.stride, s.padding);
  const std::int64_t L = s.OH * s.OW, K = s.Cin * s.KH * s.KW;
  MT_CHECK(L <= INT_MAX && K <= INT_MAX && s.Cout <= INT_MAX, op,
           "sizes beyond 32 bits are not supported (OH*OW={}, Cin*KH*KW={}, Cout={})", L, K, s.Cout);
  MT_CHECK(fits_mul(s.B, s.Cin * s.H * s.W) && fits_mul(s.B, s.Cout * L) && fits_mul(K, L), op,
           "x [{}, {}, {}, {}] / out [{}, {}, {}, {}] elements overflow int64", s.B, s.Cin, s.H, s.W, s.B, s.Cout,
           s.OH, s.OW);
}

[[maybe_unused]] bool env_forces_im2col() {
  const char* v = std::getenv("MEMTRAIN_CONV_IM2COL");
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

ConvGeometry geometry(const Conv2dShape& s) {
  return {s.Cin, s.H, s.W, s.KH, s.KW, s.stride, s.padding, s.OH, s.OW};
}

// Images per chunk: the f32 buffers of one image take floats_per_image; nb * L stays a valid GEMM size.
std::int64_t chunk_images(const Conv2dShape& s, std::int64_t floats_per_image) {
  const std::int64_t L = s.OH * s.OW;
  std::int64_t nb = kFallbackBytes / std::max<std::int64_t>(1, floats_per_image * 4);
  nb = std::min<std::int64_t>(nb, INT_MAX / L);
  return std::clamp<std::int64_t>(nb, 1, std::max<std::int64_t>(1, s.B));
}

// weight as f32: the pointer itself for f32, else a widened copy in `keep`.
template <typename T>
const float* weight_f32(const T* w, std::int64_t n, Scratch& keep, const char* op) {
  if constexpr (std::is_same_v<T, float>) {
    return w;
  } else {
    MT_CUDA_CHECK(op, launch_conv_widen<T>, keep.as<float>(), w, n, launch_stream());
    return keep.as<float>();
  }
}

template <typename T>
void im2col_forward(T* out, const T* x, const T* w, const T* bias, const Conv2dShape& s, int device) {
  constexpr const char* op = "cuda::conv2d_forward";
  const std::int64_t L = s.OH * s.OW, K = s.Cin * s.KH * s.KW, Kg = K / s.groups, Cg = s.Cout / s.groups;
  const std::int64_t nb = chunk_images(s, (K + s.Cout) * L);
  const ConvGeometry g = geometry(s);
  Scratch w_keep(device, std::is_same_v<T, float> ? 0 : static_cast<std::size_t>(s.Cout * Kg) * 4);
  const float* w32 = weight_f32(w, s.Cout * Kg, w_keep, op);
  Scratch col(device, static_cast<std::size_t>(K * nb * L) * 4), y(device, static_cast<std::size_t>(s.Cout * nb * L) * 4);
  for (std::int64_t b0 = 0; b0 < s.B; b0 += nb) {
    const std::int64_t n = std::min(nb, s.B - b0), cols = n * L;
    MT_CUDA_CHECK(op, launch_conv_im2col<T>, col.as<float>(), x + b0 * s.Cin * s.H * s.W, n, g, launch_stream());
    for (std::int64_t gr = 0; gr < s.groups; ++gr) {
      gemm(DType::f32, false, false, Cg, cols, Kg, 1.0f, w32 + gr * Cg * Kg, Kg, col.as<float>() + gr * Kg * cols, cols,
           0.0f, y.as<float>() + gr * Cg * cols, cols, device);
    }
    MT_CUDA_CHECK(op, launch_conv_from_channel_major<T>, out + b0 * s.Cout * L, y.as<float>(), bias, n, s.Cout, L,
                  launch_stream());
  }
}

template <typename T>
void im2col_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const Conv2dShape& s, int device) {
  constexpr const char* op = "cuda::conv2d_backward";
  const std::int64_t L = s.OH * s.OW, K = s.Cin * s.KH * s.KW, Kg = K / s.groups, Cg = s.Cout / s.groups;
  const std::int64_t nb = chunk_images(s, (K + s.Cout) * L);
  const ConvGeometry g = geometry(s);
  constexpr bool kF32 = std::is_same_v<T, float>;
  Scratch w_keep(device, kF32 || dx == nullptr ? 0 : static_cast<std::size_t>(s.Cout * Kg) * 4);
  const float* w32 = dx != nullptr ? weight_f32(w, s.Cout * Kg, w_keep, op) : nullptr;
  // dW accumulates over chunks in f32: in dw itself for f32, else in scratch rounded to T at the end.
  Scratch dw_keep(device, kF32 || dw == nullptr ? 0 : static_cast<std::size_t>(s.Cout * Kg) * 4);
  float* dw32 = nullptr;
  if (dw != nullptr) {
    if constexpr (kF32) {
      dw32 = dw;
    } else {
      dw32 = dw_keep.as<float>();
    }
  }
  Scratch col(device, static_cast<std::size_t>(K * nb * L) * 4), dy(device, static_cast<std::size_t>(s.Cout * nb * L) * 4);
  for (std::int64_t b0 = 0; b0 < s.B; b0 += nb) {
    const std::int64_t n = std::min(nb, s.B - b0), cols = n * L;
    MT_CUDA_CHECK(op, launch_conv_to_channel_major<T>, dy.as<float>(), dout + b0 * s.Cout * L, n, s.Cout, L, launch_stream());
    if (dw32 != nullptr) {
      MT_CUDA_CHECK(op, launch_conv_im2col<T>, col.as<float>(), x + b0 * s.Cin * s.H * s.W, n, g, launch_stream());
      for (std::int64_t gr = 0; gr < s.groups; ++gr) {
        gemm(DType::f32, false, true, Cg, Kg, cols, 1.0f, dy.as<float>() + gr * Cg * cols, cols, col.as<float>() + gr * Kg * cols,
             cols, b0 == 0 ? 0.0f : 1.0f, dw32 + gr * Cg * Kg, Kg, device);
      }
    }
    if (dx != nullptr) {  // reuses col: the dW GEMMs that read it were enqueued first on the same stream
      for (std::int64_t gr = 0; gr < s.groups; ++gr) {
        gemm(DType::f32, true, false, Kg, cols, Cg, 1.0f, w32 + gr * Cg * Kg, Kg, dy.as<float>() + gr * Cg * cols, cols,
             0.0f, col.as<float>() + gr * Kg * cols, cols, device);
      }
      MT_CUDA_CHECK(op, launch_conv_col2im<T>, dx + b0 * s.Cin * s.H * s.W, col.as<float>(), n, g, launch_stream());
    }
  }
  if constexpr (!kF32) {
    if (dw != nullptr) MT_CUDA_CHECK(op, launch_conv_narrow<T>, dw, dw32, s.Cout * Kg, launch_stream());
  }
}

#if MEMTRAIN_HAVE_CUDNN

void check_cudnn(cudnnStatus_t status, const char* where, const char* fn) {
  if (status != CUDNN_STATUS_SUCCESS) {
    ::memtrain::detail::throw_error(where, std::string(fn) + " failed: " + cudnnGetErrorString(status) + " (" +
                                               std::to_string(static_cast<int>(status)) + ")");
  }
}
#define MT_CUDNN_CHECK(where, fn, ...) check_cudnn(fn(__VA_ARGS__), (where), #fn)

// One handle per device, created on first use with `device` current, never destroyed (as cuda_gemm.cpp's
// cuBLAS handles). Each lookup points it at the current stream, where the caller's cuDNN call then goes.
// Like the rest of the backend, one device's handle is not meant for two host threads at once.
cudnnHandle_t handle_for(int device, const char* op) {
  static std::mutex mutex;
  static std::vector<cudnnHandle_t> handles;
  std::lock_guard lock(mutex);
  if (handles.empty()) handles.resize(static_cast<std::size_t>(detail::usable_device_count()), nullptr);
  cudnnHandle_t& h = handles.at(static_cast<std::size_t>(device));
  if (h == nullptr) MT_CUDNN_CHECK(op, cudnnCreate, &h);
  MT_CUDNN_CHECK(op, cudnnSetStream, h, launch_stream());
  return h;
}

// The descriptors of one conv2d; destroyed with it.
class ConvDescriptors {
 public:
  ConvDescriptors(const Conv2dShape& s, DType dtype, const char* op) {
    const cudnnDataType_t t = dtype == DType::f32   ? CUDNN_DATA_FLOAT
                              : dtype == DType::f16 ? CUDNN_DATA_HALF
                                                    : CUDNN_DATA_BFLOAT16;
    auto i = [](std::int64_t v) { return static_cast<int>(v); };
    MT_CUDNN_CHECK(op, cudnnCreateTensorDescriptor, &x);
    MT_CUDNN_CHECK(op, cudnnCreateTensorDescriptor, &y);
    MT_CUDNN_CHECK(op, cudnnCreateFilterDescriptor, &w);
    MT_CUDNN_CHECK(op, cudnnCreateConvolutionDescriptor, &conv);
    MT_CUDNN_CHECK(op, cudnnSetTensor4dDescriptor, x, CUDNN_TENSOR_NCHW, t, i(s.B), i(s.Cin), i(s.H), i(s.W));
    MT_CUDNN_CHECK(op, cudnnSetTensor4dDescriptor, y, CUDNN_TENSOR_NCHW, t, i(s.B), i(s.Cout), i(s.OH), i(s.OW));
    MT_CUDNN_CHECK(op, cudnnSetFilter4dDescriptor, w, t, CUDNN_TENSOR_NCHW, i(s.Cout), i(s.Cin / s.groups), i(s.KH),
                   i(s.KW));
    MT_CUDNN_CHECK(op, cudnnSetConvolution2dDescriptor, conv, i(s.padding), i(s.padding), i(s.stride), i(s.stride), 1,
                   1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT);
    MT_CUDNN_CHECK(op, cudnnSetConvolutionGroupCount, conv, i(s.groups));
    // f32: FMA math only, so no TF32 (10-bit mantissa) sneaks into an f32 convolution.
    MT_CUDNN_CHECK(op, cudnnSetConvolutionMathType, conv, dtype == DType::f32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH);
  }
  ~ConvDescriptors() {
    if (conv != nullptr) cudnnDestroyConvolutionDescriptor(conv);
    if (w != nullptr) cudnnDestroyFilterDescriptor(w);
    if (y != nullptr) cudnnDestroyTensorDescriptor(y);
    if (x != nullptr) cudnnDestroyTensorDescriptor(x);
  }
  ConvDescriptors(const ConvDescriptors&) = delete;
  ConvDescriptors& operator=(const ConvDescriptors&) = delete;

  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
};

// cuDNN's 2^31-element tensor limit and int dims.
bool cudnn_supports(const Conv2dShape& s) {
  const std::int64_t lim = INT_MAX;
  return s.B <= lim && s.B * s.Cin * s.H * s.W <= lim && s.B * s.Cout * s.OH * s.OW <= lim &&
         s.Cout * (s.Cin / s.groups) * s.KH * s.KW <= lim && s.H <= lim && s.W <= lim;
}

// The first (fastest per cuDNN's heuristics) algorithm that runs, is deterministic, and, for f32, is
// neither FFT nor Winograd (their error exceeds plain f32 accumulation) nor a tensor-core one; f32 then
// runs it with FMA math (the descriptor's, so never TF32). false: none.
template <typename Perf, typename Algo>
bool pick(const Perf* perfs, int count, DType dtype, bool (*inexact)(Algo), Algo* algo, cudnnMathType_t* math) {
  for (int k = 0; k < count; ++k) {
    const Perf& p = perfs[k];
    if (p.status != CUDNN_STATUS_SUCCESS || p.determinism != CUDNN_DETERMINISTIC) continue;
    if (dtype == DType::f32 && (inexact(p.algo) || p.mathType == CUDNN_TENSOR_OP_MATH ||
                                p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION))
      continue;
    *algo = p.algo;
    *math = dtype == DType::f32 ? CUDNN_FMA_MATH : p.mathType;  // f32 stays on FMA math: never TF32
    return true;
  }
  return false;
}
bool inexact_fwd(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_FFT || a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
bool inexact_bwd_data(cudnnConvolutionBwdDataAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
bool inexact_bwd_filter(cudnnConvolutionBwdFilterAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

// What the three cuDNN calls share: rank cuDNN's algorithms (find), pick one (pick), set its math type, size
// its workspace (workspace_size) and run it there (run). False, having enqueued nothing, when none is
// acceptable. Perf/Algo are the direction's cuDNN types, kCount its algorithm count.
template <typename Perf, typename Algo, int kCount, typename Find, typename WorkspaceSize, typename Run>
bool run_best_algorithm(const char* op, const ConvDescriptors& d, DType dtype, int device, bool (*inexact)(Algo),
                        Find find, WorkspaceSize workspace_size, Run run) {
  Perf perfs[kCount];
  int count = 0;
  find(kCount, &count, perfs);
  Algo algo{};
  cudnnMathType_t math{};
  if (!pick(perfs, count, dtype, inexact, &algo, &math)) return false;
  MT_CUDNN_CHECK(op, cudnnSetConvolutionMathType, d.conv, math);
  std::size_t bytes = 0;
  workspace_size(algo, &bytes);
  Scratch ws(device, bytes);
  run(algo, ws.get(), bytes);
  return true;
}

constexpr float kOne = 1.0f, kZero = 0.0f;  // alpha and beta: the result overwrites its buffer

bool cudnn_forward(void* out, const void* x, const void* w, DType dtype, const Conv2dShape& s, int device) {
  constexpr const char* op = "cuda::conv2d_forward";
  const cudnnHandle_t h = handle_for(device, op);
  const ConvDescriptors d(s, dtype, op);
  return run_best_algorithm<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t,
                            CUDNN_CONVOLUTION_FWD_ALGO_COUNT>(
      op, d, dtype, device, inexact_fwd,
      [&](int n, int* count, cudnnConvolutionFwdAlgoPerf_t* perfs) {
        MT_CUDNN_CHECK(op, cudnnGetConvolutionForwardAlgorithm_v7, h, d.x, d.w, d.conv, d.y, n, count, perfs);
      },
      [&](cudnnConvolutionFwdAlgo_t algo, std::size_t* bytes) {
        MT_CUDNN_CHECK(op, cudnnGetConvolutionForwardWorkspaceSize, h, d.x, d.w, d.conv, d.y, algo, bytes);
      },
      [&](cudnnConvolutionFwdAlgo_t algo, void* ws, std::size_t bytes) {
        MT_CUDNN_CHECK(op, cudnnConvolutionForward, h, &kOne, d.x, x, d.w, w, d.conv, algo, ws, bytes, &kZero, d.y,
                       out);
      });
}

bool cudnn_backward_data(void* dx, const void* dout, const void* w, DType dtype, const Conv2dShape& s, int device) {
  constexpr const char* op = "cuda::conv2d_backward";
  const cudnnHandle_t h = handle_for(device, op);
  const ConvDescriptors d(s, dtype, op);
  return run_best_algorithm<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t,
                            CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT>(
      op, d, dtype, device, inexact_bwd_data,
      [&](int n, int* count, cudnnConvolutionBwdDataAlgoPerf_t* perfs) {
        MT_CUDNN_CHECK(op, cudnnGetConvolutionBackwardDataAlgorithm_v7, h, d.w, d.y, d.conv, d.x, n, count, perfs);
      },
      [&](cudnnConvolutionBwdDataAlgo_t algo, std::size_t* bytes) {
        MT_CUDNN_CHECK(op, cudnnGetConvolutionBackwardDataWorkspaceSize, h, d.w, d.y, d.conv, d.x, algo, bytes);
      },
      [&](cudnnConvolutionBwdDataAlgo_t algo, void* ws, std::size_t bytes) {
        MT_CUDNN_CHECK(op, cudnnConvolutionBackwardData, h, &kOne, d.w, w, d.y, dout, d.conv, algo, ws, bytes, &kZero,
                       d.x, dx);
      });
}

bool cudnn_backward_filter(void* dw, const void* dout, const void* x, DType dtype, const Conv2dShape& s, int device) {
  constexpr const char* op = "cuda::conv2d_backward";
  const cudnnHandle_t h = handle_for(device, op);
  const ConvDescriptors d(s, dtype, op);
  return run_best_algorithm<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t,
                            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT>(
      op, d, dtype, device, inexact_bwd_filter,
      [&](int n, int* count, cudnnConvolutionBwdFilterAlgoPerf_t* perfs) {
        MT_CUDNN_CHECK(op, cudnnGetConvolutionBackwardFilterAlgorithm_v7, h, d.x, d.y, d.conv, d.w, n, count, perfs);
      },
      [&](cudnnConvolutionBwdFilterAlgo_t algo, std::size_t* bytes) {
        MT_CUDNN_CHECK(op, cudnnGetConvolutionBackwardFilterWorkspaceSize, h, d.x, d.y, d.conv, d.w, algo, bytes);
      },
      [&](cudnnConvolutionBwdFilterAlgo_t algo, void* ws, std::size_t bytes) {
        MT_CUDNN_CHECK(op, cudnnConvolutionBackwardFilter, h, &kOne, d.x, x, d.y, dout, d.conv, algo, ws, bytes,
                       &kZero, d.w, dw);
      });
}

#undef MT_CUDNN_CHECK

#endif  // MEMTRAIN_HAVE_CUDNN

// Whether this call goes to cuDNN: automatic takes it when built, the shape fits and the environment does
// not force im2col; an explicit ConvImpl::cudnn that cannot be honoured throws.
bool wants_cudnn(const char* op, ConvImpl impl, const Conv2dShape& s) {
  if (impl == ConvImpl::im2col) return false;
#if MEMTRAIN_HAVE_CUDNN
  const bool fits = cudnn_supports(s);
  if (impl == ConvImpl::cudnn) {
    MT_CHECK(fits, op, "shape x [{}, {}, {}, {}] exceeds cuDNN's 32-bit limits", s.B, s.Cin, s.H, s.W);
    return true;
  }
  return fits && !env_forces_im2col();
#else
  (void)s;
  MT_CHECK(impl != ConvImpl::cudnn, op, "ConvImpl::cudnn requested, but memtrain was built without cuDNN");
  return false;
#endif
}

[[maybe_unused]] void no_algorithm(const char* op, ConvImpl impl, const char* pass) {
  MT_CHECK(impl != ConvImpl::cudnn, op, "cuDNN offers no deterministic algorithm for the {} pass", pass);
}

}  // namespace

bool conv_cudnn_built() {
#if MEMTRAIN_HAVE_CUDNN
  return true;
#else
  return false;
#endif
}

void conv2d_forward(void* out, const void* x, const void* weight, const void* bias, DType dtype, const Conv2dShape& s,
                    int device, ConvImpl impl) {
  constexpr const char* op = "cuda::conv2d_forward";
  check_shape(op, dtype, s);
  if (s.B == 0) return;
  MT_CHECK(out != nullptr && x != nullptr && weight != nullptr, op, "null pointer for x [{}, {}, {}, {}]", s.B, s.Cin,
           s.H, s.W);
  const bool use_cudnn = wants_cudnn(op, impl, s);
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  bool done = false;
#if MEMTRAIN_HAVE_CUDNN
  if (use_cudnn) {
    done = cudnn_forward(out, x, weight, dtype, s, device);
    if (!done) no_algorithm(op, impl, "forward");
  }
#else
  (void)use_cudnn;
#endif
  with_float_type(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* b = static_cast<const T*>(bias);
    if (!done) {
      im2col_forward<T>(static_cast<T*>(out), static_cast<const T*>(x), static_cast<const T*>(weight), b, s, device);
    } else if (b != nullptr) {
      // cuDNN's bf16 output is already rounded, so bf16 with a bias rounds twice (<= 1 bf16 ulp from the CPU,
      // which rounds once; inside the bf16 tolerance). f32 is unaffected.
      MT_CUDA_CHECK(op, launch_conv_bias_add<T>, static_cast<T*>(out), b, s.B, s.Cout, s.OH * s.OW, launch_stream());
    }
  });
}

void conv2d_backward(void* dx, void* dweight, void* dbias, const void* dout, const void* x, const void* weight,
                     DType dtype, const Conv2dShape& s, int device, ConvImpl impl) {
  constexpr const char* op = "cuda::conv2d_backward";
  check_shape(op, dtype, s);
  if (dx == nullptr && dweight == nullptr && dbias == nullptr) return;
  MT_CHECK((dx == nullptr || weight != nullptr) && (dweight == nullptr || x != nullptr), op,
           "dx needs the weight and dweight needs x (null pointer given)");
  const bool use_cudnn = wants_cudnn(op, impl, s);
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  with_float_type(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (s.B == 0) {  // empty batch: the sums over images are 0
      if (dweight != nullptr) fill(dweight, dtype, static_cast<std::size_t>(s.Cout * (s.Cin / s.groups) * s.KH * s.KW), 0.0, device);
      if (dbias != nullptr) fill(dbias, dtype, static_cast<std::size_t>(s.Cout), 0.0, device);
      return;
    }
    MT_CHECK(dout != nullptr, op, "null output gradient for x [{}, {}, {}, {}]", s.B, s.Cin, s.H, s.W);
    bool dx_done = dx == nullptr, dw_done = dweight == nullptr;
#if MEMTRAIN_HAVE_CUDNN
    if (use_cudnn && !dx_done) {
      dx_done = cudnn_backward_data(dx, dout, weight, dtype, s, device);
      if (!dx_done) no_algorithm(op, impl, "backward-data");
    }
    if (use_cudnn && !dw_done) {
      dw_done = cudnn_backward_filter(dweight, dout, x, dtype, s, device);
      if (!dw_done) no_algorithm(op, impl, "backward-filter");
    }
#else
    (void)use_cudnn;
#endif
    if (!dx_done || !dw_done) {
      im2col_backward<T>(dx_done ? nullptr : static_cast<T*>(dx), dw_done ? nullptr : static_cast<T*>(dweight),
                         static_cast<const T*>(dout), static_cast<const T*>(x), static_cast<const T*>(weight), s,
                         device);
    }
    if (dbias != nullptr) {
      MT_CUDA_CHECK(op, launch_conv_bias_grad<T>, static_cast<T*>(dbias), static_cast<const T*>(dout), s.B, s.Cout,
                    s.OH * s.OW, launch_stream());
    }
  });
}

}  // namespace memtrain::cuda

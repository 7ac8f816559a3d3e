// Row-major gemm through cuBLASLt (src/cuda/gemm_lt.h): one cuBLASLt handle and one workspace
// per device, and a cache of the heuristic's algorithm per problem.
//
// Row-major <-> column-major, as in cuda_gemm.cpp: a row-major [r, c] matrix with row stride ld is the
// column-major [c, r] matrix with leading dimension ld. So row-major C = op(A) op(B) is column-major
// C^T = op(B)^T op(A)^T: cuBLASLt's "A" is our B, its "B" is our A, its sizes are (n, m, k), and each
// operand keeps its own transpose flag. A bias of n elements added along each row of our C is added along
// each column of cuBLASLt's D, whose row count is n: exactly what CUBLASLT_EPILOGUE_BIAS does. cuBLASLt's
// fp8 "TN" rule (its A transposed, its B not) is, in our terms, trans_b && !trans_a.
#include "cuda/gemm_lt.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/device.h"
#include "cuda/device_ops.h"
#include "cuda/cuda_common.h"

#include <cublasLt.h>

#include <algorithm>
#include <compare>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace memtrain::cuda {

namespace {

constexpr const char* kOp = "cuda::gemm_lt";
using detail::launch_stream;

bool is_f8(DType t) { return t == DType::f8_e4m3 || t == DType::f8_e5m2; }
bool has_bias(GemmEpilogue e) { return e == GemmEpilogue::bias || e == GemmEpilogue::bias_gelu; }

const char* epilogue_name(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::none: return "none";
    case GemmEpilogue::bias: return "bias";
    case GemmEpilogue::gelu: return "gelu";
    case GemmEpilogue::bias_gelu: return "bias_gelu";
  }
  return "?";
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f8_e4m3: return CUDA_R_8F_E4M3;
    case DType::f8_e5m2: return CUDA_R_8F_E5M2;
    default: break;
  }
  ::memtrain::detail::throw_error(kOp, fmt::format("no cuBLASLt type for {}", dtype_name(t)));
}

cublasLtEpilogue_t lt_epilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::none: return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::gelu: return CUBLASLT_EPILOGUE_GELU;
    case GemmEpilogue::bias_gelu: return CUBLASLT_EPILOGUE_GELU_BIAS;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// The supported (a, b, c) type triples; see the header.
bool supported_types(DType a, DType b, DType c) {
  if (a == DType::f32) return b == DType::f32 && c == DType::f32;
  if (a == DType::bf16) return b == DType::bf16 && (c == DType::bf16 || c == DType::f32);
  if (a == DType::f16) return b == DType::f16 && (c == DType::f16 || c == DType::f32);
  if (a == DType::f8_e4m3) {
    return (b == DType::f8_e4m3 || b == DType::f8_e5m2) && (c == DType::bf16 || c == DType::f32);
  }
  return false;
}

std::int64_t bytes_of(std::int64_t elements, DType t) {
  return elements * static_cast<std::int64_t>(dtype_size(t));
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Every check that needs no device, so argument errors are reported the same with or without one.
// Returns false when there is nothing to do (an empty output or no batches).
bool validate(const GemmLtArgs& g, const void* a, const void* b, const void* c) {
  const DType at = g.a_type, bt = g.b_type, ct = g.c_type;
  MT_CHECK(supported_types(at, bt, ct), kOp,
           "{} x {} -> {} is not supported (f32 x f32 -> f32; bf16 x bf16 -> bf16|f32; f16 x f16 -> f16|f32; "
           "f8_e4m3 x f8_e4m3|f8_e5m2 -> bf16|f32)",
           dtype_name(at), dtype_name(bt), dtype_name(ct));
  MT_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 0, kOp, "negative size m={} n={} k={} batch={}", g.m, g.n,
           g.k, g.batch);
  MT_CHECK(g.k >= 1 || g.m == 0 || g.n == 0 || g.batch == 0, kOp, "k=0 is not supported (m={} n={})", g.m, g.n);
  MT_CHECK(g.batch <= INT32_MAX, kOp, "batch={} is beyond cuBLASLt's 32-bit batch count", g.batch);
  // Stored (row-major) shapes: A is [m, k], or [k, m] when trans_a; B is [k, n], or [n, k] when trans_b.
  const std::int64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  const std::int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
  MT_CHECK(g.lda >= std::max<std::int64_t>(1, a_cols), kOp, "lda={} is less than the {} columns of A ({}x{}{})",
           g.lda, a_cols, a_rows, a_cols, g.trans_a ? ", transposed" : "");
  MT_CHECK(g.ldb >= std::max<std::int64_t>(1, b_cols), kOp, "ldb={} is less than the {} columns of B ({}x{}{})",
           g.ldb, b_cols, b_rows, b_cols, g.trans_b ? ", transposed" : "");
  MT_CHECK(g.ldc >= std::max<std::int64_t>(1, g.n), kOp, "ldc={} is less than the {} columns of C ({}x{})", g.ldc,
           g.n, g.m, g.n);
  if (g.batch > 1) {
    MT_CHECK(g.stride_a >= 0 && g.stride_b >= 0, kOp, "negative batch stride stride_a={} stride_b={}", g.stride_a,
             g.stride_b);
    // Batches of C must not overlap: each is m rows of ldc elements (the last row needs only n).
    const std::int64_t c_span = g.m == 0 ? 0 : (g.m - 1) * g.ldc + g.n;
    MT_CHECK(g.stride_c >= c_span, kOp, "stride_c={} makes the {} batches of C ({}x{}, ldc={}) overlap", g.stride_c,
             g.batch, g.m, g.n, g.ldc);
  }
  MT_CHECK(!has_bias(g.epilogue) || g.bias != nullptr, kOp, "epilogue {} needs a bias, but bias is null",
           epilogue_name(g.epilogue));
  MT_CHECK(has_bias(g.epilogue) || g.bias == nullptr, kOp,
           "bias is set, but epilogue {} adds none (use bias or bias_gelu)", epilogue_name(g.epilogue));
  MT_CHECK(g.c_scale == nullptr && g.amax_d == nullptr, kOp,
           "c_scale and amax_d apply to fp8 outputs, which gemm_lt does not produce (output {})", dtype_name(ct));
  const bool f8 = is_f8(at);
  MT_CHECK(f8 || (g.a_scale == nullptr && g.b_scale == nullptr), kOp,
           "a_scale and b_scale apply to f8 inputs only (inputs are {} x {})", dtype_name(at), dtype_name(bt));
  if (f8) {
    // cuBLASLt's fp8 requirements (cublasLtMatmul, "FP8" in the cuBLAS docs): its "TN" layout, 16-byte
    // aligned pointers and leading dimensions; outputs here are bf16 or f32, and a bias needs bf16.
    MT_CHECK(!g.trans_a && g.trans_b, kOp,
             "f8 inputs need A stored [m, k] and B stored [n, k] (trans_a=false, trans_b=true; cuBLASLt's \"TN\"), "
             "got trans_a={} trans_b={}",
             g.trans_a, g.trans_b);
    MT_CHECK(g.k % 16 == 0 && g.lda % 16 == 0 && g.ldb % 16 == 0, kOp,
             "f8 inputs need k, lda and ldb to be multiples of 16 (k={} lda={} ldb={})", g.k, g.lda, g.ldb);
    MT_CHECK(bytes_of(g.n, ct) % 16 == 0, kOp,
             "f8 inputs need n * sizeof({}) to be a multiple of 16 bytes (n={}; cuBLASLt has no kernel otherwise)",
             dtype_name(ct), g.n);
    MT_CHECK(bytes_of(g.ldc, ct) % 16 == 0, kOp, "f8 inputs need ldc * sizeof({}) to be a multiple of 16 (ldc={})",
             dtype_name(ct), g.ldc);
    MT_CHECK(g.batch <= 1 || (g.stride_a % 16 == 0 && g.stride_b % 16 == 0 && bytes_of(g.stride_c, ct) % 16 == 0),
             kOp, "f8 inputs need batch strides of 16-byte multiples (stride_a={} stride_b={} stride_c={} of {})",
             g.stride_a, g.stride_b, g.stride_c, dtype_name(ct));
    MT_CHECK(!has_bias(g.epilogue) || ct == DType::bf16, kOp,
             "a bias with f8 inputs needs a bf16 output (cuBLASLt), not {}", dtype_name(ct));
  }
  if (g.m == 0 || g.n == 0 || g.batch == 0) return false;
  MT_CHECK(a != nullptr && b != nullptr && c != nullptr, kOp, "null pointer (a={} b={} c={})", a, b,
           static_cast<const void*>(c));
  if (f8) {
    MT_CHECK(aligned16(a) && aligned16(b) && aligned16(c) && (g.bias == nullptr || aligned16(g.bias)), kOp,
             "f8 inputs need 16-byte aligned a, b, c and bias (a={} b={} c={} bias={})", a, b, c, g.bias);
    // cuBLASLt answers CUBLAS_STATUS_NOT_SUPPORTED at the matmul (not at the heuristic) for a scale that
    // is only 4-byte aligned (seen with cuBLASLt 13.1 on an H200).
    MT_CHECK(aligned16(g.a_scale) && aligned16(g.b_scale), kOp,
             "f8 scales must be 16-byte aligned (a_scale={} b_scale={})", static_cast<const void*>(g.a_scale),
             static_cast<const void*>(g.b_scale));
  }
  return true;
}

// ---- per-device state ----

std::size_t workspace_bytes(int device) {
  int major = 0;
  MT_CUDA_CHECK(kOp, cudaDeviceGetAttribute, &major, cudaDevAttrComputeCapabilityMajor, device);
  return major >= 9 ? (std::size_t{32} << 20) : (std::size_t{4} << 20);
}

struct DeviceState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_size = 0;
  int cc = 0;  // compute capability, major * 10 + minor
};

// Created on first use with `device` current. Like cuda_gemm.cpp's handles, never destroyed: at process
// exit cuBLASLt and the runtime may already be torn down, and the driver frees everything.
const DeviceState& state_for(int device) {
  static std::mutex mutex;
  static std::vector<DeviceState> states;
  std::lock_guard lock(mutex);
  if (states.empty()) states.resize(static_cast<std::size_t>(detail::usable_device_count()));
  DeviceState& s = states.at(static_cast<std::size_t>(device));
  if (s.handle != nullptr) return s;
  int major = 0, minor = 0;
  MT_CUDA_CHECK(kOp, cudaDeviceGetAttribute, &major, cudaDevAttrComputeCapabilityMajor, device);
  MT_CUDA_CHECK(kOp, cudaDeviceGetAttribute, &minor, cudaDevAttrComputeCapabilityMinor, device);
  const std::size_t bytes = workspace_bytes(device);
  // The workspace is shared by every gemm_lt on the legacy default stream of this device: safe because
  // they run in order there (other streams get their own per call).
  const Block ws = Allocator::get(Device::cuda(device)).allocate(bytes, MemoryCategory::workspace);
  cublasLtHandle_t created = nullptr;
  try {
    MT_CUBLAS_CHECK(kOp, cublasLtCreate, &created);
  } catch (...) {
    Allocator::get(Device::cuda(device)).deallocate(ws);
    throw;
  }
  s = DeviceState{created, ws.ptr, bytes, major * 10 + minor};
  return s;
}

// ---- descriptors (RAII) ----

// One cuBLASLt object, destroyed with its owner; not copyable.
template <typename Handle, cublasStatus_t (*destroy)(Handle)>
struct LtOwned {
  Handle h = nullptr;
  LtOwned() = default;
  ~LtOwned() {
    if (h != nullptr) destroy(h);
  }
  LtOwned(const LtOwned&) = delete;
  LtOwned& operator=(const LtOwned&) = delete;
};

struct MatmulDesc : LtOwned<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy> {
  MatmulDesc(cublasComputeType_t compute, cudaDataType_t scale) {
    MT_CUBLAS_CHECK(kOp, cublasLtMatmulDescCreate, &h, compute, scale);
  }
  template <typename T>
  void set(cublasLtMatmulDescAttributes_t attr, const T& value) {
    MT_CUBLAS_CHECK(kOp, cublasLtMatmulDescSetAttribute, h, attr, &value, sizeof(T));
  }
};

struct Layout : LtOwned<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy> {
  // A column-major rows x cols matrix with leading dimension ld, `batch` of them `stride` elements apart.
  Layout(cudaDataType_t type, std::int64_t rows, std::int64_t cols, std::int64_t ld, std::int64_t batch,
         std::int64_t stride) {
    MT_CUBLAS_CHECK(kOp, cublasLtMatrixLayoutCreate, &h, type, static_cast<std::uint64_t>(rows),
                    static_cast<std::uint64_t>(cols), ld);
    if (batch > 1) {
      const auto count = static_cast<std::int32_t>(batch);
      MT_CUBLAS_CHECK(kOp, cublasLtMatrixLayoutSetAttribute, h, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                      sizeof(count));
      MT_CUBLAS_CHECK(kOp, cublasLtMatrixLayoutSetAttribute, h, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                      sizeof(stride));
    }
  }
};

struct Preference : LtOwned<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy> {
  Preference() { MT_CUBLAS_CHECK(kOp, cublasLtMatmulPreferenceCreate, &h); }
  template <typename T>
  void set(cublasLtMatmulPreferenceAttributes_t attr, const T& value) {
    MT_CUBLAS_CHECK(kOp, cublasLtMatmulPreferenceSetAttribute, h, attr, &value, sizeof(T));
  }
};

// The largest power of two up to 256 dividing the address of every batch's matrix: the heuristic must
// not pick a kernel that assumes more (its default assumption is 256).
std::uint32_t alignment(const void* p, std::int64_t stride_bytes, std::int64_t batch) {
  std::uintptr_t v = reinterpret_cast<std::uintptr_t>(p);
  if (batch > 1) v |= static_cast<std::uintptr_t>(stride_bytes);
  std::uint32_t align = 256;
  while (align > 1 && v % align != 0) align /= 2;
  return align;
}

// Everything the heuristic's choice depends on.
struct Key {
  int device;
  int a_type, b_type, c_type, compute;
  bool trans_a, trans_b, beta_zero, a_scaled, b_scaled;
  int epilogue;
  std::int64_t m, n, k, lda, ldb, ldc, batch, stride_a, stride_b, stride_c;
  std::uint32_t align_a, align_b, align_c, align_bias;
  auto operator<=>(const Key&) const = default;
};

struct Choice {
  cublasLtMatmulAlgo_t algo;
  std::size_t workspace;
};

}  // namespace

void gemm_lt(const GemmLtArgs& g, const void* a, const void* b, void* c, int device) {
  if (!validate(g, a, b, c)) return;
  detail::require_device(kOp, device);
  detail::DeviceGuard guard(device, kOp);
  const DeviceState& st = state_for(device);
  const bool f8 = is_f8(g.a_type);
  MT_CHECK(!f8 || st.cc >= 89, kOp, "f8 inputs need compute capability 8.9 or newer; cuda:{} has {}.{}", device,
           st.cc / 10, st.cc % 10);

  const cublasComputeType_t compute =
      g.a_type == DType::f32 && g.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  MatmulDesc desc(compute, CUDA_R_32F);
  // Swapped operands (see the top of this file): cuBLASLt's A is our B.
  const cublasOperation_t op_lt_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_lt_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA, op_lt_a);
  desc.set(CUBLASLT_MATMUL_DESC_TRANSB, op_lt_b);
  desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(g.epilogue));
  // The bias has the output's type, cuBLASLt's default (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE unset).
  if (g.bias != nullptr) desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
  if (g.b_scale != nullptr) desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(g.b_scale));
  if (g.a_scale != nullptr) desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(g.a_scale));

  const std::int64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  const std::int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
  const Layout lt_a(cuda_type(g.b_type), b_cols, b_rows, g.ldb, g.batch, g.stride_b);
  const Layout lt_b(cuda_type(g.a_type), a_cols, a_rows, g.lda, g.batch, g.stride_a);
  const Layout lt_c(cuda_type(g.c_type), g.n, g.m, g.ldc, g.batch, g.stride_c);

  const Key key{device,
                static_cast<int>(g.a_type),
                static_cast<int>(g.b_type),
                static_cast<int>(g.c_type),
                static_cast<int>(compute),
                g.trans_a,
                g.trans_b,
                g.beta == 0.f,
                g.a_scale != nullptr,
                g.b_scale != nullptr,
                static_cast<int>(g.epilogue),
                g.m,
                g.n,
                g.k,
                g.lda,
                g.ldb,
                g.ldc,
                g.batch,
                g.batch > 1 ? g.stride_a : 0,
                g.batch > 1 ? g.stride_b : 0,
                g.batch > 1 ? g.stride_c : 0,
                alignment(a, bytes_of(g.stride_a, g.a_type), g.batch),
                alignment(b, bytes_of(g.stride_b, g.b_type), g.batch),
                alignment(c, bytes_of(g.stride_c, g.c_type), g.batch),
                g.bias ? alignment(g.bias, 0, 1) : 0u};

  static std::mutex cache_mutex;
  static std::map<Key, Choice> cache;
  Choice choice{};
  bool found = false;
  {
    std::lock_guard lock(cache_mutex);
    if (auto it = cache.find(key); it != cache.end()) {
      choice = it->second;
      found = true;
    }
  }
  if (!found) {
    Preference pref;
    pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<std::uint64_t>(st.workspace_size));
    // Split-K partial sums only in a workspace of the compute type (f32): never in a 16-bit output, and
    // never the in-place (atomic, order-dependent) scheme, so results are deterministic.
    pref.set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
             static_cast<std::uint32_t>(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE));
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b);  // cuBLASLt's A is our B
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a);
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    MT_CUBLAS_CHECK(kOp, cublasLtMatmulAlgoGetHeuristic, st.handle, desc.h, lt_a.h, lt_b.h, lt_c.h, lt_c.h, pref.h, 1,
                    &result, &returned);
    MT_CHECK(returned > 0 && result.state == CUBLAS_STATUS_SUCCESS, kOp,
             "cublasLtMatmulAlgoGetHeuristic found no algorithm for {} x {} -> {} (trans_a={} trans_b={} m={} n={} "
             "k={} lda={} ldb={} ldc={} batch={} epilogue {})",
             dtype_name(g.a_type), dtype_name(g.b_type), dtype_name(g.c_type), g.trans_a, g.trans_b, g.m, g.n, g.k,
             g.lda, g.ldb, g.ldc, g.batch, epilogue_name(g.epilogue));
    choice = Choice{result.algo, result.workspaceSize};
    std::lock_guard lock(cache_mutex);
    cache.emplace(key, choice);
  }

  // The device's workspace serves the legacy stream, whose matmuls run in order; a matmul on another
  // stream gets its own for the call, so two streams never share one.
  const cudaStream_t stream = launch_stream();
  std::optional<detail::CallScratch> own;
  void* workspace = st.workspace;
  if (stream != nullptr && choice.workspace > 0) {
    own.emplace(device, choice.workspace);
    workspace = own->get();
  }
  MT_CUBLAS_CHECK(kOp, cublasLtMatmul, st.handle, desc.h, &g.alpha, b, lt_a.h, a, lt_b.h, &g.beta, c, lt_c.h, c,
                  lt_c.h, &choice.algo, workspace, choice.workspace, stream);
}

std::vector<float> time_reps_ms(int device, int reps, const std::function<void(int)>& work) {
  constexpr const char* op = "cuda::time_reps_ms";
  MT_CHECK(reps >= 1, op, "reps={} must be at least 1", reps);
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  std::vector<cudaEvent_t> events(static_cast<std::size_t>(reps) + 1, nullptr);
  auto destroy = [&] {
    for (cudaEvent_t e : events) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  };
  std::vector<float> ms(static_cast<std::size_t>(reps));
  try {
    for (cudaEvent_t& e : events) MT_CUDA_CHECK(op, cudaEventCreate, &e);
    MT_CUDA_CHECK(op, cudaEventRecord, events[0], launch_stream());
    for (int i = 0; i < reps; ++i) {
      work(i);
      MT_CUDA_CHECK(op, cudaEventRecord, events[static_cast<std::size_t>(i) + 1], launch_stream());
    }
    MT_CUDA_CHECK(op, cudaEventSynchronize, events.back());
    for (std::size_t i = 0; i < ms.size(); ++i) {
      MT_CUDA_CHECK(op, cudaEventElapsedTime, &ms[i], events[i], events[i + 1]);
    }
  } catch (...) {
    destroy();
    throw;
  }
  destroy();
  return ms;
}

}  // namespace memtrain::cuda

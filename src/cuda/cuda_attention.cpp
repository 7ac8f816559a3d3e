// Attention on CUDA, host side: argument checks, then dispatch on the current stream by dtype and
// device: f32 to the CUDA-core launchers of kernels/attention.cuh, bf16 and f16 to the tensor-core launchers of
// kernels/attention_tc.cuh (bf16 to the CUDA-core ones when set_attention_kernels asks, or below sm_80). The backward's rowsum(dout * out) scratch comes from
// the device allocator (category workspace) and goes back to its cache right after the launches: the
// cache hands it out again only to later work, which the one stream orders after these kernels.
#include "cuda/attention.h"

#include "memtrain/core/allocator.h"
#include "cuda/cuda_common.h"
#include "kernels/attention.cuh"
#include "kernels/attention_tc.cuh"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <utility>

namespace memtrain::cuda {

namespace {

using detail::launch_stream;
constexpr std::int64_t kMaxT = std::int64_t{1} << 30;  // in-head row indices are 32-bit in the kernels
constexpr std::int64_t kMaxGrid = 2147483647;          // gridDim.x

AttentionStrides strides(const HeadLayout& l) { return {l.batch, l.head, l.row}; }

std::atomic<AttentionKernels> g_kernels{AttentionKernels::automatic};

// The tensor-core kernels need compute capability 8.0 (wmma with bf16 inputs).
bool has_tensor_cores(const char* op, int device) {
  int major = 0;
  MT_CUDA_CHECK(op, cudaDeviceGetAttribute, &major, cudaDevAttrComputeCapabilityMajor, device);
  return major >= 8;
}

// Which kernels run; `device` exists (require_device was called).
bool use_tensor_cores(const char* op, DType dtype, std::int64_t D, int device) {
  if (dtype == DType::f16) {
    MT_CHECK(has_tensor_cores(op, device), op,
             "dtype f16 needs a device of compute capability 8.0 or newer (cuda:{} is older); use bf16 or f32",
             device);
    return attention_tc_head_dim_compiled(D);  // other head dims are refused by the entry points
  }
  return dtype == DType::bf16 && attention_tc_head_dim_compiled(D) &&
         g_kernels.load(std::memory_order_relaxed) == AttentionKernels::automatic && has_tensor_cores(op, device);
}

struct Operand {
  const char* name;
  const HeadLayout& layout;
  bool written;
};

// Checks shared by forward and backward; false when there is nothing to do (B * H * T == 0).
bool check_common(const char* op, std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, double scale,
                  DType dtype, std::initializer_list<Operand> operands) {
  MT_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16, op,
           "dtype {} is not supported (f32, bf16, f16)", dtype_name(dtype));
  MT_CHECK(B >= 0 && H >= 0 && T >= 0, op, "negative size B={} H={} T={}", B, H, T);
  MT_CHECK(attention_head_dim_compiled(D), op, "head dim D={} is not supported (32, 64, 128)", D);
  MT_CHECK(std::isfinite(scale), op, "scale {} is not finite", scale);
  MT_CHECK(T <= kMaxT, op, "T={} is larger than 2^30", T);
  for (const Operand& o : operands) {
    const HeadLayout& l = o.layout;
    MT_CHECK(l.batch >= 0 && l.head >= 0 && l.row >= 0, op, "{} has a negative stride (batch={} head={} row={})",
             o.name, l.batch, l.head, l.row);
    // Rows of an output must not overlap, or two threads would write one element.
    MT_CHECK(!o.written || T <= 1 || l.row >= D, op, "{} row stride {} is less than D={}", o.name, l.row, D);
  }
  if (B == 0 || H == 0 || T == 0) return false;
  MT_CHECK(B <= kMaxGrid && H <= kMaxGrid && B * H <= kMaxGrid, op, "B*H = {}*{} heads is too many", B, H);
  return true;
}

// Every operand pointer must be set once there is work.
void check_pointers(const char* op, std::initializer_list<std::pair<const char*, const void*>> pointers) {
  for (const auto& [name, p] : pointers) MT_CHECK(p != nullptr, op, "{} is a null pointer", name);
}

using detail::in;
template <typename T>
T* out_ptr(void* p) {
  return static_cast<T*>(p);
}

using detail::Scratch;

}  // namespace

void attention_forward(void* out, const HeadLayout& lo, float* lse, const void* q, const HeadLayout& lq,
                       const void* k, const HeadLayout& lk, const void* v, const HeadLayout& lv, std::int64_t B,
                       std::int64_t H, std::int64_t T, std::int64_t D, double scale, bool causal, DType dtype,
                       int device) {
  constexpr const char* op = "cuda::attention_forward";
  if (!check_common(op, B, H, T, D, scale, dtype,
                    {{"out", lo, true}, {"q", lq, false}, {"k", lk, false}, {"v", lv, false}})) {
    return;
  }
  check_pointers(op, {{"out", out}, {"lse", lse}, {"q", q}, {"k", k}, {"v", v}});
  const std::int64_t BH = B * H;
  MT_CHECK(std::max(attention_forward_blocks(BH, T, static_cast<int>(D)), attention_tc_blocks(BH, T)) <= kMaxGrid,
           op, "B*H={} heads of T={} need more than 2^31-1 thread blocks", BH, T);
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  const int d = static_cast<int>(D);
  const float s = static_cast<float>(scale);
  if (use_tensor_cores(op, dtype, D, device)) {
    if (dtype == DType::bf16) {
      using bf16 = __nv_bfloat16;
      MT_CUDA_CHECK(op, launch_attention_forward_tc<bf16>, out_ptr<bf16>(out), strides(lo), lse, in<bf16>(q),
                    strides(lq), in<bf16>(k), strides(lk), in<bf16>(v), strides(lv), BH, H, T, d, s, causal,
                    launch_stream());
    } else {
      MT_CUDA_CHECK(op, launch_attention_forward_tc<__half>, out_ptr<__half>(out), strides(lo), lse, in<__half>(q),
                    strides(lq), in<__half>(k), strides(lk), in<__half>(v), strides(lv), BH, H, T, d, s, causal,
                    launch_stream());
    }
  } else if (dtype == DType::f32) {
    MT_CUDA_CHECK(op, launch_attention_forward_f32, out_ptr<float>(out), strides(lo), lse, in<float>(q), strides(lq),
                  in<float>(k), strides(lk), in<float>(v), strides(lv), BH, H, T, d, s, causal, launch_stream());
  } else {
    MT_CUDA_CHECK(op, launch_attention_forward_bf16, out_ptr<__nv_bfloat16>(out), strides(lo), lse,
                  in<__nv_bfloat16>(q), strides(lq), in<__nv_bfloat16>(k), strides(lk), in<__nv_bfloat16>(v),
                  strides(lv), BH, H, T, d, s, causal, launch_stream());
  }
}

void attention_backward(void* dq, const HeadLayout& ldq, void* dk, const HeadLayout& ldk, void* dv,
                        const HeadLayout& ldv, const void* dout, const HeadLayout& ldo, const void* q,
                        const HeadLayout& lq, const void* k, const HeadLayout& lk, const void* v,
                        const HeadLayout& lv, const void* out, const HeadLayout& lo, const float* lse,
                        std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, double scale, bool causal,
                        DType dtype, int device) {
  constexpr const char* op = "cuda::attention_backward";
  if (!check_common(op, B, H, T, D, scale, dtype,
                    {{"dq", ldq, true},
                     {"dk", ldk, true},
                     {"dv", ldv, true},
                     {"dout", ldo, false},
                     {"q", lq, false},
                     {"k", lk, false},
                     {"v", lv, false},
                     {"out", lo, false}})) {
    return;
  }
  check_pointers(op, {{"dq", dq},
                      {"dk", dk},
                      {"dv", dv},
                      {"dout", dout},
                      {"q", q},
                      {"k", k},
                      {"v", v},
                      {"out", out},
                      {"lse", lse}});
  const std::int64_t BH = B * H;
  MT_CHECK(std::max(attention_backward_blocks(BH, T, static_cast<int>(D)), attention_tc_blocks(BH, T)) <= kMaxGrid,
           op, "B*H={} heads of T={} need more than 2^31-1 thread blocks", BH, T);
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  const bool tc = use_tensor_cores(op, dtype, D, device);
  Scratch delta(device, static_cast<std::size_t>(BH * T) * sizeof(float));
  const int d = static_cast<int>(D);
  const float s = static_cast<float>(scale);
  if (tc && dtype == DType::bf16) {
    using bf16 = __nv_bfloat16;
    MT_CUDA_CHECK(op, launch_attention_backward_tc<bf16>, out_ptr<bf16>(dq), strides(ldq), out_ptr<bf16>(dk),
                  strides(ldk), out_ptr<bf16>(dv), strides(ldv), in<bf16>(dout), strides(ldo), in<bf16>(q),
                  strides(lq), in<bf16>(k), strides(lk), in<bf16>(v), strides(lv), in<bf16>(out), strides(lo), lse,
                  delta.as<float>(), BH, H, T, d, s, causal, launch_stream());
  } else if (tc) {
    using f16 = __half;
    MT_CUDA_CHECK(op, launch_attention_backward_tc<f16>, out_ptr<f16>(dq), strides(ldq), out_ptr<f16>(dk),
                  strides(ldk), out_ptr<f16>(dv), strides(ldv), in<f16>(dout), strides(ldo), in<f16>(q), strides(lq),
                  in<f16>(k), strides(lk), in<f16>(v), strides(lv), in<f16>(out), strides(lo), lse, delta.as<float>(), BH,
                  H, T, d, s, causal, launch_stream());
  } else if (dtype == DType::f32) {
    MT_CUDA_CHECK(op, launch_attention_backward_f32, out_ptr<float>(dq), strides(ldq), out_ptr<float>(dk),
                  strides(ldk), out_ptr<float>(dv), strides(ldv), in<float>(dout), strides(ldo), in<float>(q),
                  strides(lq), in<float>(k), strides(lk), in<float>(v), strides(lv), in<float>(out), strides(lo), lse,
                  delta.as<float>(), BH, H, T, d, s, causal, launch_stream());
  } else {
    using bf16 = __nv_bfloat16;
    MT_CUDA_CHECK(op, launch_attention_backward_bf16, out_ptr<bf16>(dq), strides(ldq), out_ptr<bf16>(dk),
                  strides(ldk), out_ptr<bf16>(dv), strides(ldv), in<bf16>(dout), strides(ldo), in<bf16>(q),
                  strides(lq), in<bf16>(k), strides(lk), in<bf16>(v), strides(lv), in<bf16>(out), strides(lo), lse,
                  delta.as<float>(), BH, H, T, d, s, causal, launch_stream());
  }
}

void set_attention_kernels(AttentionKernels kernels) { g_kernels.store(kernels, std::memory_order_relaxed); }

AttentionKernels attention_kernels() { return g_kernels.load(std::memory_order_relaxed); }

bool attention_uses_tensor_cores(DType dtype, std::int64_t D, int device) {
  constexpr const char* op = "cuda::attention_uses_tensor_cores";
  detail::require_device(op, device);
  return use_tensor_cores(op, dtype, D, device);
}

}  // namespace memtrain::cuda

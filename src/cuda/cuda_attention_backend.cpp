// The CUDA backend's attention entries (src/core/backend.h) over the flash-attention kernels of
// cuda/attention.h: f32, bf16 or f16, D in {32, 64, 128}, unit stride along D; lse in f32.
#include "cuda/cuda_backend_entries.h"

#include "core/operand_checks.h"
#include "cuda/attention.h"

#include <cmath>
#include <cstdint>

namespace memtrain::cuda {

namespace {

HeadLayout layout_of(const Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

// What the kernels read: an f32/bf16/f16 [B, H, T, D] operand with unit stride along D (any other
// non-negative strides).
void check_head(const char* op, const char* what, const Tensor& t) {
  MT_CHECK(::memtrain::detail::is_cuda_kernel_dtype(t.dtype()), op,
           "{} of dtype {} on {} is not supported yet: the CUDA kernels take f32, bf16 or f16 ({} {})", what,
           dtype_name(t.dtype()), t.device().str(), what, shape_str(t.shape()));
  MT_CHECK(t.stride(3) == 1 || t.size(3) == 1, op,
           "{} {} with strides {} on {} is not supported yet: the CUDA kernels need unit stride along D", what,
           shape_str(t.shape()), shape_str(t.strides()), t.device().str());
  for (std::int64_t d = 0; d < 3; ++d) {
    MT_CHECK(t.stride(d) >= 0, op, "{} {} with strides {} on {} is not supported yet: negative stride", what,
             shape_str(t.shape()), shape_str(t.strides()), t.device().str());
  }
}

}  // namespace

DType CudaBackend::attention_stats_dtype(DType) const { return DType::f32; }

// The fused gradient buffer only when q, k and v are distinct views of one storage (the split(qkv) case);
// otherwise each gets a contiguous gradient of its own, which a leaf can take over and the engine can add.
bool CudaBackend::attention_fused_grads(const Tensor& q, const Tensor& k, const Tensor& v) const {
  const bool distinct_views = q.offset() != k.offset() && q.offset() != v.offset() && k.offset() != v.offset();
  return q.shares_storage_with(k) && q.shares_storage_with(v) && distinct_views;
}

void CudaBackend::attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                                    const Tensor& v, bool causal) const {
  const char* op = "scaled_dot_product_attention";
  const std::int64_t B = q.size(0), H = q.size(1), T_len = q.size(2), D = q.size(3);
  MT_CHECK(D == 32 || D == 64 || D == 128, op,
           "head dim D={} on {} is not supported yet: the CUDA kernels take D in {{32, 64, 128}} (q {})", D,
           q.device().str(), shape_str(q.shape()));
  check_head(op, "q", q);
  check_head(op, "k", k);
  check_head(op, "v", v);
  cuda::attention_forward(out.data_ptr(), layout_of(out), lse.data<float>(), q.data_ptr(), layout_of(q), k.data_ptr(),
                          layout_of(k), v.data_ptr(), layout_of(v), B, H, T_len, D,
                          1.0 / std::sqrt(static_cast<double>(D)), causal, q.dtype(), q.device().index);
}

void CudaBackend::attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                                     const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                     const Tensor& lse, bool causal) const {
  const char* op = "scaled_dot_product_attention_backward";
  MT_CHECK(dout.dtype() == q.dtype() && dout.shape() == q.shape(), op,
           "output gradient {} {} does not match q {} {} on {}", dtype_name(dout.dtype()), shape_str(dout.shape()),
           dtype_name(q.dtype()), shape_str(q.shape()), q.device().str());
  check_head(op, "output gradient", dout);
  const std::int64_t B = q.size(0), H = q.size(1), T_len = q.size(2), D = q.size(3);
  cuda::attention_backward(dq.data_ptr(), layout_of(dq), dk.data_ptr(), layout_of(dk), dv.data_ptr(), layout_of(dv),
                           dout.data_ptr(), layout_of(dout), q.data_ptr(), layout_of(q), k.data_ptr(), layout_of(k),
                           v.data_ptr(), layout_of(v), out.data_ptr(), layout_of(out), lse.data<float>(), B, H, T_len,
                           D, 1.0 / std::sqrt(static_cast<double>(D)), causal, q.dtype(), q.device().index);
}

}  // namespace memtrain::cuda

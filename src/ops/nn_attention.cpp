// scaled_dot_product_attention: flash attention on the CPU (see cpu/attention.h). The forward saves q, k, v
// (references to tensors that exist anyway), its output, and the per-row log-sum-exp [B, H, T]: O(T)
// extra bytes per head, never the T x T scores. Score tiles live in a workspace buffer freed on return.
//
// Layouts, so a GPT block moves no activation bytes around attention: q, k, v are read through their
// strides (the head views of a fused QKV projection need no copy). The output is stored [B, T, H, D] and
// returned as its [B, H, T, D] transpose, so the caller's transpose(1, 2).reshape({B, T, C}) is a view.
// The gradients dq, dk, dv are written into one [B, T, 3, H, D] buffer and returned as [B, H, T, D] views
// of it: when q, k, v came from split(qkv), their gradients flow back through views into exactly the
// [B, T, 3C] gradient of qkv, which split's backward then takes over without a copy.
//
// On a CUDA device the flash-attention kernels of memtrain/cuda/attention.h run with the same layouts (f32 or
// bf16, D in {32, 64, 128}, unit stride along D; lse in f32). There the fused gradient buffer is used only
// when q, k and v are distinct views of one storage (the split(qkv) case); otherwise each gets a contiguous
// gradient of its own, which a leaf can take over and the engine can add (no strided copies exist on the
// device yet).
#include "amp/autocast_state.h"
#include "cpu/attention.h"
#include "memtrain/ckpt/checkpoint.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/cuda/attention.h"
#include "memtrain/ops/nn.h"
#include "ops/nn_common.h"

#include <cmath>

namespace memtrain::ops {

using autograd::SavedTensor;

namespace {

struct AttentionGrads {
  Tensor dq, dk, dv;
};

// t detached in its compute dtype, copied only when its last dim is not unit-stride.
Tensor head_input(const Tensor& t) {
  Tensor c = detail::to_compute(t.detach());
  return c.stride(3) == 1 || c.size(3) == 1 ? c : c.contiguous();
}

cpu::HeadLayout layout_of(const Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

cuda::HeadLayout cuda_layout_of(const Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

// What the CUDA kernels read: an f32/bf16/f16 [B, H, T, D] operand with unit stride along D (any other
// non-negative strides).
void check_cuda_head(const char* op, const char* what, const Tensor& t) {
  MT_CHECK(detail::is_cuda_kernel_dtype(t.dtype()), op,
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

AttentionGrads attention_backward_cuda(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Tensor& out, const Tensor& lse, bool causal) {
  const char* op = "scaled_dot_product_attention_backward";
  detail::check_same_device(op, "q", q, "output gradient", dout);
  MT_CHECK(dout.dtype() == q.dtype() && dout.shape() == q.shape(), op,
           "output gradient {} {} does not match q {} {} on {}", dtype_name(dout.dtype()), shape_str(dout.shape()),
           dtype_name(q.dtype()), shape_str(q.shape()), q.device().str());
  check_cuda_head(op, "output gradient", dout);
  const std::int64_t B = q.size(0), H = q.size(1), T_len = q.size(2), D = q.size(3);
  const Device dev = q.device();
  Tensor dq, dk, dv;
  const bool distinct_views = q.offset() != k.offset() && q.offset() != v.offset() && k.offset() != v.offset();
  if (q.shares_storage_with(k) && q.shares_storage_with(v) && distinct_views) {
    // One [B, T, 3, H, D] buffer; the three gradients are its [B, H, T, D] slices (see the top).
    const Tensor grads = Tensor::empty({B, T_len, 3, H, D}, q.dtype(), dev);
    dq = grads.select(2, 0).transpose(1, 2);
    dk = grads.select(2, 1).transpose(1, 2);
    dv = grads.select(2, 2).transpose(1, 2);
  } else {
    dq = Tensor::empty(q.shape(), q.dtype(), dev);
    dk = Tensor::empty(q.shape(), q.dtype(), dev);
    dv = Tensor::empty(q.shape(), q.dtype(), dev);
  }
  cuda::attention_backward(dq.data_ptr(), cuda_layout_of(dq), dk.data_ptr(), cuda_layout_of(dk), dv.data_ptr(),
                           cuda_layout_of(dv), dout.data_ptr(), cuda_layout_of(dout), q.data_ptr(), cuda_layout_of(q),
                           k.data_ptr(), cuda_layout_of(k), v.data_ptr(), cuda_layout_of(v), out.data_ptr(),
                           cuda_layout_of(out), lse.data<float>(), B, H, T_len, D,
                           1.0 / std::sqrt(static_cast<double>(D)), causal, q.dtype(), dev.index);
  return {dq, dk, dv};
}

AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, bool causal) {
  if (q.device().is_cuda()) return attention_backward_cuda(dout, q, k, v, out, lse, causal);
  const Tensor g = head_input(dout), qc = head_input(q), kc = head_input(k), vc = head_input(v),
               oc = head_input(out);
  const std::int64_t B = q.size(0), H = q.size(1), T_len = q.size(2), D = q.size(3);
  // One [B, T, 3, H, D] buffer; the three gradients are its [B, H, T, D] slices.
  const Tensor grads = Tensor::empty({B, T_len, 3, H, D}, qc.dtype());
  const Tensor dq = grads.select(2, 0).transpose(1, 2), dk = grads.select(2, 1).transpose(1, 2),
               dv = grads.select(2, 2).transpose(1, 2);
  const int nthreads = detail::max_threads();
  const Tensor ws = detail::workspace(cpu::attention_backward_workspace(T_len, D, nthreads), qc.dtype());
  detail::dispatch_compute("scaled_dot_product_attention_backward", qc.dtype(), [&](auto zero) {
    using T = decltype(zero);
    cpu::attention_backward<T>(dq.data<T>(), layout_of(dq), dk.data<T>(), layout_of(dk), dv.data<T>(), layout_of(dv),
                               g.data<T>(), layout_of(g), qc.data<T>(), layout_of(qc), kc.data<T>(), layout_of(kc),
                               vc.data<T>(), layout_of(vc), oc.data<T>(), layout_of(oc), lse.data<T>(), B, H, T_len, D,
                               1.0 / std::sqrt(static_cast<double>(D)), causal, ws.data<T>(), nthreads);
  });
  return {detail::as_dtype(dq, q.dtype()), detail::as_dtype(dk, k.dtype()), detail::as_dtype(dv, v.dtype())};
}

void record_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                      const Tensor& lse, bool causal) {
  if (!autograd::needs_grad({&q, &k, &v})) return;
  SavedTensor sq(q), sk(k), sv(v), sout(out), slse(lse);
  autograd::record(op, {q, k, v}, {out}, [sq, sk, sv, sout, slse, causal](const std::vector<Tensor>& g) {
    AttentionGrads r = attention_backward(g[0], sq.unpack(), sk.unpack(), sv.unpack(), sout.unpack(),
                                          slse.unpack(), causal);
    return std::vector<Tensor>{r.dq, r.dk, r.dv};
  });
}

// The forward on each device: {out [B, H, T, D] (stored [B, T, H, D], see the top of this file), lse [B, H, T]}.
std::vector<Tensor> attention_forward_cuda(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                           bool causal) {
  const std::int64_t B = q.size(0), H = q.size(1), T_len = q.size(2), D = q.size(3);
  MT_CHECK(D == 32 || D == 64 || D == 128, op,
           "head dim D={} on {} is not supported yet: the CUDA kernels take D in {{32, 64, 128}} (q {})", D,
           q.device().str(), shape_str(q.shape()));
  check_cuda_head(op, "q", q);
  check_cuda_head(op, "k", k);
  check_cuda_head(op, "v", v);
  const Device dev = q.device();
  Tensor out = Tensor::empty({B, T_len, H, D}, q.dtype(), dev).transpose(1, 2);
  Tensor lse = Tensor::empty({B, H, T_len}, DType::f32, dev);
  cuda::attention_forward(out.data_ptr(), cuda_layout_of(out), lse.data<float>(), q.data_ptr(), cuda_layout_of(q),
                          k.data_ptr(), cuda_layout_of(k), v.data_ptr(), cuda_layout_of(v), B, H, T_len, D,
                          1.0 / std::sqrt(static_cast<double>(D)), causal, q.dtype(), dev.index);
  return {out, lse};
}

// The CPU kernel on f32/f64 operands: y [B, H, T, D] (any layout_of strides) and lse [B, H, T] written.
void attention_forward_kernel(const char* op, Tensor& y, Tensor& lse, const Tensor& qc, const Tensor& kc,
                              const Tensor& vc, bool causal) {
  const std::int64_t B = qc.size(0), H = qc.size(1), T_len = qc.size(2), D = qc.size(3);
  const int nthreads = detail::max_threads();
  const Tensor ws = detail::workspace(cpu::attention_forward_workspace(T_len, D, nthreads), qc.dtype());
  detail::dispatch_compute(op, qc.dtype(), [&](auto zero) {
    using T = decltype(zero);
    cpu::attention_forward<T>(y.data<T>(), layout_of(y), lse.data<T>(), qc.data<T>(), layout_of(qc), kc.data<T>(),
                              layout_of(kc), vc.data<T>(), layout_of(vc), B, H, T_len, D,
                              1.0 / std::sqrt(static_cast<double>(D)), causal, ws.data<T>(), nthreads);
  });
}

std::vector<Tensor> attention_forward_cpu(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                          bool causal) {
  detail::check_cpu(op, q);
  const std::int64_t B = q.size(0), H = q.size(1), T_len = q.size(2), D = q.size(3);
  if (q.dtype() == DType::bf16 || q.dtype() == DType::f16) {
    // Narrow q, k, v: widened one batch element at a time, so the f32 copies of q, k, v and of the output are
    // 1/B of their full size (mixed precision halves activations; full f32 copies would give that back at the
    // forward's peak). The kernel sees the same rows either way: the same bits as widening everything.
    const Tensor y_bthd = Tensor::empty({B, T_len, H, D}, q.dtype());
    const Tensor lse = Tensor::empty({B, H, T_len}, DType::f32);
    const Tensor yb_bthd = Tensor::empty({1, T_len, H, D}, DType::f32);
    Tensor yb = yb_bthd.transpose(1, 2);
    for (std::int64_t b = 0; b < B; ++b) {
      Tensor lse_b = lse.narrow(0, b, 1);
      attention_forward_kernel(op, yb, lse_b, head_input(q.narrow(0, b, 1)), head_input(k.narrow(0, b, 1)),
                               head_input(v.narrow(0, b, 1)), causal);
      y_bthd.narrow(0, b, 1).copy_(yb_bthd);
    }
    return {y_bthd.transpose(1, 2), lse};
  }
  const Tensor qc = head_input(q), kc = head_input(k), vc = head_input(v);
  Tensor y = Tensor::empty({B, T_len, H, D}, qc.dtype()).transpose(1, 2);
  Tensor lse = Tensor::empty({B, H, T_len}, qc.dtype());
  attention_forward_kernel(op, y, lse, qc, kc, vc, causal);
  return {y, lse};
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  const char* op = "scaled_dot_product_attention";
  if (auto c = amp::detail::autocast_to_compute({q, k, v})) return scaled_dot_product_attention((*c)[0], (*c)[1], (*c)[2], causal);
  detail::check_floating(op, q);
  detail::check_same(op, q, k);
  detail::check_same(op, q, v);
  MT_CHECK(q.dim() == 4 && k.shape() == q.shape() && v.shape() == q.shape(), op,
           "q, k, v must all be [B, H, T, D] of one shape, got {}, {}, {}", shape_str(q.shape()),
           shape_str(k.shape()), shape_str(v.shape()));
  MT_CHECK(q.size(3) > 0, op, "head dim must be positive, got q {}", shape_str(q.shape()));
  // Q K^T and P V, 2 * T * T * D FLOPs each per head; causal masking skips about half.
  const double T_len = static_cast<double>(q.size(2));
  const double flops = 4.0 * static_cast<double>(q.size(0) * q.size(1)) * T_len * T_len *
                       static_cast<double>(q.size(3)) * (causal ? 0.5 : 1.0);
  const std::vector<Tensor> r = ckpt::detail::compute_or_replay(op, flops, [&] {
    return q.device().is_cuda() ? attention_forward_cuda(op, q, k, v, causal) : attention_forward_cpu(op, q, k, v, causal);
  });
  record_attention(op, q, k, v, r[0], r[1], causal);
  return r[0];
}

}  // namespace memtrain::ops

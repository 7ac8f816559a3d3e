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
// Kernels: the device's backend (src/core/backend.h; src/cpu/attention.cpp, src/cuda/cuda_attention_backend.cpp),
// which also says whether it wants the fused gradient buffer (CUDA: only when q, k and v are distinct views of
// one storage, the split(qkv) case; otherwise three contiguous gradients, which a leaf can take over).
#include "core/backend.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/ops/dispatch_modes.h"
#include "memtrain/ops/nn.h"
#include "ops/nn_common.h"


namespace memtrain::ops {

using autograd::SavedTensor;

namespace {

struct AttentionGrads {
  Tensor dq, dk, dv;
};

AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, bool causal) {
  detail::check_same_device("scaled_dot_product_attention_backward", "q", q, "output gradient", dout);
  const auto& backend = ::memtrain::detail::backend_for(q.device());
  const std::int64_t B = q.size(0), H = q.size(1), T_len = q.size(2), D = q.size(3);
  const Device dev = q.device();
  AttentionGrads r;
  if (backend.attention_fused_grads(q, k, v)) {
    // One [B, T, 3, H, D] buffer; the three gradients are its [B, H, T, D] slices (see the top).
    const Tensor grads = Tensor::empty({B, T_len, 3, H, D}, q.dtype(), dev);
    r = {grads.select(2, 0).transpose(1, 2), grads.select(2, 1).transpose(1, 2), grads.select(2, 2).transpose(1, 2)};
  } else {
    r = {Tensor::empty(q.shape(), q.dtype(), dev), Tensor::empty(q.shape(), q.dtype(), dev),
         Tensor::empty(q.shape(), q.dtype(), dev)};
  }
  backend.attention_backward(r.dq, r.dk, r.dv, dout, q, k, v, out, lse, causal);
  return r;
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

// {out [B, H, T, D] (stored [B, T, H, D], see the top of this file), lse [B, H, T]}.
std::vector<Tensor> attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  const auto& backend = ::memtrain::detail::backend_for(q.device());
  const std::int64_t B = q.size(0), H = q.size(1), T_len = q.size(2), D = q.size(3);
  const Tensor out = Tensor::empty({B, T_len, H, D}, q.dtype(), q.device()).transpose(1, 2);
  const Tensor lse = Tensor::empty({B, H, T_len}, backend.attention_stats_dtype(q.dtype()), q.device());
  backend.attention_forward(out, lse, q, k, v, causal);
  return {out, lse};
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  const char* op = "scaled_dot_product_attention";
  if (auto c = detail::cast_mode_to_compute(q, k, v)) return scaled_dot_product_attention((*c)[0], (*c)[1], (*c)[2], causal);
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
  const std::vector<Tensor> r = detail::compute_or_replay(op, flops, [&] {
    return attention_forward(q, k, v, causal);
  });
  record_attention(op, q, k, v, r[0], r[1], causal);
  return r[0];
}

}  // namespace memtrain::ops

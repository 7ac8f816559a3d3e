// scaled_dot_product_attention: flash attention on the CPU (see cpu/attention.h). The forward saves q, k, v
// (references to tensors that exist anyway), its output, and the per-row log-sum-exp [B, H, T]: O(T)
// extra bytes per head, never the T x T scores. Score tiles live in a workspace buffer freed on return.
#include "cpu/attention.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/ops/nn.h"
#include "ops/nn_common.h"

#include <cmath>

namespace memtrain::ops {

using autograd::SavedTensor;

namespace {

struct AttentionGrads {
  Tensor dq, dk, dv;
};

AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, bool causal) {
  const Tensor g = detail::compute_input(dout), qc = detail::compute_input(q), kc = detail::compute_input(k),
               vc = detail::compute_input(v), oc = detail::compute_input(out);
  const std::int64_t B = q.size(0), H = q.size(1), T_len = q.size(2), D = q.size(3);
  Tensor dq = Tensor::empty(qc.shape(), qc.dtype()), dk = Tensor::empty(qc.shape(), qc.dtype()),
         dv = Tensor::empty(qc.shape(), qc.dtype());
  const int nthreads = detail::max_threads();
  const Tensor ws = detail::workspace(cpu::attention_backward_workspace(T_len, D, nthreads), qc.dtype());
  detail::dispatch_compute("scaled_dot_product_attention_backward", qc.dtype(), [&](auto zero) {
    using T = decltype(zero);
    cpu::attention_backward<T>(dq.data<T>(), dk.data<T>(), dv.data<T>(), g.data<T>(), qc.data<T>(), kc.data<T>(),
                               vc.data<T>(), oc.data<T>(), lse.data<T>(), B * H, T_len, D,
                               1.0 / std::sqrt(static_cast<double>(D)), causal, ws.data<T>(), nthreads);
  });
  return {detail::as_dtype(dq, q.dtype()), detail::as_dtype(dk, k.dtype()), detail::as_dtype(dv, v.dtype())};
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  const char* op = "scaled_dot_product_attention";
  detail::check_floating(op, q);
  detail::check_same(op, q, k);
  detail::check_same(op, q, v);
  detail::check_cpu(op, q);
  MT_CHECK(q.dim() == 4 && k.shape() == q.shape() && v.shape() == q.shape(), op,
           "q, k, v must all be [B, H, T, D] of one shape, got {}, {}, {}", shape_str(q.shape()),
           shape_str(k.shape()), shape_str(v.shape()));
  MT_CHECK(q.size(3) > 0, op, "head dim must be positive, got q {}", shape_str(q.shape()));
  const std::int64_t B = q.size(0), H = q.size(1), T_len = q.size(2), D = q.size(3);
  const Tensor qc = detail::compute_input(q), kc = detail::compute_input(k), vc = detail::compute_input(v);
  Tensor y = Tensor::empty(q.shape(), qc.dtype());
  Tensor lse = Tensor::empty({B, H, T_len}, qc.dtype());
  {
    const int nthreads = detail::max_threads();
    const Tensor ws = detail::workspace(cpu::attention_forward_workspace(T_len, D, nthreads), qc.dtype());
    detail::dispatch_compute(op, qc.dtype(), [&](auto zero) {
      using T = decltype(zero);
      cpu::attention_forward<T>(y.data<T>(), lse.data<T>(), qc.data<T>(), kc.data<T>(), vc.data<T>(), B * H, T_len, D,
                                1.0 / std::sqrt(static_cast<double>(D)), causal, ws.data<T>(), nthreads);
    });
  }
  Tensor out = detail::as_dtype(y, q.dtype());
  if (autograd::needs_grad({&q, &k, &v})) {
    SavedTensor sq(q), sk(k), sv(v), sout(out), slse(lse);
    autograd::record(op, {q, k, v}, {out}, [sq, sk, sv, sout, slse, causal](const std::vector<Tensor>& g) {
      AttentionGrads r = attention_backward(g[0], sq.unpack(), sk.unpack(), sv.unpack(), sout.unpack(),
                                            slse.unpack(), causal);
      return std::vector<Tensor>{r.dq, r.dk, r.dv};
    });
  }
  return out;
}

}  // namespace memtrain::ops

// cross_entropy: fused log-softmax + negative log-likelihood. The forward saves the logits, the targets
// and one log-sum-exp per row ([N], not the [N, V] probabilities); the backward op rebuilds the softmax
// row by row. mean divides by the number of non-ignored targets (NaN when every target is ignored, as in
// PyTorch); per-row losses are summed in double.
// On a CUDA device the kernels of memtrain/cuda/nn.h compute the f32 per-row losses and lse; the targets
// (and, for mean/sum, the [N] losses) are copied to the host, where they are range-checked, counted and
// summed in double exactly like the CPU path, and the scalar goes back to the device.
#include "amp/autocast_state.h"
#include "cpu/cross_entropy.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/cuda/nn.h"
#include "memtrain/ops/nn.h"
#include "ops/nn_common.h"

#include <limits>

namespace memtrain::ops {

using autograd::SavedTensor;

namespace {

// dlogits on the device: the loss gradient becomes the f32 dloss vector (stride 1) or scale (stride 0) the
// kernel reads; for mean/sum the scale is formed on the host in f32, as the CPU path does.
Tensor cross_entropy_backward_cuda(const Tensor& g, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                   Reduction reduction, std::int64_t ignore_index, std::int64_t count) {
  const char* op = "cross_entropy_backward";
  detail::check_same_device(op, "logits", logits, "loss gradient", g);
  const Device dev = logits.device();
  const std::int64_t N = logits.size(0), V = logits.size(1);
  Tensor dloss;  // f32 on dev
  std::int64_t stride = 0;
  if (reduction == Reduction::none) {
    MT_CHECK(g.dim() == 1 && g.size(0) == N, op, "loss gradient {} does not match {} rows", shape_str(g.shape()), N);
    if (g.dtype() == DType::f32) {
      dloss = g;  // any stride: the kernel reads dloss[n * stride]
      stride = N > 1 ? g.stride(0) : 0;
    } else if (N > 0 && g.stride(0) == 0) {  // an expanded scalar, e.g. from sum()'s backward
      dloss = full({1}, static_cast<double>(static_cast<float>(g.detach().select(0, 0).item())), DType::f32, dev);
    } else {
      MT_CHECK(g.is_contiguous(), op, "a non-contiguous {} loss gradient {} with strides {} on {} is not supported yet",
               dtype_name(g.dtype()), shape_str(g.shape()), shape_str(g.strides()), dev.str());
      dloss = detail::convert_via_host(g, DType::f32);
      stride = 1;
    }
  } else {
    MT_CHECK(g.numel() == 1, op, "loss gradient {} is not a scalar", shape_str(g.shape()));
    auto scale = static_cast<float>(g.item());
    if (reduction == Reduction::mean) scale /= static_cast<float>(count);
    dloss = full({1}, static_cast<double>(scale), DType::f32, dev);
  }
  Tensor dx = Tensor::empty(logits.shape(), logits.dtype(), dev);
  cuda::cross_entropy_backward(dx.data_ptr(), dloss.data<float>(), stride, logits.data_ptr(), lse.data<float>(),
                               logits.dtype(), targets.data_ptr(), targets.dtype(), N, V, ignore_index, dev.index);
  return dx;
}

// dlogits from the loss gradient g (scalar for mean/sum, [N] for none).
Tensor cross_entropy_backward(const Tensor& g, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              Reduction reduction, std::int64_t ignore_index, std::int64_t count) {
  if (logits.device().is_cuda()) {
    return cross_entropy_backward_cuda(g, logits, targets, lse, reduction, ignore_index, count);
  }
  const Tensor x = detail::compute_input(logits), gc = detail::compute_input(g);
  const std::int64_t N = x.size(0), V = x.size(1);
  Tensor dx = Tensor::empty(x.shape(), x.dtype());
  detail::dispatch_compute("cross_entropy_backward", x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T scale = reduction == Reduction::none ? T(0) : gc.data<T>()[0];
    if (reduction == Reduction::mean) scale /= static_cast<T>(count);
    const T* dloss = reduction == Reduction::none ? gc.data<T>() : &scale;
    const std::int64_t stride = reduction == Reduction::none ? 1 : 0;
    detail::dispatch_index(targets.dtype(), [&](auto izero) {
      using I = decltype(izero);
      cpu::cross_entropy_backward<T, I>(dx.data<T>(), dloss, stride, x.data<T>(), lse.data<T>(), targets.data<I>(),
                                        N, V, ignore_index);
    });
  });
  return detail::as_dtype(dx, logits.dtype());
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, Reduction reduction, std::int64_t ignore_index) {
  const char* op = "cross_entropy";
  if (auto c = amp::detail::autocast_to_f32({logits})) return cross_entropy((*c)[0], targets, reduction, ignore_index);
  detail::check_floating(op, logits);
  detail::check_index(op, "targets", targets);
  detail::check_same_device(op, "logits", logits, "targets", targets);
  MT_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0), op,
           "expects logits [N, V] and targets [N], got {} and {}", shape_str(logits.shape()),
           shape_str(targets.shape()));
  MT_CHECK(logits.size(1) > 0, op, "logits {} have no classes", shape_str(logits.shape()));
  const std::int64_t N = logits.size(0), V = logits.size(1);
  const bool on_cuda = logits.device().is_cuda();
  if (on_cuda) detail::check_cuda_data(op, "logits", logits);
  else detail::check_cpu(op, logits);
  // The targets the kernel reads (on the logits' device) and a host copy to check and count them.
  const Tensor t = on_cuda || targets.is_contiguous() ? targets.detach() : targets.detach().contiguous();
  const Tensor t_host = on_cuda ? detail::index_to_host(op, "targets", t) : t;  // checks t is contiguous
  std::int64_t count = 0;
  detail::dispatch_index(t_host.dtype(), [&](auto izero) {
    using I = decltype(izero);
    const I* tp = t_host.data<I>();
    detail::check_index_range(op, "target", tp, N, V, true, ignore_index, targets.shape());
    for (std::int64_t i = 0; i < N; ++i) count += static_cast<std::int64_t>(tp[i]) != ignore_index;
  });
  Tensor losses, lse;  // [N] each, in the compute dtype (CPU) or f32 (CUDA)
  if (on_cuda) {
    losses = Tensor::empty({N}, DType::f32, logits.device());
    lse = Tensor::empty({N}, DType::f32, logits.device());
    cuda::cross_entropy_forward(losses.data<float>(), lse.data<float>(), logits.data_ptr(), logits.dtype(),
                                t.data_ptr(), t.dtype(), N, V, ignore_index, logits.device().index);
  } else {
    const Tensor x = detail::compute_input(logits);
    losses = Tensor::empty({N}, x.dtype());
    lse = Tensor::empty({N}, x.dtype());
    detail::dispatch_index(t.dtype(), [&](auto izero) {
      using I = decltype(izero);
      detail::dispatch_compute(op, x.dtype(), [&](auto zero) {
        using T = decltype(zero);
        cpu::cross_entropy_forward<T, I>(losses.data<T>(), lse.data<T>(), x.data<T>(), t.data<I>(), N, V,
                                         ignore_index);
      });
    });
  }
  Tensor out;
  if (reduction == Reduction::none) {
    out = on_cuda ? detail::convert_via_host(losses, logits.dtype()) : detail::as_dtype(losses, logits.dtype());
  } else {
    // Summed in double on the host, in row order (a copy of [N] floats from the device).
    const Tensor host = on_cuda ? losses.to(Device::cpu()) : losses;
    double total = 0;
    detail::dispatch_compute(op, host.dtype(), [&](auto zero) {
      using T = decltype(zero);
      for (std::int64_t i = 0; i < N; ++i) total += static_cast<double>(host.data<T>()[i]);
    });
    const double v = reduction == Reduction::sum ? total
                     : count > 0                 ? total / static_cast<double>(count)
                                                 : std::numeric_limits<double>::quiet_NaN();
    out = full({}, v, logits.dtype(), logits.device());
  }
  if (autograd::needs_grad({&logits})) {
    SavedTensor sx(logits), st(t), slse(lse);
    autograd::record(op, {logits}, {out},
                     [sx, st, slse, reduction, ignore_index, count](const std::vector<Tensor>& g) {
                       return std::vector<Tensor>{cross_entropy_backward(g[0], sx.unpack(), st.unpack(), slse.unpack(),
                                                                         reduction, ignore_index, count)};
                     });
  }
  return out;
}

}  // namespace memtrain::ops

// embedding: gathers rows of weight [V, C] by integer indices. Saves only the indices; the backward op
// scatters the output gradient into a zero [V, C] gradient. On a CUDA device the kernels of
// memtrain/cuda/nn.h gather and scatter (f32, bf16 or f16 weight, contiguous); the indices, on the same device,
// are copied to the host once to be range-checked like the CPU path's.
#include "amp/autocast_state.h"
#include "cpu/embedding.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/cuda/nn.h"
#include "memtrain/ops/nn.h"
#include "ops/nn_common.h"

namespace memtrain::ops {

namespace {

Tensor embedding_backward(const Tensor& dout, const Tensor& indices, const Shape& weight_shape, DType weight_dtype) {
  if (indices.device().is_cuda()) {
    const char* op = "embedding_backward";
    detail::check_same_device(op, "indices", indices, "output gradient", dout);
    MT_CHECK(dout.dtype() == weight_dtype, op, "output gradient {} {} on {} is not supported yet: expected {}",
             dtype_name(dout.dtype()), shape_str(dout.shape()), dout.device().str(), dtype_name(weight_dtype));
    detail::check_cuda_data(op, "output gradient", dout);
    Tensor dw = zeros(weight_shape, weight_dtype, dout.device());  // the kernel accumulates into it
    cuda::embedding_backward(dw.data_ptr(), dout.data_ptr(), indices.data_ptr(), weight_dtype, indices.dtype(),
                             indices.numel(), weight_shape[0], weight_shape[1], dout.device().index);
    return dw;
  }
  const Tensor g = detail::compute_input(dout);
  const Tensor idx = indices.is_contiguous() ? indices : indices.contiguous();
  Tensor dw = zeros(weight_shape, g.dtype());
  detail::dispatch_compute("embedding_backward", g.dtype(), [&](auto zero) {
    using T = decltype(zero);
    detail::dispatch_index(idx.dtype(), [&](auto izero) {
      using I = decltype(izero);
      cpu::embedding_backward<T, I>(dw.data<T>(), g.data<T>(), idx.data<I>(), idx.numel(), weight_shape[1]);
    });
  });
  return detail::as_dtype(dw, weight_dtype);
}

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  const char* op = "embedding";
  detail::check_floating(op, weight);
  detail::check_index(op, "indices", indices);
  detail::check_same_device(op, "weight", weight, "indices", indices);
  MT_CHECK(weight.dim() == 2, op, "weight must be [V, C], got {}", shape_str(weight.shape()));
  const std::int64_t V = weight.size(0), C = weight.size(1);
  Shape out_shape = indices.shape();
  out_shape.push_back(C);
  Tensor out, idx;
  if (weight.device().is_cuda()) {
    detail::check_cuda_data(op, "weight", weight);
    idx = indices.detach();
    const Tensor host = detail::index_to_host(op, "indices", idx);  // checks idx is contiguous
    detail::dispatch_index(host.dtype(), [&](auto izero) {
      using I = decltype(izero);
      detail::check_index_range(op, "index", host.data<I>(), host.numel(), V, false, 0, indices.shape());
    });
    out = Tensor::empty(out_shape, weight.dtype(), weight.device());
    cuda::embedding_forward(out.data_ptr(), weight.data_ptr(), idx.data_ptr(), weight.dtype(), idx.dtype(),
                            idx.numel(), V, C, weight.device().index);
  } else {
    detail::check_cpu(op, weight);
    idx = indices.is_contiguous() ? indices.detach() : indices.detach().contiguous();
    const Tensor wc = detail::compute_input(weight);
    Tensor y = Tensor::empty(out_shape, wc.dtype());
    detail::dispatch_index(idx.dtype(), [&](auto izero) {
      using I = decltype(izero);
      detail::check_index_range(op, "index", idx.data<I>(), idx.numel(), V, false, 0, indices.shape());
      detail::dispatch_compute(op, wc.dtype(), [&](auto zero) {
        using T = decltype(zero);
        cpu::embedding_forward<T, I>(y.data<T>(), wc.data<T>(), idx.data<I>(), idx.numel(), C);
      });
    });
    out = detail::as_dtype(y, weight.dtype());
  }
  if (autograd::needs_grad({&weight})) {
    autograd::SavedTensor sidx(idx);
    autograd::record(op, {weight}, {out},
                     [sidx, wshape = weight.shape(), wdtype = weight.dtype()](const std::vector<Tensor>& g) {
                       return std::vector<Tensor>{embedding_backward(g[0], sidx.unpack(), wshape, wdtype)};
                     });
  }
  // Under autocast the lookup stays exact and its output is stored in the compute dtype (amp/autocast.h).
  if (auto c = amp::detail::autocast_to_compute({out})) return (*c)[0];
  return out;
}

}  // namespace memtrain::ops

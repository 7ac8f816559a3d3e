// embedding: gathers rows of weight [V, C] by integer indices. Saves only the indices; the backward op
// scatters the output gradient into a zero [V, C] gradient. Kernels: the device's backend (src/core/backend.h;
// src/cpu/embedding.cpp, src/cuda/cuda_nn_backend.cpp), which range-checks the indices where their data is.
#include "core/backend.h"
#include "memtrain/autograd/grad_mode.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/ops/dispatch_modes.h"
#include "memtrain/ops/nn.h"
#include "ops/nn_common.h"

namespace memtrain::ops {

namespace {

// dw (+)= the rows of dout scattered by indices: added to dw's values when `accumulate`.
void scatter_rows(const Tensor& dw, const Tensor& dout, const Tensor& indices, bool accumulate) {
  detail::check_same_device("embedding_backward", "indices", indices, "output gradient", dout);
  ::memtrain::detail::backend_for(dout.device()).embedding_backward(dw, dout, indices, accumulate);
}

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  const char* op = "embedding";
  detail::check_floating(op, weight);
  detail::check_index(op, "indices", indices);
  detail::check_same_device(op, "weight", weight, "indices", indices);
  MT_CHECK(weight.dim() == 2, op, "weight must be [V, C], got {}", shape_str(weight.shape()));
  Shape out_shape = indices.shape();
  out_shape.push_back(weight.size(1));
  const Tensor idx = indices.detach();
  const Tensor out = Tensor::empty(out_shape, weight.dtype(), weight.device());
  ::memtrain::detail::backend_for(weight.device()).embedding_forward(out, weight, idx);
  if (autograd::needs_grad({&weight})) {
    autograd::SavedTensor sidx(idx);
    // A tied weight (GPT's wte and head) has its other gradient gathered already: the rows are scattered into it.
    autograd::record_into(op, {weight}, {out},
                          [sidx, wshape = weight.shape(), wdtype = weight.dtype()](const std::vector<Tensor>& g,
                                                                                   const std::vector<Tensor>& into) {
                            const Tensor& gathered = into[0];
                            if (gathered.defined() && gathered.dtype() == wdtype) {
                              scatter_rows(gathered, g[0], sidx.unpack(), true);
                              return std::vector<Tensor>{Tensor()};
                            }
                            const Tensor dw = Tensor::empty(wshape, wdtype, g[0].device());
                            scatter_rows(dw, g[0], sidx.unpack(), false);
                            return std::vector<Tensor>{dw};
                          });
  }
  // Under autocast the lookup stays exact and its output is stored in the compute dtype (amp/autocast.h).
  if (auto c = detail::cast_mode_to_compute(out)) return (*c)[0];
  return out;
}

void embedding_scatter_add_(Tensor& weight_grad, const Tensor& dout, const Tensor& indices) {
  const char* op = "embedding_scatter_add_";
  detail::check_floating(op, weight_grad);
  detail::check_index(op, "indices", indices);
  MT_CHECK(weight_grad.dim() == 2 && weight_grad.is_contiguous(), op, "weight_grad must be a contiguous [V, C], got {}",
           shape_str(weight_grad.shape()));
  Shape expected = indices.shape();
  expected.push_back(weight_grad.size(1));
  MT_CHECK(dout.shape() == expected && dout.dtype() == weight_grad.dtype(), op,
           "dout must be {} {} (indices {} and weight_grad's rows), got {} {}", dtype_name(weight_grad.dtype()),
           shape_str(expected), shape_str(indices.shape()), dtype_name(dout.dtype()), shape_str(dout.shape()));
  detail::check_same_device(op, "weight_grad", weight_grad, "dout", dout);
  autograd::NoGradGuard no_grad;
  scatter_rows(weight_grad, dout.contiguous(), indices.detach(), true);
}

}  // namespace memtrain::ops

// The CUDA backend's entries for the nn ops of src/ops/nn_*.cpp (embedding, softmax, losses, dropout) over the
// raw launchers of memtrain/cuda/nn.h. Each entry checks what its kernels take (f32, bf16 or f16, contiguous,
// one dtype), naming the op; index operands are copied to the host once to be range-checked like the CPU's.
#include "cuda/cuda_backend_entries.h"

#include "memtrain/cuda/nn.h"
#include "ops/nn_common.h"

#include <cstdint>

namespace memtrain::cuda {

namespace nd = ::memtrain::ops::detail;

// ---- embedding ----

void CudaBackend::embedding_forward(const Tensor& out, const Tensor& weight, const Tensor& indices) const {
  const char* op = "embedding";
  nd::check_cuda_data(op, "weight", weight);
  const std::int64_t V = weight.size(0), C = weight.size(1);
  const Tensor host = nd::index_to_host(op, "indices", indices);  // checks indices is contiguous
  nd::dispatch_index(host.dtype(), [&](auto izero) {
    using I = decltype(izero);
    nd::check_index_range(op, "index", host.data<I>(), host.numel(), V, false, 0, indices.shape());
  });
  cuda::embedding_forward(out.data_ptr(), weight.data_ptr(), indices.data_ptr(), weight.dtype(), indices.dtype(),
                          indices.numel(), V, C, weight.device().index);
}

void CudaBackend::embedding_backward(const Tensor& dweight, const Tensor& dout, const Tensor& indices) const {
  const char* op = "embedding_backward";
  MT_CHECK(dout.dtype() == dweight.dtype(), op, "output gradient {} {} on {} is not supported yet: expected {}",
           dtype_name(dout.dtype()), shape_str(dout.shape()), dout.device().str(), dtype_name(dweight.dtype()));
  nd::check_cuda_data(op, "output gradient", dout);
  fill(dweight, 0.0);  // the kernel accumulates into it
  cuda::embedding_backward(dweight.data_ptr(), dout.data_ptr(), indices.data_ptr(), dweight.dtype(), indices.dtype(),
                           indices.numel(), dweight.size(0), dweight.size(1), dout.device().index);
}

}  // namespace memtrain::cuda

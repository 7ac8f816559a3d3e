// The CUDA backend's memory, tensor-core and normalisation entries (src/cuda/cuda_backend_entries.h), and
// the backend object the registry hands out.
#include "cuda/cuda_backend_entries.h"

#include "core/operand_checks.h"
#include "cpu/convert.h"
#include "cuda/cuda_common.h"
#include "memtrain/core/error.h"
#include "cuda/convert.h"
#include "cuda/device_ops.h"
#include "cuda/nn.h"
#include "cuda/strided.h"

#include <cstdint>

namespace memtrain::cuda {

void check_nn_operands(const char* op, const Tensor& x,
                       std::initializer_list<std::pair<const char*, const Tensor*>> others) {
  ::memtrain::detail::check_cuda_data(op, "input", x);
  for (const auto& [what, t] : others) {
    if (!t->defined()) continue;
    ::memtrain::detail::check_cuda_same_dtype(op, what, *t, "input", x);
    ::memtrain::detail::check_cuda_data(op, what, *t);
  }
}

namespace {

// `t` as a new contiguous tensor of `dtype` on its device. cuda::cast converts between floating dtypes
// with the CPU's rounding rules; it has no integer or bool conversions, so those take a host round trip
// (same results, at PCIe speed).
Tensor converted_on_device(const Tensor& t, DType dtype) {
  const Tensor packed = t.contiguous();
  if (!is_floating(dtype) || !is_floating(t.dtype())) return packed.to(Device::cpu()).to(dtype).to(t.device());
  Tensor out = Tensor::empty(t.shape(), dtype, t.device());
  cast(packed.data_ptr(), packed.dtype(), out.data_ptr(), dtype, static_cast<std::size_t>(t.numel()),
       t.device().index);
  return out;
}

}  // namespace

int CudaBackend::device_count() const { return detail::usable_device_count(); }

std::unique_ptr<MemorySource> CudaBackend::make_memory_source(int index) const {
  return detail::make_cuda_memory_source(index);
}

void CudaBackend::fill(const Tensor& dst, double value) const {
  const int dev = dst.device().index;
  if (dst.is_contiguous()) {
    cuda::fill(dst.data_ptr(), dst.dtype(), static_cast<std::size_t>(dst.numel()), value, dev);
    return;
  }
  // As on the CPU: one element on the device, broadcast over the view as a stride-0 source.
  const Tensor one = Tensor::empty({}, dst.dtype(), dst.device());
  cuda::fill(one.data_ptr(), dst.dtype(), 1, value, dev);
  const Shape zero(dst.shape().size(), 0);
  strided_copy(dst.data_ptr(), dst.strides().data(), one.data_ptr(), zero.data(), dst.shape().data(),
               static_cast<int>(dst.dim()), dst.element_size(), dev);
}

// The strided-copy kernel lays out any views; a dtype change goes through cuda::cast (straight into a
// contiguous destination when it can) or, for integer/bool dtypes, the host.
void CudaBackend::copy(const Tensor& dst, const Tensor& src) const {
  const int dev = dst.device().index;
  if (src.dtype() == dst.dtype()) {
    strided_copy(dst.data_ptr(), dst.strides().data(), src.data_ptr(), src.strides().data(), dst.shape().data(),
                 static_cast<int>(dst.dim()), dst.element_size(), dev);
    return;
  }
  if (dst.is_contiguous() && !dst.shares_storage_with(src) && is_floating(dst.dtype()) && is_floating(src.dtype())) {
    const Tensor packed = src.contiguous();
    cast(packed.data_ptr(), packed.dtype(), dst.data_ptr(), dst.dtype(), static_cast<std::size_t>(dst.numel()), dev);
    return;
  }
  copy(dst, converted_on_device(src, dst.dtype()));
}

void CudaBackend::transfer(const Tensor& dst, const Tensor& src) const {
  cuda::copy(dst.data_ptr(), dst.device(), src.data_ptr(), src.device(), dst.nbytes());
}

double CudaBackend::read_scalar(const Tensor& t) const {
  std::uint64_t bits = 0;
  cuda::copy(&bits, Device::cpu(), t.data_ptr(), t.device(), t.element_size());
  return ::memtrain::cpu::read_as_double(&bits, t.dtype());
}

// Drawn on the host as f32 and copied over: the same numbers as the CPU, whatever the device.
void CudaBackend::fill_random(const Tensor& dst, const RngState& state, bool normal) const {
  const Tensor f = Tensor::empty(dst.shape(), DType::f32);
  if (normal) ::memtrain::cpu::fill_normal(f.data<float>(), f.numel(), state);
  else ::memtrain::cpu::fill_uniform(f.data<float>(), f.numel(), state);
  Tensor(dst).copy_(f);
}

}  // namespace memtrain::cuda

namespace memtrain::detail {

const Backend* cuda_backend(std::string& why) {
  static const cuda::CudaBackend backend;
  if (cuda::detail::usable_device_count() == 0) {
    why = cuda::detail::unusable_reason();
    return nullptr;
  }
  return &backend;
}

}  // namespace memtrain::detail

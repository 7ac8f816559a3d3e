// Core Tensor: construction, layout queries, element access, fill/copy and factories. The differentiable
// methods are in src/ops/, the autograd ones in src/autograd/.
#include "memtrain/core/tensor.h"

#include "cpu/convert.h"
#include "cpu/strided.h"
#include "memtrain/core/rng.h"
#include "memtrain/cuda/convert.h"
#include "memtrain/cuda/cuda.h"
#include "memtrain/cuda/strided.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>

namespace memtrain {

std::string shape_str(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

std::int64_t shape_numel(const Shape& shape) {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  std::int64_t s = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<std::int64_t>(shape[i], 1);
  }
  return strides;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (auto s : shape) MT_CHECK(s >= 0, "empty", "negative dimension in shape {}", shape_str(shape));
  const std::size_t nbytes = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(nbytes, device, current_category());
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::make_view(std::shared_ptr<Storage> storage, Shape shape, Shape strides, std::int64_t offset,
                         DType dtype) {
  MT_CHECK(storage != nullptr, "view", "no storage");
  MT_CHECK(shape.size() == strides.size(), "view", "shape {} and strides {} differ in rank", shape_str(shape),
           shape_str(strides));
  MT_CHECK(offset >= 0, "view", "negative offset {}", offset);
  // The furthest element the view can reach must lie inside the storage.
  std::int64_t last = offset;
  bool empty = false;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    MT_CHECK(shape[i] >= 0, "view", "negative dimension in shape {}", shape_str(shape));
    MT_CHECK(strides[i] >= 0, "view", "negative stride in {}", shape_str(strides));
    if (shape[i] == 0) empty = true;
    else last += (shape[i] - 1) * strides[i];
  }
  const std::int64_t capacity = static_cast<std::int64_t>(storage->nbytes() / dtype_size(dtype));
  MT_CHECK(empty || last < capacity, "view",
           "view of shape {} strides {} offset {} reaches element {} past the storage of {} {} elements",
           shape_str(shape), shape_str(strides), offset, last, capacity, dtype_name(dtype));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

TensorImpl& Tensor::impl() const {
  MT_CHECK(impl_ != nullptr, "Tensor", "use of an undefined tensor");
  return *impl_;
}

static std::int64_t wrap_dim(std::int64_t d, std::int64_t rank, const char* op) {
  MT_CHECK(d >= -rank && d < rank, op, "dimension {} out of range for a tensor of rank {}", d, rank);
  return d < 0 ? d + rank : d;
}

std::int64_t Tensor::size(std::int64_t d) const { return shape()[wrap_dim(d, dim(), "size")]; }
std::int64_t Tensor::stride(std::int64_t d) const { return strides()[wrap_dim(d, dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  std::int64_t expected = 1;
  for (std::int64_t i = dim() - 1; i >= 0; --i) {
    if (shape()[i] == 1) continue;
    if (strides()[i] != expected) return false;
    expected *= shape()[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  return static_cast<char*>(storage()->data()) + offset() * static_cast<std::int64_t>(element_size());
}

double Tensor::item() const {
  MT_CHECK(numel() == 1, "item", "expected one element, got shape {}", shape_str(shape()));
  if (device().is_cpu()) return cpu::read_as_double(data_ptr(), dtype());
  std::uint64_t bits = 0;
  cuda::copy(&bits, Device::cpu(), data_ptr(), device(), element_size());
  return cpu::read_as_double(&bits, dtype());
}

// `t` (on a CUDA device) as a new contiguous tensor of `dtype` on the same device. cuda::cast converts
// between floating dtypes with the CPU's rounding rules; it has no integer or bool conversions, so those
// take a host round trip through cpu::convert (same results, at PCIe speed).
static Tensor converted_on_device(const Tensor& t, DType dtype) {
  const Tensor packed = t.detach().contiguous();
  if (!is_floating(dtype) || !is_floating(t.dtype())) return packed.to(Device::cpu()).to(dtype).to(t.device());
  Tensor out = Tensor::empty(t.shape(), dtype, t.device());
  cuda::cast(packed.data_ptr(), packed.dtype(), out.data_ptr(), dtype, static_cast<std::size_t>(t.numel()),
             t.device().index);
  return out;
}

Tensor& Tensor::fill_(double value) {
  if (numel() == 0) return *this;
  std::uint64_t pattern = 0;
  cpu::write_from_double(&pattern, dtype(), value);
  if (device().is_cuda()) {
    if (is_contiguous()) {
      cuda::fill(data_ptr(), dtype(), static_cast<std::size_t>(numel()), value, device().index);
      return *this;
    }
    // As on the CPU: one element on the device, broadcast over the view as a stride-0 source.
    const Tensor one = Tensor::empty({}, dtype(), device());
    cuda::fill(one.data_ptr(), dtype(), 1, value, device().index);
    const Shape zero(shape().size(), 0);
    cuda::strided_copy(data_ptr(), strides().data(), one.data_ptr(), zero.data(), shape().data(),
                       static_cast<int>(dim()), element_size(), device().index);
    return *this;
  }
  // Broadcast one element over the view: a stride-0 source.
  cpu::strided_copy(data_ptr(), strides(), &pattern, Shape(dim(), 0), shape(), element_size());
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src) {
  MT_CHECK(src.shape() == shape(), "copy_", "shape mismatch: destination {} vs source {}", shape_str(shape()),
           shape_str(src.shape()));
  if (numel() == 0) return *this;
  if (device().is_cpu() && src.device().is_cpu()) {
    if (src.dtype() == dtype()) {
      cpu::strided_copy(data_ptr(), strides(), src.data_ptr(), src.strides(), shape(), element_size());
      return *this;
    }
    if (is_contiguous() && src.is_contiguous()) {
      cpu::convert(src.data_ptr(), src.dtype(), data_ptr(), dtype(), static_cast<std::size_t>(numel()));
      return *this;
    }
    const Tensor converted = src.detach().contiguous().to(dtype());  // convert first, then lay out
    return copy_(converted);
  }
  const Tensor source = src.detach();
  if (source.device() == device()) {
    // One CUDA device: the strided-copy kernel lays out any views; a dtype change goes through cuda::cast
    // (straight into a contiguous destination when it can) or, for integer/bool dtypes, the host.
    if (source.dtype() == dtype()) {
      cuda::strided_copy(data_ptr(), strides().data(), source.data_ptr(), source.strides().data(), shape().data(),
                         static_cast<int>(dim()), element_size(), device().index);
      return *this;
    }
    if (is_contiguous() && !shares_storage_with(source) && is_floating(dtype()) && is_floating(source.dtype())) {
      const Tensor packed = source.contiguous();
      cuda::cast(packed.data_ptr(), packed.dtype(), data_ptr(), dtype(), static_cast<std::size_t>(numel()),
                 device().index);
      return *this;
    }
    return copy_(converted_on_device(source, dtype()));
  }
  // Across devices: move contiguous bytes of the destination's dtype. The conversion happens where the
  // source is (CPU: cpu::convert; CUDA: as above); a non-contiguous destination receives the bytes in a
  // contiguous temporary on its own device first, and a non-contiguous CUDA source is packed on its device.
  if (!is_contiguous()) {
    Tensor staged = Tensor::empty(shape(), dtype(), device());
    staged.copy_(source);
    return copy_(staged);
  }
  Tensor moved = source;
  if (moved.device().is_cpu()) {
    if (moved.dtype() != dtype()) moved = moved.to(dtype());
    if (!moved.is_contiguous()) moved = moved.contiguous();
  } else {
    moved = moved.dtype() != dtype() ? converted_on_device(moved, dtype()) : moved.contiguous();
  }
  cuda::copy(data_ptr(), device(), moved.data_ptr(), moved.device(), nbytes());
  return *this;
}

Tensor& Tensor::set_data_(const Tensor& src) {
  MT_CHECK(src.defined(), "set_data_", "the source tensor is undefined");
  MT_CHECK(src.shape() == shape() && src.dtype() == dtype(), "set_data_",
           "source {} {} must match the tensor's shape {} and dtype {}", shape_str(src.shape()),
           dtype_name(src.dtype()), shape_str(shape()), dtype_name(dtype()));
  TensorImpl& self = impl();
  const TensorImpl& from = src.impl();
  if (&self == &from) return *this;
  self.storage = from.storage;
  self.strides = from.strides;
  self.offset = from.offset;
  return *this;
}

std::string Tensor::to_string() const {
  if (!defined()) return "Tensor(undefined)";
  std::string out = fmt::format("Tensor(shape={}, dtype={}, device={}", shape_str(shape()), dtype_name(dtype()),
                                device().str());
  const Tensor host = device().is_cpu() ? detach() : to(Device::cpu());
  const Tensor flat = host.detach().contiguous();
  constexpr std::int64_t kShow = 8;
  const std::int64_t n = numel();
  out += ", values=[";
  const auto* base = static_cast<const char*>(flat.data_ptr());
  for (std::int64_t i = 0; i < n; ++i) {
    if (n > 2 * kShow && i == kShow) {
      out += "..., ";
      i = n - kShow;
    }
    out += fmt::format("{:.6g}", cpu::read_as_double(base + i * static_cast<std::int64_t>(element_size()), dtype()));
    if (i + 1 < n) out += ", ";
  }
  out += "])";
  return out;
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.to_string() << '\n'; }

// ---- factories ----

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  t.fill_(value);
  return t;
}
Tensor zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }

Tensor arange(double start, double end, double step, DType dtype) {
  MT_CHECK(step != 0.0 && std::isfinite(start) && std::isfinite(end) && std::isfinite(step), "arange",
           "bad range start={} end={} step={}", start, end, step);
  const auto n = static_cast<std::int64_t>(std::max(0.0, std::ceil((end - start) / step)));
  Tensor t = Tensor::empty({n}, dtype);
  auto* p = static_cast<char*>(t.data_ptr());
  for (std::int64_t i = 0; i < n; ++i)
    cpu::write_from_double(p + i * static_cast<std::int64_t>(dtype_size(dtype)), dtype, start + step * i);
  return t;
}

static Tensor random_tensor(const Shape& shape, DType dtype, Device device, bool normal) {
  MT_CHECK(is_floating(dtype), normal ? "randn" : "rand", "needs a floating dtype, got {}", dtype_name(dtype));
  const std::int64_t n = shape_numel(shape);
  const RngState state = reserve_rng_blocks(static_cast<std::uint64_t>((n + 3) / 4));
  Tensor f = Tensor::empty(shape, DType::f32);
  if (normal) cpu::fill_normal(f.data<float>(), n, state);
  else cpu::fill_uniform(f.data<float>(), n, state);
  if (dtype == DType::f32 && device.is_cpu()) return f;
  Tensor out = Tensor::empty(shape, dtype, device);
  out.copy_(f);
  return out;
}

Tensor randn(const Shape& shape, DType dtype, Device device) { return random_tensor(shape, dtype, device, true); }
Tensor rand(const Shape& shape, DType dtype, Device device) { return random_tensor(shape, dtype, device, false); }

Tensor from_buffer(const void* data, const Shape& shape, DType src_dtype, DType dtype, Device device) {
  MT_CHECK(data != nullptr || shape_numel(shape) == 0, "from_buffer", "null data for shape {}", shape_str(shape));
  Tensor host = Tensor::empty(shape, dtype);
  cpu::convert(data, src_dtype, host.data_ptr(), dtype, static_cast<std::size_t>(host.numel()));
  if (device.is_cpu()) return host;
  Tensor out = Tensor::empty(shape, dtype, device);
  out.copy_(host);
  return out;
}

}  // namespace memtrain

// Core Tensor: construction, layout queries, element access, fill/copy and factories. The differentiable
// methods are in src/ops/, the autograd ones in src/autograd/.
#include "memtrain/core/tensor.h"

#include "core/backend.h"
#include "core/convert.h"
#include "memtrain/core/rng.h"
#include "memtrain/core/state_arena.h"

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
  // A kernel reaching a meta tensor's data is a bug in a backend entry: say so instead of faulting.
  MT_CHECK(!device().is_meta(), "data_ptr", "a meta tensor {} {} holds no data", shape_str(shape()),
           dtype_name(dtype()));
  return static_cast<char*>(storage()->data()) + offset() * static_cast<std::int64_t>(element_size());
}

double Tensor::item() const {
  MT_CHECK(numel() == 1, "item", "expected one element, got shape {}", shape_str(shape()));
  return detail::backend_for(device()).read_scalar(*this);
}

Tensor& Tensor::fill_(double value) {
  if (numel() == 0) return *this;
  detail::backend_for(device()).fill(*this, value);
  return *this;
}

// Across devices one side is the CPU (or both are CUDA devices): the bytes move in the destination's
// dtype, contiguous, and the backend of the side that is not the CPU moves them (detail::backend_for_transfer).
static void copy_across_devices(Tensor& dst, const Tensor& src) {
  if (!dst.is_contiguous()) {
    Tensor staged = Tensor::empty(dst.shape(), dst.dtype(), dst.device());
    staged.copy_(src);
    dst.copy_(staged);
    return;
  }
  const Tensor moved = src.to(dst.dtype()).contiguous();  // converted where the source is
  detail::backend_for_transfer(dst.device(), moved.device()).transfer(dst, moved);
}

Tensor& Tensor::copy_(const Tensor& src) {
  MT_CHECK(src.shape() == shape(), "copy_", "shape mismatch: destination {} vs source {}", shape_str(shape()),
           shape_str(src.shape()));
  if (numel() == 0) return *this;
  const Tensor source = src.detach();
  if (source.device() == device()) detail::backend_for(device()).copy(*this, source);
  else copy_across_devices(*this, source);
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

Tensor& Tensor::set_data_and_dtype_(const Tensor& src) {
  MT_CHECK(src.defined() && src.shape() == shape(), "set_data_and_dtype_", "source {} must match the tensor's shape {}",
           src.defined() ? shape_str(src.shape()) : std::string("undefined"), shape_str(shape()));
  if (src.dtype() == dtype()) return set_data_(src);
  set_grad(Tensor());
  impl().dtype = src.dtype();
  return set_data_(src);
}

std::string Tensor::to_string() const {
  if (!defined()) return "Tensor(undefined)";
  std::string out = fmt::format("Tensor(shape={}, dtype={}, device={}", shape_str(shape()), dtype_name(dtype()),
                                device().str());
  if (device().is_meta()) return out + ")";  // no values to show
  const Tensor flat = detach().to(Device::cpu()).contiguous();
  constexpr std::int64_t kShow = 8;
  const std::int64_t n = numel();
  out += ", values=[";
  const auto* base = static_cast<const char*>(flat.data_ptr());
  for (std::int64_t i = 0; i < n; ++i) {
    if (n > 2 * kShow && i == kShow) {
      out += "..., ";
      i = n - kShow;
    }
    out += fmt::format("{:.6g}", detail::read_as_double(base + i * static_cast<std::int64_t>(element_size()), dtype()));
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
Tensor zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  // Offloaded optimizer state in a new file reads as zeros already: writing them would make its pages resident.
  if (const StateArena* arena = t.storage()->arena(); arena != nullptr && arena->zero_filled()) return t;
  t.fill_(0.0);
  return t;
}
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }

Tensor arange(double start, double end, double step, DType dtype) {
  MT_CHECK(step != 0.0 && std::isfinite(start) && std::isfinite(end) && std::isfinite(step), "arange",
           "bad range start={} end={} step={}", start, end, step);
  const auto n = static_cast<std::int64_t>(std::max(0.0, std::ceil((end - start) / step)));
  Tensor t = Tensor::empty({n}, dtype);
  auto* p = static_cast<char*>(t.data_ptr());
  for (std::int64_t i = 0; i < n; ++i)
    detail::write_from_double(p + i * static_cast<std::int64_t>(dtype_size(dtype)), dtype, start + step * i);
  return t;
}

static Tensor random_tensor(const Shape& shape, DType dtype, Device device, bool normal) {
  MT_CHECK(is_floating(dtype), normal ? "randn" : "rand", "needs a floating dtype, got {}", dtype_name(dtype));
  const std::int64_t n = shape_numel(shape);
  const RngState state = reserve_rng_blocks(static_cast<std::uint64_t>((n + 3) / 4));
  Tensor out = Tensor::empty(shape, dtype, device);
  detail::backend_for(device).fill_random(out, state, normal);
  return out;
}

Tensor randn(const Shape& shape, DType dtype, Device device) { return random_tensor(shape, dtype, device, true); }
Tensor rand(const Shape& shape, DType dtype, Device device) { return random_tensor(shape, dtype, device, false); }

Tensor from_buffer(const void* data, const Shape& shape, DType src_dtype, DType dtype, Device device) {
  MT_CHECK(data != nullptr || shape_numel(shape) == 0, "from_buffer", "null data for shape {}", shape_str(shape));
  Tensor host = Tensor::empty(shape, dtype);
  detail::convert(data, src_dtype, host.data_ptr(), dtype, static_cast<std::size_t>(host.numel()));
  return host.to(device);  // the host tensor itself on the CPU
}

}  // namespace memtrain

// Tensor: a view (shape, strides, offset, dtype) onto shared Storage, plus optional autograd metadata.
// Copying a Tensor copies the handle, not the data. Strides and offset are in elements.
//
// Methods that create differentiable results (views, contiguous, to, clone) are declared here and
// implemented by the ops layer (src/ops/), so autograd records them; the rest is plain core.
#pragma once

#include "memtrain/core/device.h"
#include "memtrain/core/dtype.h"
#include "memtrain/core/error.h"
#include "memtrain/core/storage.h"

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace memtrain {

using Shape = std::vector<std::int64_t>;

namespace autograd {
struct AutogradMeta;
class Node;
}  // namespace autograd

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;
  std::int64_t offset = 0;
  DType dtype = DType::f32;
  std::shared_ptr<autograd::AutogradMeta> autograd;  // null for tensors that never took part in autograd
};

std::string shape_str(const Shape& shape);  // "[2, 3]"
std::int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // A new contiguous tensor with uninitialised contents, accounted to the current MemoryCategory.
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  // A view of existing storage; checks that the view stays inside the storage.
  static Tensor make_view(std::shared_ptr<Storage> storage, Shape shape, Shape strides, std::int64_t offset,
                          DType dtype);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  std::int64_t offset() const { return impl().offset; }
  std::int64_t dim() const { return static_cast<std::int64_t>(impl().shape.size()); }
  std::int64_t size(std::int64_t d) const;    // negative d counts from the end
  std::int64_t stride(std::int64_t d) const;
  std::int64_t numel() const { return shape_numel(impl().shape); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  std::size_t element_size() const { return dtype_size(dtype()); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * element_size(); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }
  bool shares_storage_with(const Tensor& other) const { return storage() == other.storage(); }

  // Pointer to the first element (offset applied).
  void* data_ptr() const;
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_ptr());
  }

  // Reads one element (any dtype, CPU or CUDA) as double. The tensor must have exactly one element.
  double item() const;
  template <typename T>
  T item() const {
    return static_cast<T>(item());
  }
  std::string to_string() const;  // shape, dtype, device and the values (abbreviated when large)

  // ---- in place, not recorded by autograd ----
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }
  Tensor& copy_(const Tensor& src);  // same shape; converts dtype and moves between devices
  // Points this tensor, and every handle that shares its TensorImpl, at src's data (storage, strides and
  // offset; as PyTorch's `param.data = src`). Shape and dtype must match; the device may differ. Autograd
  // metadata (requires_grad, gradient, hooks) is kept. Used to move parameters in place (nn::Module::to).
  Tensor& set_data_(const Tensor& src);
  // set_data_ that may change the dtype too (the shape must match): a parameter kept in another precision while
  // it is frozen (LISA's inactive blocks). The gradient, which would have the old dtype, is dropped.
  Tensor& set_data_and_dtype_(const Tensor& src);

  // ---- differentiable (implemented in src/ops/) ----
  Tensor view(const Shape& shape) const;     // needs a compatible layout; -1 infers one dimension
  Tensor reshape(const Shape& shape) const;  // a view when possible, else a copy
  Tensor flatten(std::int64_t start_dim = 0, std::int64_t end_dim = -1) const;
  Tensor transpose(std::int64_t d0, std::int64_t d1) const;
  Tensor t() const { return dim() < 2 ? *this : transpose(0, 1); }  // matrices; 0-D and 1-D unchanged
  Tensor permute(const Shape& dims) const;
  Tensor slice(std::int64_t dim, std::int64_t start, std::int64_t end, std::int64_t step = 1) const;
  Tensor narrow(std::int64_t dim, std::int64_t start, std::int64_t length) const;
  Tensor select(std::int64_t dim, std::int64_t index) const;
  Tensor expand(const Shape& shape) const;   // broadcast size-1 dims (stride 0); -1 keeps a size
  Tensor squeeze(std::int64_t dim) const;
  Tensor squeeze() const;
  Tensor unsqueeze(std::int64_t dim) const;
  Tensor contiguous() const;
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  Tensor clone() const;

  // ---- autograd (implemented in src/autograd/) ----
  bool requires_grad() const;
  Tensor& set_requires_grad(bool value = true);
  bool is_leaf() const;
  Tensor grad() const;              // undefined Tensor when there is none
  void set_grad(const Tensor& g);   // an undefined g clears it
  std::shared_ptr<autograd::Node> grad_fn() const;
  // Backward from this tensor: a scalar by default, or with the given gradient of the same shape.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  // Called once per backward pass when this leaf's gradient is final (after accumulation into grad()).
  void register_grad_ready_hook(std::function<void(Tensor&)> hook);
  Tensor detach() const;  // same data, no autograd history

  // Internal: the implementation object (for the ops and autograd layers).
  TensorImpl& impl() const;
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// ---- factories (CPU unless a device is given; floats of the current RNG stream) ----
Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor full(const Shape& shape, double value, DType dtype = DType::f32, Device device = Device::cpu());
Tensor arange(double start, double end, double step = 1.0, DType dtype = DType::f32);
inline Tensor arange(double end, DType dtype = DType::f32) { return arange(0.0, end, 1.0, dtype); }
Tensor randn(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor rand(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());  // uniform (0, 1]
// Copies n = numel(shape) elements of `src_dtype` from host memory.
Tensor from_buffer(const void* data, const Shape& shape, DType src_dtype, DType dtype, Device device = Device::cpu());

template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::f32;
  else if constexpr (std::is_same_v<T, double>) return DType::f64;
  else if constexpr (std::is_same_v<T, std::int32_t>) return DType::i32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return DType::i64;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return DType::u8;
  else if constexpr (std::is_same_v<T, std::int8_t>) return DType::i8;
  else static_assert(sizeof(T) == 0, "no DType for this C++ type");
}

// A tensor of `values` (float -> f32, double -> f64, int32_t -> i32, int64_t -> i64) with `shape`.
template <typename T>
Tensor tensor(const std::vector<T>& values, const Shape& shape) {
  MT_CHECK(static_cast<std::int64_t>(values.size()) == shape_numel(shape), "tensor", "{} values for shape {}",
           values.size(), shape_str(shape));
  return from_buffer(values.data(), shape, dtype_of<T>(), dtype_of<T>());
}
template <typename T>
Tensor tensor(std::initializer_list<T> values, const Shape& shape) {
  return tensor(std::vector<T>(values), shape);
}

}  // namespace memtrain

#include "memtrain/core/tensor_source.h"

namespace memtrain {

std::map<std::string, Tensor> read_all(const TensorSource& source) {
  std::map<std::string, Tensor> out;
  for (const std::string& name : source.names()) out.emplace(name, source.read(name));
  return out;
}

std::vector<std::string> MapTensorSource::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, t] : tensors_) out.push_back(name);
  return out;
}

const Tensor& MapTensorSource::find(const std::string& name) const {
  const auto it = tensors_.find(name);
  MT_CHECK(it != tensors_.end() && it->second.defined(), "read tensor", "no tensor '{}'{}", name,
           it == tensors_.end() ? "" : " (its entry is undefined)");
  return it->second;
}

std::optional<TensorInfo> MapTensorSource::info(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end() || !it->second.defined()) return std::nullopt;
  return TensorInfo{it->second.shape(), it->second.dtype()};
}

void MapTensorSource::read_into(const std::string& name, Tensor& dst) const {
  const Tensor& src = find(name);
  MT_CHECK(src.shape() == dst.shape(), "read tensor", "tensor '{}' has shape {}, the destination {}", name,
           shape_str(src.shape()), shape_str(dst.shape()));
  dst.copy_(src);
}

void MapTensorSource::read_range_into(const std::string& name, std::int64_t first, Tensor& dst) const {
  const Tensor& held = find(name);
  MT_CHECK(first >= 0 && first + dst.numel() <= held.numel(), "read tensor",
           "elements [{}, {}) of tensor '{}' run past its {} elements", first, first + dst.numel(), name,
           held.numel());
  const Tensor src = held.is_contiguous() ? held : held.contiguous();
  dst.copy_(Tensor::make_view(src.storage(), dst.shape(), contiguous_strides(dst.shape()), src.offset() + first,
                              src.dtype()));
}

Tensor MapTensorSource::read(const std::string& name) const { return find(name); }

std::vector<std::string> PrefixedTensorSource::names() const {
  std::vector<std::string> out;
  for (const std::string& name : base_.names())
    if (name.starts_with(prefix_)) out.push_back(name.substr(prefix_.size()));
  return out;
}

}  // namespace memtrain

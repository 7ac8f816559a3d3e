// io::SafetensorsFile: a safetensors file read on demand, each tensor straight into the caller's tensor or
// through the bounded staging buffer (io/tensor_pieces.h).
#include "memtrain/io/safetensors.h"

#include "io/safetensors_format.h"
#include "io/tensor_pieces.h"

#include <algorithm>

namespace memtrain::io {

struct SafetensorsFile::Impl {
  std::string path;
  Fd fd;
  Header header;
  std::map<std::string, const Entry*> by_name;
  mutable StagingBuffer staging;  // for destinations that cannot take the file's bytes as they are

  const Entry& entry(const std::string& name) const {
    const auto it = by_name.find(name);
    MT_CHECK(it != by_name.end(), kLoad, "'{}': no tensor '{}' in the file", path, name);
    return *it->second;
  }
  // Fills dst with e's elements from `first` on, in dst's element order.
  void read_elements(const Entry& e, std::int64_t first, Tensor& dst) const {
    const std::size_t size = dtype_size(e.dtype);
    const auto first_byte = static_cast<std::uint64_t>(first) * size;
    if (dst.numel() == 0) return;
    if (contiguous_in_host_memory(dst) && dst.dtype() == e.dtype) {
      read_bytes(e, dst.data_ptr(), dst.nbytes(), first_byte);  // the file's bytes are the tensor's
      return;
    }
    const std::size_t widest = std::max(size, dst.element_size());
    for_each_piece(dst, static_cast<std::int64_t>(kStagingBytes / widest), [&](Tensor piece, std::int64_t at) {
      Tensor staged = staging.view(piece.shape(), e.dtype);
      read_bytes(e, staged.data_ptr(), staged.nbytes(), first_byte + static_cast<std::uint64_t>(at) * size);
      piece.copy_(staged);  // converts the dtype and crosses to dst's device
    });
  }
  void read_bytes(const Entry& e, void* data, std::uint64_t bytes, std::uint64_t first_byte) const {
    ::memtrain::io::read_bytes(path, fd.fd, header, e, data, bytes, first_byte);
  }
};

SafetensorsFile::SafetensorsFile(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->header = open_and_read_header(path, impl_->fd);
  for (const Entry& e : impl_->header.entries) impl_->by_name.emplace(e.name, &e);
}

SafetensorsFile::~SafetensorsFile() = default;

const std::string& SafetensorsFile::path() const { return impl_->path; }

const std::map<std::string, std::string>& SafetensorsFile::metadata() const { return impl_->header.metadata; }

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(impl_->by_name.size());
  for (const auto& [name, e] : impl_->by_name) out.push_back(name);
  return out;
}

std::optional<TensorInfo> SafetensorsFile::info(const std::string& name) const {
  const auto it = impl_->by_name.find(name);
  if (it == impl_->by_name.end()) return std::nullopt;
  return TensorInfo{it->second->shape, it->second->dtype};
}

Tensor SafetensorsFile::read(const std::string& name) const {
  return read_whole(impl_->path, impl_->fd.fd, impl_->header, impl_->entry(name));
}

void SafetensorsFile::read_into(const std::string& name, Tensor& dst) const {
  const Entry& e = impl_->entry(name);
  MT_CHECK(dst.defined() && dst.shape() == e.shape, kLoad, "'{}': tensor '{}' has shape {} but its destination {}",
           impl_->path, name, shape_str(e.shape), dst.defined() ? shape_str(dst.shape()) : std::string("is undefined"));
  impl_->read_elements(e, 0, dst);
}

void SafetensorsFile::read_range_into(const std::string& name, std::int64_t first, Tensor& dst) const {
  const Entry& e = impl_->entry(name);
  const std::int64_t numel = shape_numel(e.shape);
  MT_CHECK(dst.defined() && first >= 0 && first <= numel && dst.numel() <= numel - first, kLoad,
           "'{}': elements [{}, {}) of tensor '{}' run past its {} elements", impl_->path, first,
           first + (dst.defined() ? dst.numel() : 0), name, numel);
  impl_->read_elements(e, first, dst);
}
}  // namespace memtrain::io

// safetensors files (the Hugging Face format): an 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {..}}
// then the raw little-endian bytes of every tensor, offsets relative to the end of the header.
// Saving is atomic (temp file + fsync + rename); loading checks every field and throws memtrain::Error
// naming the file and the tensor, never reading outside the file. Neither makes a whole copy of a tensor that
// is not a contiguous CPU tensor of the file's dtype: such a tensor (on a device, strided, converted) passes
// through one host buffer of at most kStagingBytes (or one row of dimension 0, where a row is larger).
#pragma once

#include "memtrain/core/tensor.h"
#include "memtrain/core/tensor_source.h"

#include <cstddef>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace memtrain::io {

// The bound of the host buffer a save or load stages tensors through.
inline constexpr std::size_t kStagingBytes = std::size_t{16} << 20;

// Writes the tensors (any device, any layout; written as contiguous little-endian bytes) in the given order.
// Names must be unique, non-empty and not "__metadata__".
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
// The same for a name -> tensor map (what nn::Module::state_dict() returns), written in name order.
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
// A braced list, {{"w", w}, {"b", b}}, in the given order: this overload keeps such a call unambiguous
// between the two above (an initializer_list parameter is the better match for a braced list).
void save_safetensors(const std::string& path, std::initializer_list<std::pair<std::string, Tensor>> tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Every tensor of the file, contiguous on the CPU, allocated under the current CategoryGuard.
std::map<std::string, Tensor> load_safetensors(const std::string& path);

// A file opened for reading: the constructor reads and checks the whole header (as load_safetensors does) and
// reads no tensor; each tensor is read on demand, straight into the caller's tensor where it is a contiguous CPU
// tensor of the file's dtype, else through the staging buffer.
class SafetensorsFile final : public TensorSource {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile() override;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const;
  const std::map<std::string, std::string>& metadata() const;  // "__metadata__"; empty when there is none
  std::vector<std::string> names() const override;
  std::optional<TensorInfo> info(const std::string& name) const override;
  void read_into(const std::string& name, Tensor& dst) const override;
  void read_range_into(const std::string& name, std::int64_t first, Tensor& dst) const override;
  Tensor read(const std::string& name) const override;  // a new contiguous CPU tensor (current CategoryGuard)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The "__metadata__" string map of the file (empty when it has none); reads only the header.
std::map<std::string, std::string> load_safetensors_metadata(const std::string& path);

// "F32" <-> DType::f32 and so on for the eleven dtypes memtrain has.
std::string_view safetensors_dtype_name(DType dtype);
std::optional<DType> dtype_from_safetensors(std::string_view name);

}  // namespace memtrain::io

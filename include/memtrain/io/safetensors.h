// safetensors files (the Hugging Face format): an 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {..}}
// then the raw little-endian bytes of every tensor, offsets relative to the end of the header.
// Saving is atomic (temp file + fsync + rename); loading checks every field and throws memtrain::Error
// naming the file and the tensor, never reading outside the file.
#pragma once

#include "memtrain/core/tensor.h"

#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace memtrain::io {

// Writes the tensors (any device, any layout; copied to contiguous CPU bytes) in the given order.
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

// The "__metadata__" string map of the file (empty when it has none); reads only the header.
std::map<std::string, std::string> load_safetensors_metadata(const std::string& path);

// "F32" <-> DType::f32 and so on for the eleven dtypes memtrain has.
std::string_view safetensors_dtype_name(DType dtype);
std::optional<DType> dtype_from_safetensors(std::string_view name);

}  // namespace memtrain::io

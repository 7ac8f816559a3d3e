// JSON files that memtrain reads and writes beside tensors (Hugging Face config.json, PEFT's
// adapter_config.json): read whole with the nesting limit of io/json_limits.h, written atomically.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace memtrain::detail {

// The JSON object in `path`. Throws memtrain::Error naming `where` and the file when it cannot be opened, is
// not valid JSON, nests too deep, or holds something other than an object.
nlohmann::json read_json_object_file(const std::string& path, const char* where);

// `j` written to `path` indented by 2 with a final newline, through AtomicFileWriter (io/atomic_file.h).
void write_json_file(const std::string& path, const nlohmann::json& j, const char* where);

}  // namespace memtrain::detail

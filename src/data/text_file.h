// Reads a whole file into a string; errors name the caller and the file.
#pragma once

#include <string>

namespace memtrain::data::detail {

// Throws memtrain::Error("<where>: '<path>': ...") when the file cannot be opened or read.
std::string read_text_file(const std::string& path, const std::string& where);

}  // namespace memtrain::data::detail

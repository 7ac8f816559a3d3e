// Byte sizes as people write them: "1.5GiB", "800MiB", "64KiB", "4096B" or a bare "4096" (bytes). Units are
// binary (KiB = 1024 B ... TiB); a decimal fraction is allowed before a unit and the result is rounded down
// to whole bytes.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace memtrain {

// Throws memtrain::Error(where, ...) naming the text and the accepted units when it is not such a size, is not
// positive, or does not fit in size_t.
std::size_t parse_byte_size(std::string_view text, std::string_view where);

}  // namespace memtrain

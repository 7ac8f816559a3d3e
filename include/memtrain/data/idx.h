// IDX files, the format of MNIST and Fashion-MNIST: bytes 0,0, an element-type code (0x08 = unsigned
// byte), the number of dimensions, then each dimension as a big-endian uint32, then the elements.
// 0x00000803 is an image file [N, rows, cols], 0x00000801 a label file [N].
#pragma once

#include "memtrain/core/tensor.h"

#include <string>

namespace memtrain::data {

// Reads a raw or gzip-compressed (".gz", detected from the bytes) IDX file of unsigned bytes into a u8
// tensor of the stored shape, allocated under MemoryCategory::data. Throws memtrain::Error naming the file
// and the (decompressed) offset on a bad magic, an unsupported type code, truncation or trailing bytes.
Tensor read_idx(const std::string& path);

}  // namespace memtrain::data

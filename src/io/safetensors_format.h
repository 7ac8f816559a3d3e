// The parsed header of a safetensors file (io/safetensors.h), shared by its readers: load_safetensors
// (safetensors.cpp, the reader the fuzz harness covers) and io::SafetensorsFile (safetensors_file.cpp).
#pragma once

#include "memtrain/core/tensor.h"

#include <unistd.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace memtrain::io {

inline constexpr const char* kLoad = "load_safetensors";

struct Entry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  std::uint64_t begin = 0;  // relative to the start of the data section
  std::uint64_t end = 0;
};

struct Header {
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;
  std::uint64_t data_start = 0;  // file offset of the data section
};

// Closes the descriptor on every path out, including throws.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Opens `path` and reads its header, every entry checked (safetensors.cpp); throws naming the file.
Header open_and_read_header(const std::string& path, Fd& fd);
// Reads `bytes` of e's data from `first_byte` on (relative to e's start) into data.
void read_bytes(const std::string& path, int fd, const Header& h, const Entry& e, void* data, std::uint64_t bytes,
                std::uint64_t first_byte);
// Tensor e as a new contiguous CPU tensor (under the current CategoryGuard).
Tensor read_whole(const std::string& path, int fd, const Header& h, const Entry& e);

}  // namespace memtrain::io

// FuzzFile: libFuzzer hands a harness bytes in memory, but memtrain's readers take a path. Each harness
// writes its input to a file in a per-process directory under /dev/shm (memory, so millions of runs do not
// wear a disk), calls the reader on that path, and the file is removed before the next input.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

namespace memtrain::fuzz {

// One directory per process, made on first use and removed at exit: parallel fuzzer jobs never share it.
// The name is leaked on purpose: the exit handler runs after static objects are destroyed.
inline const std::string& scratch_dir() {
  static const std::string* dir = [] {
    const char* base = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
    auto* name = new std::string(std::string(base) + "/memtrain_fuzz_XXXXXX");
    if (::mkdtemp(name->data()) == nullptr) {
      std::perror("memtrain fuzz: mkdtemp");
      std::abort();  // not a finding of the reader: stop loudly rather than fuzz nothing
    }
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return name;
  }();
  return *dir;
}

// Writes `size` bytes to scratch_dir()/name on construction and removes the file on destruction.
// `name` matters to readers that look at the extension (IDX: ".gz").
class FuzzFile {
 public:
  FuzzFile(const std::string& name, const std::uint8_t* data, std::size_t size)
      : path_(scratch_dir() + "/" + name) {
    std::FILE* f = std::fopen(path_.c_str(), "wb");
    if (f == nullptr || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
      std::perror("memtrain fuzz: writing the input file");
      std::abort();
    }
  }
  ~FuzzFile() { std::remove(path_.c_str()); }
  FuzzFile(const FuzzFile&) = delete;
  FuzzFile& operator=(const FuzzFile&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace memtrain::fuzz

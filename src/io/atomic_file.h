// AtomicFileWriter: writes "<path>.tmp.<pid>", then commit() fsyncs it, renames it over `path` and fsyncs
// the directory, so a reader sees either the old file or the complete new one. Destroyed before
// commit() (an exception mid-way), it removes the temp file and leaves `path` untouched.
#pragma once

#include <cstddef>
#include <string>

namespace memtrain::detail {

class AtomicFileWriter {
 public:
  // `where` names the caller in error messages ("save_safetensors").
  AtomicFileWriter(std::string path, std::string where);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, std::size_t nbytes);
  void commit();
  std::size_t bytes_written() const { return written_; }

 private:
  std::string path_;
  std::string tmp_path_;
  std::string where_;
  int fd_ = -1;
  std::size_t written_ = 0;
  bool committed_ = false;
};

// Reads exactly `nbytes` at `offset` from `fd`; false when the file ends first. Throws on I/O errors.
bool read_exact_at(int fd, void* data, std::size_t nbytes, std::size_t offset, const std::string& where,
                   const std::string& path);

}  // namespace memtrain::detail

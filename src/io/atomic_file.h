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

  // Allocates the file's `total` bytes on disk before anything is written, so a full disk (or a file-size
  // limit) fails here at once, naming the bytes needed and the bytes free, rather than part-way through.
  // A file system that cannot preallocate is simply written to.
  void reserve(std::size_t total);
  void write(const void* data, std::size_t nbytes);
  void commit();
  std::size_t bytes_written() const { return written_; }

 private:
  std::string path_;
  std::string tmp_path_;
  std::string where_;
  int fd_ = -1;
  std::size_t written_ = 0;
  std::size_t reserved_ = 0;  // what reserve() asked for: the error messages give it as the bytes needed
  bool committed_ = false;
};

// Creates `dir` (and its parents) when missing and checks that a file can be created in it, by creating and
// removing one. Throws naming `where`, `what` ("checkpoint_dir") and the reason, so a run whose output
// directory is read-only stops before its first step rather than at its first save.
void require_writable_dir(const std::string& dir, const std::string& where, const std::string& what);

// Reads exactly `nbytes` at `offset` from `fd`; false when the file ends first. Throws on I/O errors.
bool read_exact_at(int fd, void* data, std::size_t nbytes, std::size_t offset, const std::string& where,
                   const std::string& path);

}  // namespace memtrain::detail

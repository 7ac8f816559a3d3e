// Atomic replace by temp file + rename, with the fsyncs that make it survive a crash, not just a throw.
#include "io/atomic_file.h"

#include "memtrain/core/error.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace memtrain::detail {

namespace {

std::string errno_str(int err) { return std::strerror(err); }

std::string parent_dir(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::string path, std::string where)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp." + std::to_string(::getpid())), where_(std::move(where)) {
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MT_CHECK(fd_ >= 0, where_, "'{}': cannot create temp file '{}': {}", path_, tmp_path_, errno_str(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_path_.c_str());
}

void AtomicFileWriter::write(const void* data, std::size_t nbytes) {
  const auto* p = static_cast<const char*>(data);
  while (nbytes > 0) {
    ssize_t n = ::write(fd_, p, nbytes);
    if (n < 0 && errno == EINTR) continue;
    MT_CHECK(n > 0, where_, "'{}': write failed at offset {} of temp file '{}': {}", path_, written_, tmp_path_,
             n < 0 ? errno_str(errno) : std::string("no progress"));
    p += n;
    nbytes -= static_cast<std::size_t>(n);
    written_ += static_cast<std::size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  MT_CHECK(::fsync(fd_) == 0, where_, "'{}': fsync of temp file failed: {}", path_, errno_str(errno));
  int rc = ::close(fd_);
  fd_ = -1;
  MT_CHECK(rc == 0, where_, "'{}': close of temp file failed: {}", path_, errno_str(errno));
  MT_CHECK(::rename(tmp_path_.c_str(), path_.c_str()) == 0, where_, "'{}': rename from '{}' failed: {}", path_,
           tmp_path_, errno_str(errno));
  committed_ = true;
  // The rename is only durable once the directory entry is on disk.
  std::string dir = parent_dir(path_);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  MT_CHECK(dfd >= 0, where_, "'{}': cannot open directory '{}' to fsync it: {}", path_, dir, errno_str(errno));
  rc = ::fsync(dfd);
  int err = errno;
  ::close(dfd);
  MT_CHECK(rc == 0, where_, "'{}': fsync of directory '{}' failed: {}", path_, dir, errno_str(err));
}

bool read_exact_at(int fd, void* data, std::size_t nbytes, std::size_t offset, const std::string& where,
                   const std::string& path) {
  auto* p = static_cast<char*>(data);
  while (nbytes > 0) {
    ssize_t n = ::pread(fd, p, nbytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    MT_CHECK(n >= 0, where, "'{}': read failed at offset {}: {}", path, offset, errno_str(errno));
    if (n == 0) return false;
    p += n;
    nbytes -= static_cast<std::size_t>(n);
    offset += static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace memtrain::detail

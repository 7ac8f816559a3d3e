// Atomic replace by temp file + rename, with the fsyncs that make it survive a crash, not just a throw.
#include "io/atomic_file.h"

#include "memtrain/core/error.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>

namespace memtrain::detail {

namespace {

std::string errno_str(int err) { return std::strerror(err); }

std::string parent_dir(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// ", with N bytes free on <dir>" when the file system says; empty when it does not.
std::string free_bytes_note(const std::string& dir) {
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) != 0) return {};
  return fmt::format(", with {} bytes free on '{}'", static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize, dir);
}

bool is_out_of_space(int err) { return err == ENOSPC || err == EFBIG || err == EDQUOT; }

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

void AtomicFileWriter::reserve(std::size_t total) {
  reserved_ = total;
  if (total == 0) return;
  int rc = 0;
  do {
    rc = ::posix_fallocate(fd_, 0, static_cast<off_t>(total));
  } while (rc == EINTR);
  // Only running out of room is an error; a file system without fallocate (EOPNOTSUPP) is written to as it is.
  MT_CHECK(!is_out_of_space(rc), where_, "'{}': needs {} bytes on disk for temp file '{}' ({}){}", path_, total,
           tmp_path_, errno_str(rc), free_bytes_note(parent_dir(path_)));
}

void AtomicFileWriter::write(const void* data, std::size_t nbytes) {
  const auto* p = static_cast<const char*>(data);
  while (nbytes > 0) {
    ssize_t n = ::write(fd_, p, nbytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && is_out_of_space(errno)) {
      const int err = errno;
      const std::size_t needed = std::max(reserved_, written_ + nbytes);
      MT_CHECK(false, where_, "'{}': write failed at offset {} of temp file '{}': {}; the file needs {}{} bytes{}",
               path_, written_, tmp_path_, errno_str(err), reserved_ > 0 ? "" : "at least ", needed,
               free_bytes_note(parent_dir(path_)));
    }
    MT_CHECK(n > 0, where_, "'{}': write failed at offset {} of temp file '{}': {}", path_, written_, tmp_path_,
             n < 0 ? errno_str(errno) : std::string("no progress"));
    p += n;
    nbytes -= static_cast<std::size_t>(n);
    written_ += static_cast<std::size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  // Preallocated bytes never written would stay in the file as zeros.
  MT_CHECK(reserved_ == 0 || written_ == reserved_, where_, "'{}': reserved {} bytes but wrote {}", path_, reserved_,
           written_);
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

void require_writable_dir(const std::string& dir, const std::string& where, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MT_CHECK(!ec, where, "{} '{}' cannot be created: {}", what, dir, ec.message());
  const std::string probe = dir + "/.memtrain_write_probe." + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MT_CHECK(fd >= 0, where, "{} '{}' is not writable: {}", what, dir, errno_str(errno));
  ::close(fd);
  ::unlink(probe.c_str());
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

// Optimizer state in memory-mapped, unlinked files. See include/memtrain/core/file_arena.h.
#include "memtrain/core/file_arena.h"

#include "memtrain/core/error.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace memtrain {

namespace {

constexpr const char* kWhere = "offload";
constexpr std::size_t kHugeBytes = FileArena::kHugeMappingBytes;  // a PMD-mapped page on x86-64 and AArch64

std::size_t page_bytes() {
  static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

// The whole pages of [ptr, ptr + nbytes), rounded outwards: never past the mapping, which starts on a page and
// covers whole pages; a page that also holds a neighbour's bytes loses nothing (the mapping is shared).
std::pair<void*, std::size_t> pages_of(const void* ptr, std::size_t nbytes) {
  const std::uintptr_t page = page_bytes();
  const std::uintptr_t begin = reinterpret_cast<std::uintptr_t>(ptr) & ~(page - 1);
  const std::uintptr_t end = (reinterpret_cast<std::uintptr_t>(ptr) + nbytes + page - 1) & ~(page - 1);
  return {reinterpret_cast<void*>(begin), end - begin};
}

// Closes a descriptor when it goes out of scope.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

FileArena::FileArena(std::string dir) : StateArena(Device::cpu()), dir_(std::move(dir)) {
  MT_CHECK(!dir_.empty(), kWhere, "no directory given (file:DIR)");
  struct stat st {};
  MT_CHECK(::stat(dir_.c_str(), &st) == 0, kWhere, "directory '{}' cannot be used: {}", dir_, std::strerror(errno));
  MT_CHECK(S_ISDIR(st.st_mode), kWhere, "'{}' is not a directory", dir_);
  // A file in memory is no offload: tmpfs and ramfs keep their pages in RAM (as shared memory, outside the
  // process's RSS, so the run would look lighter while the machine holds the same bytes).
  struct statfs fs {};
  if (::statfs(dir_.c_str(), &fs) == 0) {
    MT_CHECK(fs.f_type != TMPFS_MAGIC && fs.f_type != RAMFS_MAGIC, kWhere,
             "'{}' is on {}, which keeps its files in RAM: the optimizer state would stay in memory; give a "
             "directory on a disk", dir_, fs.f_type == TMPFS_MAGIC ? "tmpfs" : "ramfs");
  }
  FdCloser probe{make_file(1, "a probe file")};
}

int FileArena::make_file(std::size_t bytes, const char* what) const {
  int failed = 0;
  const int fd = try_make_file(bytes, what, failed);
  MT_CHECK(failed == 0, kWhere, "'{}' has no room for {} of {} bytes: {}", dir_, what, bytes, std::strerror(failed));
  return fd;
}

int FileArena::try_make_file(std::size_t bytes, const char* what, int& failed) const {
  int fd = ::open(dir_.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    // No O_TMPFILE on this filesystem: a named file, unlinked at once.
    std::string path = dir_ + "/memtrain-state-XXXXXX";
    std::vector<char> name(path.begin(), path.end());
    name.push_back('\0');
    fd = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd >= 0) ::unlink(name.data());
  }
  MT_CHECK(fd >= 0, kWhere, "cannot make {} in '{}' (is it writable?): {}", what, dir_, std::strerror(errno));
  failed = ::posix_fallocate(fd, 0, static_cast<off_t>(std::max<std::size_t>(bytes, 1)));
  if (failed != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void FileArena::check_room(std::size_t bytes, std::size_t largest_file) const {
  // One file of the whole size is the surest probe: the filesystem allocates the blocks or says it cannot.
  int failed = 0;
  if (FdCloser whole{try_make_file(bytes, "the optimizer state", failed)}; failed == 0) return;
  MT_CHECK(failed == EFBIG && largest_file < bytes, kWhere, "'{}' has no room for the optimizer state of {} bytes: {}",
           dir_, bytes, std::strerror(failed));
  // Too large for one file: a filesystem that caps a file's size (FAT's 4 GiB, or a file-size limit on the
  // process) may still hold the state, which is a file per tensor. Then the free space is what statvfs says, and
  // the cap is probed with the largest tensor.
  struct statvfs vfs {};
  MT_CHECK(::statvfs(dir_.c_str(), &vfs) == 0, kWhere, "cannot read the free space of '{}': {}", dir_,
           std::strerror(errno));
  const auto free_bytes = static_cast<std::size_t>(vfs.f_bavail) * static_cast<std::size_t>(vfs.f_frsize);
  MT_CHECK(free_bytes >= bytes, kWhere, "'{}' has no room for the optimizer state of {} bytes: {} bytes are free",
           dir_, bytes, free_bytes);
  FdCloser largest{try_make_file(largest_file, "the largest state tensor", failed)};
  MT_CHECK(failed == 0, kWhere, "'{}' cannot hold the largest state tensor, {} bytes, in one file: {} (the state "
           "is a file per tensor; this filesystem caps a file's size)", dir_, largest_file, std::strerror(failed));
}

void* FileArena::take(std::size_t nbytes) {
  const std::size_t mapped = std::max<std::size_t>(nbytes, 1);
  FdCloser file{make_file(mapped, "a state tensor")};
  const auto fail = [&] {
    MT_CHECK(false, kWhere, "cannot map a state tensor of {} bytes from '{}': {} (each state tensor is a mapping of "
             "its own: see vm.max_map_count)", nbytes, dir_, std::strerror(errno));
  };
  if (mapped < kHugeBytes) {
    void* ptr = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, file.fd, 0);
    if (ptr == MAP_FAILED) fail();
    return ptr;  // the mapping keeps the file alive once its descriptor closes
  }
  // A large tensor is mapped on a 2 MiB boundary and asks for huge pages: its page cache then comes in 2 MiB
  // folios, each mapped (and handed back) at once. Mapping a step's state one 4 KiB page at a time cost gpt2-124M
  // a fifth of its step; a 2 MiB folio at a time, a few hundredths.
  const std::size_t span = mapped + kHugeBytes;
  void* reserved = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserved == MAP_FAILED) fail();
  const auto start = reinterpret_cast<std::uintptr_t>(reserved);
  const std::uintptr_t aligned = (start + kHugeBytes - 1) & ~(std::uintptr_t{kHugeBytes} - 1);
  void* ptr =
      ::mmap(reinterpret_cast<void*>(aligned), mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, file.fd, 0);
  if (ptr == MAP_FAILED) {
    ::munmap(reserved, span);
    fail();
  }
  // The reservation's ends, before and after the file's mapping.
  if (aligned > start) ::munmap(reserved, aligned - start);
  const std::uintptr_t used = aligned + ((mapped + page_bytes() - 1) & ~(page_bytes() - 1));
  if (start + span > used) ::munmap(reinterpret_cast<void*>(used), start + span - used);
  ::madvise(ptr, mapped, MADV_HUGEPAGE);  // a hint: without transparent huge pages, 4 KiB pages
  return ptr;
}

void FileArena::give_back(void* ptr, std::size_t nbytes) noexcept {
  ::munmap(ptr, std::max<std::size_t>(nbytes, 1));
}

void FileArena::release(const void* ptr, std::size_t nbytes) noexcept {
  if (nbytes == 0) return;
  const auto [begin, length] = pages_of(ptr, nbytes);
  ::madvise(begin, length, MADV_DONTNEED);
}

void FileArena::prepare(void* ptr, std::size_t nbytes) noexcept {
  if (nbytes == 0) return;
  const auto [begin, length] = pages_of(ptr, nbytes);
  // Write faults, all at once: faster than one fault a page, and a read fault would also map the neighbouring
  // pages the page cache holds (fault-around), the slices released before this one among them, which would then
  // stay in the process until the step ends. A kernel without it (before 5.14) faults the pages in as they are
  // touched.
  ::madvise(begin, length, MADV_POPULATE_WRITE);
}

}  // namespace memtrain

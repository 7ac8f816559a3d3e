// Optimizer state in memory-mapped, unlinked files. See include/memtrain/core/file_arena.h.
#include "memtrain/core/file_arena.h"

#include "memtrain/core/error.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
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
constexpr std::size_t kHugeBytes = std::size_t{1} << 21;  // a PMD-mapped page on x86-64 and AArch64 (4 KiB base)

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
  FdCloser probe{make_file(1, "a probe file")};
}

int FileArena::make_file(std::size_t bytes, const char* what) const {
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
  const int failed = ::posix_fallocate(fd, 0, static_cast<off_t>(std::max<std::size_t>(bytes, 1)));
  if (failed != 0) {
    ::close(fd);
    MT_CHECK(false, kWhere, "'{}' has no room for {} of {} bytes: {}", dir_, what, bytes, std::strerror(failed));
  }
  return fd;
}

void FileArena::check_room(std::size_t bytes) const {
  FdCloser probe{make_file(bytes, "the optimizer state")};
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

// FileArena: optimizer state in memory-mapped files under one directory (`--offload-optimizer file:DIR`), the
// tier ZeRO-Infinity keeps on NVMe, on whatever disk DIR is on.
//
// Each storage gets a file of its own, unlinked as soon as it is made (O_TMPFILE where the filesystem has it):
// nothing outlives the process, so a killed run leaves no state file behind to be trusted by mistake. It resumes
// from its checkpoint, which holds the state with its checksums. A file's blocks are allocated when it is made
// (posix_fallocate), so a full disk is an error naming the bytes then, never a SIGBUS in the middle of a step.
//
// The mapping is shared: release() drops the process's pages of a range (madvise MADV_DONTNEED) and the page
// cache keeps their contents, writing them back to the file when the kernel likes. What the process holds of
// the state is what it has touched since the last release, so the optimizer releases each slice it steps.
#pragma once

#include "memtrain/core/state_arena.h"

#include <cstddef>
#include <string>

namespace memtrain {

class FileArena final : public StateArena {
 public:
  // A tensor of this size or more is mapped on a 2 MiB boundary with MADV_HUGEPAGE, so its pages come and go in
  // 2 MiB folios; a smaller one is mapped 4 KiB at a time.
  static constexpr std::size_t kHugeMappingBytes = std::size_t{1} << 21;

  // Holds CPU storages. Checks that `dir` is a directory this process can make files in, on a filesystem that
  // is not in RAM (tmpfs, ramfs); throws Error("offload", ...) naming it and the reason otherwise.
  explicit FileArena(std::string dir);

  // Throws Error("offload", ...) unless `bytes` more, in files of at most `largest_file` bytes each, fit in the
  // directory now: a probe file of `bytes` is allocated there, then removed; where the filesystem refuses a
  // file that large (EFBIG: it caps a file's size), the free space is read from statvfs and the probe is a
  // file of `largest_file`. For start-up, with what the run's optimizer state will take (Optimizer::StatePlan).
  void check_room(std::size_t bytes, std::size_t largest_file) const;

  std::string where() const override { return "files under " + dir_; }
  void release(const void* ptr, std::size_t nbytes) noexcept override;
  void prepare(void* ptr, std::size_t nbytes) noexcept override;  // MADV_POPULATE_WRITE (Linux 5.14)
  bool zero_filled() const override { return true; }
  const std::string& dir() const { return dir_; }

 protected:
  void* take(std::size_t nbytes) override;
  void give_back(void* ptr, std::size_t nbytes) noexcept override;

 private:
  // A new file in dir_, already unlinked, with `bytes` allocated on disk; returns its descriptor. Throws when
  // the file cannot be made or allocated; try_make_file returns -1 and sets `failed` to posix_fallocate's error
  // for the second.
  int make_file(std::size_t bytes, const char* what) const;
  int try_make_file(std::size_t bytes, const char* what, int& failed) const;

  std::string dir_;
};

}  // namespace memtrain

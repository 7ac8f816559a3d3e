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
  // Holds CPU storages. Checks that `dir` is a directory this process can make files in; throws
  // Error("offload", ...) naming it and the system's reason otherwise.
  explicit FileArena(std::string dir);

  // Throws Error("offload", ...) unless `bytes` more fit in the directory now: a probe file of that size is
  // allocated there, then removed. For start-up, with the bytes a run's optimizer state will take.
  void check_room(std::size_t bytes) const;

  std::string where() const override { return "files under " + dir_; }
  void release(const void* ptr, std::size_t nbytes) noexcept override;
  void prepare(void* ptr, std::size_t nbytes) noexcept override;  // MADV_POPULATE_WRITE (Linux 5.14)
  bool zero_filled() const override { return true; }
  const std::string& dir() const { return dir_; }

 protected:
  void* take(std::size_t nbytes) override;
  void give_back(void* ptr, std::size_t nbytes) noexcept override;

 private:
  // A new file in dir_, already unlinked, with `bytes` allocated on disk; returns its descriptor.
  int make_file(std::size_t bytes, const char* what) const;

  std::string dir_;
};

}  // namespace memtrain

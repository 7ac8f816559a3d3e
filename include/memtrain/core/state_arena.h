// StateArena: where optimizer state lives when it is not to live in the device's allocator (optimizer offload).
// While a StateArenaGuard is alive on a thread, every Storage that thread makes under
// MemoryCategory::optimizer_state on a device the arena serves takes its bytes from the arena. The device's
// Allocator neither counts nor caches them: they are not its memory. The arena counts them (live and peak).
//
// An arena may keep its bytes outside the process (core/file_arena.h: memory-mapped files). release() then
// gives a range's pages back to the backing store, so the process stops holding them while their contents
// stay. The optimizer calls it on each slice of state it has stepped (optim::Optimizer::set_state_arena).
#pragma once

#include "memtrain/core/allocator.h"
#include "memtrain/core/device.h"
#include "memtrain/core/scoped_thread_value.h"

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

namespace memtrain {

class Tensor;

class StateArena {
 public:
  // The device whose optimizer-state storages the arena holds (one device: its bytes are that device's kind).
  explicit StateArena(Device device) : device_(device) {}
  virtual ~StateArena() = default;
  StateArena(const StateArena&) = delete;
  StateArena& operator=(const StateArena&) = delete;

  bool serves(Device device) const { return device == device_; }
  // What the arena keeps its bytes in, for reports ("files under /scratch").
  virtual std::string where() const = 0;

  // nbytes for one Storage: counted, and handed to the subclass's take() / give_back().
  void* allocate(std::size_t nbytes);
  void free(void* ptr, std::size_t nbytes) noexcept;
  // The pages of [ptr, ptr + nbytes) go back to the backing store; their contents stay readable. No-op by
  // default (an arena in the process's own memory has nowhere else to keep them).
  virtual void release(const void* /*ptr*/, std::size_t /*nbytes*/) noexcept {}
  // The range is about to be read and written: map its pages now, in one go, rather than one fault at a time.
  virtual void prepare(void* /*ptr*/, std::size_t /*nbytes*/) noexcept {}
  // Whether fresh bytes read as zero (a new file's do), so zeros() need not write them and make them resident.
  virtual bool zero_filled() const { return false; }

  std::size_t live_bytes() const;
  std::size_t peak_bytes() const;

 protected:
  virtual void* take(std::size_t nbytes) = 0;
  virtual void give_back(void* ptr, std::size_t nbytes) noexcept = 0;

 private:
  Device device_;
  mutable std::mutex mutex_;
  std::size_t live_ = 0;
  std::size_t peak_ = 0;
};

// Installs `arena` (null: none) for optimizer-state storages made on this thread while it lives; guards nest.
class StateArenaGuard : public ScopedThreadValue<std::shared_ptr<StateArena>> {
 public:
  explicit StateArenaGuard(std::shared_ptr<StateArena> arena);
};
// The arena a Storage of `category` on `device` made now would come from, or null.
const std::shared_ptr<StateArena>& state_arena_for(Device device, MemoryCategory category);

// Whether t's bytes come from an arena; release_state_pages(t) hands the pages of t's elements back to it
// (nothing for any other tensor, so callers need not ask first). A view that is not contiguous stands for its
// whole storage.
bool in_state_arena(const Tensor& t);
void release_state_pages(const Tensor& t);
// StateArena::prepare for t's elements (nothing for any other tensor).
void prepare_state_pages(const Tensor& t);

}  // namespace memtrain

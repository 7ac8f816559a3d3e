// Storage: one allocation of bytes on one device, shared by every tensor that views it. Its bytes are
// accounted to the category that was current when it was created (or the one set_category moved them to),
// until the last view lets go. Optimizer state made while a StateArenaGuard is alive comes from that arena
// instead (core/state_arena.h), which counts it; the device's allocator does not.
#pragma once

#include "memtrain/core/allocator.h"
#include "memtrain/core/device.h"

#include <cstddef>
#include <memory>

namespace memtrain {

class StateArena;  // core/state_arena.h

class Storage {
 public:
  Storage(std::size_t nbytes, Device device, MemoryCategory category);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return block_.ptr; }
  std::size_t nbytes() const { return block_.nbytes; }
  Device device() const { return device_; }
  MemoryCategory category() const { return block_.category; }
  // Accounts the bytes under `category` from now on (Allocator::recategorize), for every view of them.
  // Not for an arena's bytes: those are optimizer state for good.
  void set_category(MemoryCategory category);
  // The arena the bytes come from, or null when they come from the device's allocator.
  StateArena* arena() const { return arena_.get(); }

 private:
  Device device_;
  Block block_;
  std::shared_ptr<StateArena> arena_;
};

}  // namespace memtrain

#include "memtrain/core/storage.h"

#include "memtrain/core/error.h"
#include "memtrain/core/state_arena.h"

namespace memtrain {

Storage::Storage(std::size_t nbytes, Device device, MemoryCategory category)
    : device_(device), arena_(state_arena_for(device, category)) {
  if (!arena_) {
    block_ = Allocator::get(device).allocate(nbytes, category);
    return;
  }
  block_.ptr = arena_->allocate(nbytes);
  block_.nbytes = block_.class_bytes = nbytes;
  block_.category = category;
}

Storage::~Storage() {
  if (arena_) {
    arena_->free(block_.ptr, block_.nbytes);
    return;
  }
  Allocator::get(device_).deallocate(block_);
}

void Storage::set_category(MemoryCategory category) {
  MT_CHECK(!arena_, "Storage", "{} bytes of optimizer state in {} cannot be counted as {}", block_.nbytes,
           arena_ ? arena_->where() : std::string(), category_name(category));
  Allocator::get(device_).recategorize(block_, category);
}

}  // namespace memtrain

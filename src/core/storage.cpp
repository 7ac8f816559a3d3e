#include "memtrain/core/storage.h"

namespace memtrain {

Storage::Storage(std::size_t nbytes, Device device, MemoryCategory category)
    : device_(device), block_(Allocator::get(device).allocate(nbytes, category)) {}

Storage::~Storage() { Allocator::get(device_).deallocate(block_); }

void Storage::set_category(MemoryCategory category) { Allocator::get(device_).recategorize(block_, category); }

}  // namespace memtrain

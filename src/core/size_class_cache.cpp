// The CPU's cache policy: every request is rounded to its size class (Allocator::size_class) and gets a
// segment of exactly that size; a freed block waits in a multimap keyed by size class and serves only a
// later request of the same class and stream key (always 0 on the CPU). Nothing is split or merged: host
// memory is cheap to ask for, and the byte counts other tests and benchmarks check stay what they were.
#include "core/block_cache.h"

#include "memtrain/core/allocator.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <utility>

namespace memtrain::detail {

namespace {

class SizeClassCache final : public BlockCache {
 public:
  CachedBlock take(std::size_t nbytes, std::uintptr_t stream) override {
    const std::size_t cls = Allocator::size_class(nbytes);
    auto it = free_.find({stream, cls});
    if (it == free_.end()) return {};
    CachedBlock block{it->second, cls};
    free_.erase(it);
    return block;
  }

  std::size_t segment_bytes(std::size_t nbytes) const override { return Allocator::size_class(nbytes); }
  std::size_t segment_alignment() const override { return 64; }  // what HostMemorySource promises

  CachedBlock add_segment(void* ptr, std::size_t segment_bytes, std::size_t, std::uintptr_t) override {
    return {ptr, segment_bytes};  // the whole segment is the block
  }

  void give_back(void* ptr, std::size_t bytes, std::uintptr_t stream) override {
    free_.emplace(std::pair{stream, bytes}, ptr);
  }

  std::vector<Segment> release_free_segments(std::size_t at_least) override {
    // Largest first: the fewest blocks hand back the bytes, and the small classes, the most often reused, stay.
    std::vector<std::multimap<std::pair<std::uintptr_t, std::size_t>, void*>::iterator> order;
    order.reserve(free_.size());
    for (auto it = free_.begin(); it != free_.end(); ++it) order.push_back(it);
    std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
      return a->first.second > b->first.second;
    });
    std::vector<Segment> out;
    std::size_t released = 0;
    for (auto it = order.begin(); it != order.end() && released < at_least; ++it) {
      out.push_back({(*it)->second, (*it)->first.second});
      released += (*it)->first.second;
      free_.erase(*it);
    }
    return out;
  }
  using BlockCache::release_free_segments;

 private:
  std::multimap<std::pair<std::uintptr_t, std::size_t>, void*> free_;  // (stream, size class) -> free block
};

}  // namespace

std::unique_ptr<BlockCache> make_size_class_cache() { return std::make_unique<SizeClassCache>(); }

}  // namespace memtrain::detail

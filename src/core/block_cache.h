// How an Allocator keeps device bytes between uses (its cache policy), apart from the accounting and the
// budget, which the Allocator does the same way for every policy.
//
// A cache holds "segments" (what the MemorySource handed out) and lends "blocks" (ranges of a segment) to
// the Allocator. Two policies: SizeClassCache (one block per segment, reused only by requests of the same
// size class; the CPU's) and SegmentPool (segments split into blocks and coalesced again; devices').
// Stream-ordered reuse: every request and segment carries a stream key (MemorySource::stream_key(), the
// current CUDA stream; 0 for the CPU and the legacy default stream). A cache lends a free block only to a
// request with the key of the segment it lies in, so a block freed while one stream's queued kernels may
// still use it is never handed to work on another stream. Releasing segments ignores keys.
// Not thread-safe: the Allocator calls every method under its mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace memtrain::detail {

struct CachedBlock {
  void* ptr = nullptr;     // nullptr: nothing cached fits
  std::size_t bytes = 0;   // bytes the block occupies (>= the request)
};

struct Segment {
  void* ptr = nullptr;
  std::size_t bytes = 0;
};

class BlockCache {
 public:
  virtual ~BlockCache() = default;

  // A free block for a request of nbytes on stream `stream`, taken out of the cache; {nullptr, 0} when
  // none of that stream fits.
  virtual CachedBlock take(std::size_t nbytes, std::uintptr_t stream) = 0;
  // Bytes to ask the source for when take() found nothing for nbytes (>= nbytes).
  virtual std::size_t segment_bytes(std::size_t nbytes) const = 0;
  // Alignment the cache needs of a segment's address (what its blocks promise).
  virtual std::size_t segment_alignment() const = 0;
  // Adopts a fresh segment of segment_bytes(nbytes) bytes for stream `stream` and carves the block for
  // nbytes from it; the rest of the segment (if any) becomes free cache of that stream.
  virtual CachedBlock add_segment(void* ptr, std::size_t segment_bytes, std::size_t nbytes,
                                  std::uintptr_t stream) = 0;
  // A block from take()/add_segment() for `stream` comes back; it becomes free cache of that stream
  // (merged with free neighbours where the policy splits). Throws when ptr/bytes/stream is not a block
  // this cache lent out.
  virtual void give_back(void* ptr, std::size_t bytes, std::uintptr_t stream) = 0;
  // Removes segments that have no block in use, largest first, until their bytes reach at_least (or none is
  // left), and returns them for the caller to free.
  virtual std::vector<Segment> release_free_segments(std::size_t at_least) = 0;
  // Every segment that has no block in use.
  std::vector<Segment> release_free_segments() { return release_free_segments(SIZE_MAX); }
};

std::unique_ptr<BlockCache> make_size_class_cache();
std::unique_ptr<BlockCache> make_segment_pool();

}  // namespace memtrain::detail

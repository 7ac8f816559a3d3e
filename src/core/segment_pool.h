// The device cache policy (in the spirit of PyTorch's CUDACachingAllocator): memory comes from the source
// in segments that are split into blocks on demand and coalesced again when blocks are freed, so one
// cudaMalloc serves many requests of different sizes and freed memory is not tied to one size class.
//
//  - Requests are rounded up to a multiple of 512 bytes; segment addresses must be 256-byte aligned (as
//    cudaMalloc's are), so every block is 256-byte aligned for vector loads.
//  - Small requests (rounded <= 1 MiB) are carved from 2 MiB segments (the small pool); larger ones get a
//    segment of their size rounded up to 2 MiB (the large pool). 2 MiB is the driver's allocation
//    granularity, so rounding to it costs no device memory that cudaMalloc would not take anyway, and
//    unlike PyTorch's 20 MiB slabs for mid-sized requests it reserves nothing a program never asked for.
//    The two pools never lend to each other, so small short-lived blocks do not pin large segments.
//  - A request is served best fit (the smallest free block that fits, lowest address on ties) from its
//    pool. The block is split when the remainder is worth keeping: any remainder in the small pool (it is
//    at least 512 bytes), more than 1 MiB in the large pool (a smaller tail stays with the block).
//  - A freed block merges with the free blocks next to it in the same segment, so a segment whose blocks
//    are all freed is one free block again, and release_free_segments() can hand it back.
//
// Stream-ordered reuse (PyTorch's rule): a segment belongs to the stream that was current when it was
// allocated, and a request is served only from segments of the current stream. Work on one stream runs
// in enqueue order, so a block freed on the host while that stream's kernels may still use it can be lent
// at once to later work on the same stream; it is never lent to another stream, which could run first.
// A block comes back to its own stream's free list whichever stream is current when it is freed (using a
// tensor on a second stream is the caller's to order; see src/cuda/stream.h).
// Releasing segments (empty_cache, the out-of-memory retry) ignores streams: cudaFree waits for the device.
#pragma once

#include "core/block_cache.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <utility>

namespace memtrain::detail {

class SegmentPool final : public BlockCache {
 public:
  static constexpr std::size_t kBlockRound = 512;                   // block sizes are multiples of this
  static constexpr std::size_t kAlignment = 256;                    // segment (so block) address alignment
  static constexpr std::size_t kSmallRequest = std::size_t{1} << 20;     // largest small-pool request
  static constexpr std::size_t kSmallSegment = std::size_t{2} << 20;     // small-pool segment size
  static constexpr std::size_t kLargeRound = std::size_t{2} << 20;       // large segments round to this
  static constexpr std::size_t kMinLargeRemainder = std::size_t{1} << 20;  // split a large block above this

  // The block size a request gets before any unsplit remainder: nbytes rounded up to 512 (at least 512).
  static std::size_t round_request(std::size_t nbytes);

  CachedBlock take(std::size_t nbytes, std::uintptr_t stream) override;
  std::size_t segment_bytes(std::size_t nbytes) const override;
  std::size_t segment_alignment() const override { return kAlignment; }
  CachedBlock add_segment(void* ptr, std::size_t segment_bytes, std::size_t nbytes,
                          std::uintptr_t stream) override;
  void give_back(void* ptr, std::size_t bytes, std::uintptr_t stream) override;
  std::vector<Segment> release_free_segments(std::size_t at_least) override;
  using BlockCache::release_free_segments;
  // The same on the single stream 0 (tests of the pool alone).
  CachedBlock take(std::size_t nbytes) { return take(nbytes, 0); }
  CachedBlock add_segment(void* ptr, std::size_t segment_bytes, std::size_t nbytes) {
    return add_segment(ptr, segment_bytes, nbytes, 0);
  }
  void give_back(void* ptr, std::size_t bytes) { give_back(ptr, bytes, 0); }

  std::size_t num_segments() const { return segments_.size(); }
  // Walks every segment and throws memtrain::Error at the first inconsistency: blocks that do not tile
  // their segment exactly, two free neighbours left unmerged, a free list out of step, blocks of one
  // segment on two streams. For tests.
  void check_invariants() const;

 private:
  struct Span {
    std::size_t bytes = 0;
    char* segment = nullptr;  // base address of the segment this block lies in
    bool small = false;       // which pool the segment belongs to
    bool free = false;
    std::uintptr_t stream = 0;  // the stream the segment belongs to
  };
  using Spans = std::map<char*, Span>;
  // (stream, bytes, address): the best fit on a stream is lower_bound({stream, bytes, nullptr}).
  using FreeSet = std::set<std::tuple<std::uintptr_t, std::size_t, char*>>;
  static FreeSet::value_type free_entry(const Spans::value_type& block) {
    return {block.second.stream, block.second.bytes, block.first};
  }

  static bool small_request(std::size_t rounded) { return rounded <= kSmallRequest; }
  FreeSet& free_set(bool small) { return small ? small_free_ : large_free_; }
  const FreeSet& free_set(bool small) const { return small ? small_free_ : large_free_; }
  // Cuts `it` (in use) down to `bytes` when the remainder is worth keeping; the tail becomes a free block.
  void split(Spans::iterator it, std::size_t bytes);

  Spans spans_;                              // every block, free or in use, by address
  std::map<char*, std::size_t> segments_;    // base address -> bytes
  FreeSet small_free_, large_free_;
};

}  // namespace memtrain::detail

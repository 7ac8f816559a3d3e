// Segments split into blocks and coalesced on free. See src/core/segment_pool.h for the policy.
#include "core/segment_pool.h"

#include "memtrain/core/error.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <tuple>

namespace memtrain::detail {

namespace {
constexpr const char* kWhere = "Allocator::deallocate";

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }
}  // namespace

std::size_t SegmentPool::round_request(std::size_t nbytes) {
  // The Allocator rejects sizes near SIZE_MAX before they get here, so this cannot wrap.
  return nbytes == 0 ? kBlockRound : round_up(nbytes, kBlockRound);
}

std::size_t SegmentPool::segment_bytes(std::size_t nbytes) const {
  const std::size_t rounded = round_request(nbytes);
  return small_request(rounded) ? kSmallSegment : round_up(rounded, kLargeRound);
}

CachedBlock SegmentPool::take(std::size_t nbytes, std::uintptr_t stream) {
  const std::size_t rounded = round_request(nbytes);
  FreeSet& free = free_set(small_request(rounded));
  auto best = free.lower_bound({stream, rounded, nullptr});
  if (best == free.end() || std::get<0>(*best) != stream) return {};  // nothing of this stream fits
  char* ptr = std::get<2>(*best);
  free.erase(best);
  auto it = spans_.find(ptr);
  it->second.free = false;
  split(it, rounded);
  return {ptr, it->second.bytes};
}

CachedBlock SegmentPool::add_segment(void* ptr, std::size_t bytes, std::size_t nbytes, std::uintptr_t stream) {
  MT_CHECK(bytes == segment_bytes(nbytes), "Allocator::allocate", "segment of {} bytes for a request of {}",
           bytes, nbytes);
  char* base = static_cast<char*>(ptr);
  segments_.emplace(base, bytes);
  const std::size_t rounded = round_request(nbytes);
  auto it = spans_.emplace(base, Span{bytes, base, small_request(rounded), false, stream}).first;
  split(it, rounded);
  return {ptr, it->second.bytes};
}

void SegmentPool::split(Spans::iterator it, std::size_t bytes) {
  Span& span = it->second;
  const std::size_t remainder = span.bytes - bytes;
  // Small pool: every remainder is a multiple of 512, worth a block. Large pool: a tail of at most 1 MiB
  // stays with the block, so the large pool holds no blocks a large request could never use.
  const bool worth = span.small ? remainder >= kBlockRound : remainder > kMinLargeRemainder;
  if (!worth) return;
  span.bytes = bytes;
  char* tail = it->first + bytes;
  auto rest = spans_.emplace_hint(std::next(it), tail, Span{remainder, span.segment, span.small, true, span.stream});
  free_set(span.small).insert(free_entry(*rest));
}

void SegmentPool::give_back(void* ptr, std::size_t bytes, std::uintptr_t stream) {
  auto it = spans_.find(static_cast<char*>(ptr));
  MT_CHECK(it != spans_.end() && !it->second.free && it->second.bytes == bytes, kWhere,
           "block {} of {} bytes was not lent by this allocator, or was already freed", fmt::ptr(ptr), bytes);
  MT_CHECK(it->second.stream == stream, kWhere, "block {} was lent for stream {:#x}, returned for stream {:#x}",
           fmt::ptr(ptr), it->second.stream, stream);
  it->second.free = true;
  FreeSet& free = free_set(it->second.small);
  // Blocks of one segment tile it, and segments never overlap, so the next/previous span in address order
  // that belongs to the same segment is the adjacent block.
  if (auto next = std::next(it); next != spans_.end() && next->second.free && next->second.segment == it->second.segment) {
    free.erase(free_entry(*next));
    it->second.bytes += next->second.bytes;
    spans_.erase(next);
  }
  if (it != spans_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.free && prev->second.segment == it->second.segment) {
      free.erase(free_entry(*prev));
      prev->second.bytes += it->second.bytes;
      spans_.erase(it);
      it = prev;
    }
  }
  free.insert(free_entry(*it));
}

std::vector<Segment> SegmentPool::release_free_segments(std::size_t at_least) {
  std::vector<Segment> free_whole;
  for (const auto& [base, bytes] : segments_) {
    // Coalescing makes an entirely free segment exactly one free block starting at its base.
    const auto it = spans_.find(base);
    if (it->second.free && it->second.bytes == bytes) free_whole.push_back({base, bytes});
  }
  std::stable_sort(free_whole.begin(), free_whole.end(),
                   [](const Segment& a, const Segment& b) { return a.bytes > b.bytes; });
  std::vector<Segment> out;
  std::size_t released = 0;
  for (const Segment& seg : free_whole) {
    if (released >= at_least) break;
    char* const base = static_cast<char*>(seg.ptr);
    const auto it = spans_.find(base);
    free_set(it->second.small).erase(free_entry(*it));
    spans_.erase(it);
    segments_.erase(base);
    out.push_back(seg);
    released += seg.bytes;
  }
  return out;
}

void SegmentPool::check_invariants() const {
  constexpr const char* where = "SegmentPool::check_invariants";
  std::size_t spans_seen = 0, small_free = 0, large_free = 0;
  char* previous_end = nullptr;
  for (const auto& [base, bytes] : segments_) {
    MT_CHECK(reinterpret_cast<std::uintptr_t>(base) % kAlignment == 0, where, "segment {} misaligned",
             fmt::ptr(base));
    MT_CHECK(previous_end == nullptr || base >= previous_end, where, "segment {} overlaps the one before",
             fmt::ptr(base));
    previous_end = base + bytes;
    std::size_t covered = 0;
    bool previous_free = false;
    for (auto it = spans_.find(base); covered < bytes; ++it) {
      MT_CHECK(it != spans_.end() && it->first == base + covered, where,
               "segment {}: no block at offset {}", fmt::ptr(base), covered);
      const Span& s = it->second;
      MT_CHECK(s.segment == base && s.bytes > 0 && s.bytes % kBlockRound == 0, where,
               "segment {}: bad block at offset {} ({} bytes)", fmt::ptr(base), covered, s.bytes);
      MT_CHECK(!(s.free && previous_free), where, "segment {}: free neighbours at offset {} not merged",
               fmt::ptr(base), covered);
      MT_CHECK(s.small == spans_.find(base)->second.small, where, "segment {}: blocks in two pools",
               fmt::ptr(base));
      MT_CHECK(s.stream == spans_.find(base)->second.stream, where, "segment {}: blocks on two streams",
               fmt::ptr(base));
      if (s.free) {
        MT_CHECK(free_set(s.small).count(free_entry(*it)) == 1, where,
                 "segment {}: free block at offset {} missing from its free list", fmt::ptr(base), covered);
        ++(s.small ? small_free : large_free);
      }
      previous_free = s.free;
      covered += s.bytes;
      ++spans_seen;
    }
    MT_CHECK(covered == bytes, where, "segment {}: blocks cover {} of {} bytes", fmt::ptr(base), covered, bytes);
  }
  MT_CHECK(spans_seen == spans_.size(), where, "{} blocks lie outside every segment", spans_.size() - spans_seen);
  MT_CHECK(small_free == small_free_.size() && large_free == large_free_.size(), where,
           "free lists hold {} + {} entries for {} + {} free blocks", small_free_.size(), large_free_.size(),
           small_free, large_free);
}

std::unique_ptr<BlockCache> make_segment_pool() { return std::make_unique<SegmentPool>(); }

}  // namespace memtrain::detail

// Memory accounting. Every allocation of tensor bytes goes through the Allocator of its device and is
// tagged with a MemoryCategory taken from the innermost CategoryGuard on the calling thread. The
// allocator keeps, per category and in total: live bytes (exactly the bytes tensors asked for), peak
// bytes, and what was live per category at the moment of the total peak. Freed blocks are cached and
// reused, so steady-state training touches no fresh pages; the cache shows up as "reserved" in the report.
// An optional byte budget turns an overrun into OutOfBudget with the report.
//
// How freed bytes are cached is the CachePolicy, chosen at construction: the CPU caches whole blocks by
// size class; devices carve blocks out of 2 MiB-granular segments, split and coalesced on demand (see
// src/core/segment_pool.h), because each cudaMalloc is slow and device memory must not fragment.
//
// Streams: a request is served only from cache of the stream current when it is made (the source's
// stream_key()), and a block goes back to the cache of the stream it was allocated on, so freed device
// memory is never lent to another stream's work while its own stream may still use it. A block used on
// a second stream must be ordered by the caller (src/cuda/stream.h).
#pragma once

#include "memtrain/core/device.h"
#include "memtrain/core/scoped_thread_value.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>  // kept: code that includes this header may rely on it
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace memtrain {

namespace detail {
class BlockCache;  // src/core/block_cache.h
struct Segment;
}  // namespace detail

enum class MemoryCategory : std::uint8_t {
  parameters,
  compute_weights,  // low-precision copies of the parameters made for one forward (amp::Autocast)
  gradients,
  optimizer_state,
  activations,
  workspace,
  data,
  other,
};
inline constexpr int kNumMemoryCategories = 8;
std::string_view category_name(MemoryCategory c);

// Sets the category of allocations made on this thread while it lives; guards nest.
class CategoryGuard : public ScopedThreadValue<std::optional<MemoryCategory>> {
 public:
  explicit CategoryGuard(MemoryCategory c);
};
MemoryCategory current_category();  // MemoryCategory::other when no guard is active
// Whether a CategoryGuard is active on this thread. With none, an op output that autograd records (a forward
// op under grad mode whose inputs require grad) moves from `other` to `activations` as it is recorded, so a
// hand-written loop's forward counts as activations without a guard (autograd::record).
bool category_guard_active();

// How an Allocator caches freed bytes.
enum class CachePolicy : std::uint8_t {
  size_classes,  // one source allocation per block, reused only by the same size class (CPU)
  segments,      // source allocations are segments split into 256-byte aligned blocks, merged on free (CUDA)
};

// Where raw bytes come from for one device kind: host memory, CUDA memory, ...
class MemorySource {
 public:
  virtual ~MemorySource() = default;
  virtual void* raw_allocate(std::size_t nbytes) = 0;  // 64-byte aligned at least; throws on failure
  virtual void raw_free(void* ptr, std::size_t nbytes) = 0;
  // The stream whose work a request made now is for (the current CUDA stream); cached blocks are reused
  // only by requests with the same key. 0 for sources with a single stream (the CPU).
  virtual std::uintptr_t stream_key() const { return 0; }
};

struct CategoryStats {
  std::size_t live_bytes = 0;
  std::size_t peak_bytes = 0;
  std::size_t live_blocks = 0;
  std::size_t at_total_peak = 0;  // live bytes of this category when the total peaked
};

struct MemoryStats {
  std::array<CategoryStats, kNumMemoryCategories> by_category{};
  std::size_t live_bytes = 0;      // sum of live bytes over categories
  std::size_t peak_bytes = 0;      // peak of that sum
  std::size_t reserved_bytes = 0;  // bytes held from the OS/driver: blocks in use + cache (rounded)
  std::size_t reserved_peak_bytes = 0;  // peak of reserved_bytes (since reset_peak: from what was reserved then)
  std::size_t cached_bytes = 0;    // reserved bytes in no block in use, ready for reuse
  std::size_t num_allocs = 0;      // allocations served
  std::size_t allocated_bytes = 0;  // bytes they asked for, summed over all of them (what was written, roughly)
  std::size_t cache_hits = 0;      // of those, served from the cache
  const CategoryStats& operator[](MemoryCategory c) const { return by_category[static_cast<int>(c)]; }
};

// One allocation handed out by an Allocator. Returned to it by Allocator::deallocate.
struct Block {
  void* ptr = nullptr;
  std::size_t nbytes = 0;      // bytes asked for (what accounting counts)
  std::size_t class_bytes = 0; // bytes the block occupies (size class, or split block size) >= nbytes
  MemoryCategory category = MemoryCategory::other;
  std::uintptr_t stream = 0;   // MemorySource::stream_key() when allocated; the block returns to its cache
};

class Allocator {
 public:
  // The policy defaults to the device kind's (the registry's detail::cache_policy_for): size classes on the CPU
  // and meta, segments on CUDA.
  Allocator(Device device, std::unique_ptr<MemorySource> source);
  Allocator(Device device, std::unique_ptr<MemorySource> source, CachePolicy policy);
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // The allocator of a device, with the memory source its backend gives (src/core/backend.h). CPU and
  // meta always exist; a CUDA device when the build has CUDA and the device is usable.
  static Allocator& get(Device device);

  Block allocate(std::size_t nbytes, MemoryCategory category);
  Block allocate(std::size_t nbytes) { return allocate(nbytes, current_category()); }
  void deallocate(const Block& block);
  // Moves a live block's bytes from block.category to `category` (that category's live, peak and block count
  // follow; the total is unchanged, and so is the snapshot at the total peak unless the total is at its peak
  // now) and sets block.category. For bytes whose role is known only after they were made: a tensor made with
  // zeros() and then registered as a parameter (nn::Module::register_parameter), an op output recorded by
  // autograd outside any CategoryGuard (autograd::record: activations).
  void recategorize(Block& block, MemoryCategory category);

  MemoryStats stats() const;
  const Device& device() const { return device_; }
  void reset_peak();     // peaks restart from the current live (and reserved) bytes
  void empty_cache();    // hand source allocations with no block in use back to the OS/driver
  // Caches from now on under `policy`, with its default reserve limit (see set_reserve_limit). For a prediction
  // on meta of a device run, whose allocator carves blocks from segments (train/predict.h). Empties the cache
  // first; throws when a block is in use (its bytes were laid out by the other policy).
  void set_cache_policy(CachePolicy policy);
  CachePolicy cache_policy() const;
  void set_budget(std::optional<std::size_t> bytes);  // live-bytes budget; nullopt = unlimited
  std::optional<std::size_t> budget() const;
  // The most this allocator keeps reserved, as a multiple (>= 1) of the live peak so far (or of the live
  // bytes after the request, when more), and at most `max_above_peak` bytes above that peak when given: a
  // request that finds nothing cached for it first hands cached blocks back to the source, largest first, when
  // its new segment would take reserved past that. Without a limit the cache keeps every freed block until
  // empty_cache(). Default: kHostReserveLimit and kHostReserveSlack under size classes (host memory is quick to
  // ask for again; a large run's cache is capped in bytes too, since what the host holds beyond the live bytes is
  // resident), none under segments (freeing device memory waits for the device). Size classes round requests
  // up (12.5% at most, 3.1% from 32 MiB), which no limit gives back: blocks in use stay reserved.
  void set_reserve_limit(std::optional<double> ratio_of_live_peak,
                         std::optional<std::size_t> max_above_peak = std::nullopt);
  std::optional<double> reserve_limit() const;
  std::optional<std::size_t> reserve_slack() const;  // max_above_peak
  static constexpr double kHostReserveLimit = 1.10;
  static constexpr std::size_t kHostReserveSlack = std::size_t{64} << 20;

  // Called after every allocation and free with the live bytes of each category then, under the allocator's
  // lock (in allocation order across threads): it must be quick and must not allocate from this allocator.
  // One observer at a time; an empty function removes it. (train::MemoryTimeline records through it.)
  using Observer = std::function<void(const std::array<std::size_t, kNumMemoryCategories>& live)>;
  void set_observer(Observer observer);

  // Human-readable table: category, live, peak, at-peak; then total, reserved, cache.
  std::string report() const;

  // Rounds a request to the size class the CPU's cache keys on (>= nbytes, multiple of 64): 64-byte steps to
  // 4 KiB, then 8 classes per power of two, and 32 from 32 MiB (the few blocks that large, embedding tables
  // and their gradients and moments, live long and rarely share a class; 12.5% of them was mostly waste).
  static std::size_t size_class(std::size_t nbytes);

  // Largest request accepted; anything above is a size computation gone wrong, not memory to ask for.
  static constexpr std::size_t kMaxRequest = std::size_t{1} << 62;

 private:
  std::string report_locked() const;
  void notify_observer_locked() const;
  // Takes free segments out of the cache and its accounting, largest first until their bytes reach at_least
  // (under the lock); the caller frees them.
  std::vector<detail::Segment> release_free_segments_locked(std::size_t at_least = SIZE_MAX);
  // The free segments to hand back before a new segment of segment_bytes for nbytes is asked for, so that
  // reserved stays within the reserve limit (none when it does already, or there is no limit).
  std::vector<detail::Segment> trim_cache_locked(std::size_t segment_bytes, std::size_t nbytes);
  void free_segments(const std::vector<detail::Segment>& segments);
  // Asks the source for a segment for nbytes; on failure releases the free segments and retries once.
  void* allocate_segment(std::size_t segment_bytes, std::size_t nbytes, MemoryCategory category);

  Device device_;
  std::unique_ptr<MemorySource> source_;
  mutable std::mutex mutex_;
  MemoryStats stats_;
  std::optional<std::size_t> budget_;
  std::optional<double> reserve_limit_;
  std::optional<std::size_t> reserve_slack_;
  Observer observer_;
  CachePolicy policy_;
  std::unique_ptr<detail::BlockCache> cache_;  // the CachePolicy; touched only under mutex_
};

// Sets an allocator's cache policy for a scope and restores the one it had after it (set_cache_policy, both).
class CachePolicyGuard {
 public:
  CachePolicyGuard(Allocator& allocator, CachePolicy policy);
  ~CachePolicyGuard();  // leaves the policy as it is when a block is still in use then
  CachePolicyGuard(const CachePolicyGuard&) = delete;
  CachePolicyGuard& operator=(const CachePolicyGuard&) = delete;

 private:
  Allocator& allocator_;
  CachePolicy previous_;
};

// Shortcut for the CPU allocator's report / stats.
std::string memory_report(Device device = Device::cpu());
MemoryStats memory_stats(Device device = Device::cpu());


}  // namespace memtrain

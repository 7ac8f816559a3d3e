// Caching allocator with per-category accounting and a budget. See include/memtrain/core/allocator.h;
// where freed bytes wait (the cache policy) is src/core/block_cache.h.
#include "memtrain/core/allocator.h"

#include "core/backend.h"
#include "core/block_cache.h"
#include "memtrain/core/error.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <optional>

namespace memtrain {

namespace {

// The innermost CategoryGuard's category; empty while no guard is alive on this thread.
thread_local std::optional<MemoryCategory> t_category;

std::string human_bytes(std::size_t b) {
  const double x = static_cast<double>(b);
  if (b >= (1ull << 30)) return fmt::format("{:.2f} GiB", x / (1ull << 30));
  if (b >= (1ull << 20)) return fmt::format("{:.2f} MiB", x / (1ull << 20));
  if (b >= (1ull << 10)) return fmt::format("{:.2f} KiB", x / (1ull << 10));
  return fmt::format("{} B", b);
}

}  // namespace

std::string_view category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::parameters: return "parameters";
    case MemoryCategory::compute_weights: return "compute_weights";
    case MemoryCategory::gradients: return "gradients";
    case MemoryCategory::optimizer_state: return "optimizer_state";
    case MemoryCategory::activations: return "activations";
    case MemoryCategory::workspace: return "workspace";
    case MemoryCategory::data: return "data";
    case MemoryCategory::other: return "other";
  }
  return "?";
}

CategoryGuard::CategoryGuard(MemoryCategory c) : ScopedThreadValue(t_category, c) {}
MemoryCategory current_category() { return t_category.value_or(MemoryCategory::other); }
bool category_guard_active() { return t_category.has_value(); }

Allocator::Allocator(Device device, std::unique_ptr<MemorySource> source)
    : Allocator(device, std::move(source), detail::cache_policy_for(device)) {}

namespace {

std::unique_ptr<detail::BlockCache> make_cache(CachePolicy policy) {
  return policy == CachePolicy::segments ? detail::make_segment_pool() : detail::make_size_class_cache();
}
std::optional<double> default_reserve_limit(CachePolicy policy) {
  return policy == CachePolicy::size_classes ? std::optional<double>(Allocator::kHostReserveLimit) : std::nullopt;
}
std::optional<std::size_t> default_reserve_slack(CachePolicy policy) {
  return policy == CachePolicy::size_classes ? std::optional<std::size_t>(Allocator::kHostReserveSlack)
                                             : std::nullopt;
}

}  // namespace

Allocator::Allocator(Device device, std::unique_ptr<MemorySource> source, CachePolicy policy)
    : device_(device),
      source_(std::move(source)),
      reserve_limit_(default_reserve_limit(policy)),
      reserve_slack_(default_reserve_slack(policy)),
      policy_(policy),
      cache_(make_cache(policy)) {
  MT_CHECK(source_ != nullptr, "Allocator", "no memory source for {}", device_.str());
}

Allocator::~Allocator() {
  // Blocks still live at exit belong to static tensors; only the free segments are ours to return.
  empty_cache();
}

Allocator& Allocator::get(Device device) {
  // One allocator per device, made on first use over its backend's memory source (cache_policy_for); leaked on
  // purpose: tensors in other static objects may be freed after these would be destroyed. The slot is read
  // without the lock, since every allocation asks for its allocator.
  constexpr int kMaxDevices = 64;
  MT_CHECK(static_cast<int>(device.type) < kNumDeviceTypes && device.index >= 0 && device.index < kMaxDevices,
           "Allocator::get", "bad device {}", device.str());
  static std::atomic<Allocator*> allocators[kNumDeviceTypes][kMaxDevices] = {};
  std::atomic<Allocator*>& slot = allocators[static_cast<int>(device.type)][device.index];
  if (Allocator* made = slot.load(std::memory_order_acquire)) return *made;
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  if (slot.load(std::memory_order_relaxed) == nullptr) {
    const detail::Backend& backend = detail::backend_for(device);  // throws: no CUDA, or no usable device
    slot.store(new Allocator(device, backend.make_memory_source(device.index)), std::memory_order_release);
  }
  return *slot.load(std::memory_order_relaxed);
}

std::size_t Allocator::size_class(std::size_t nbytes) {
  constexpr std::size_t kSmall = 4096, kLarge = std::size_t{32} << 20;
  if (nbytes <= kSmall) return std::max<std::size_t>(64, (nbytes + 63) & ~std::size_t{63});
  std::size_t pow2 = std::size_t{1} << (63 - __builtin_clzll(nbytes - 1));  // largest power of two < nbytes
  std::size_t step = pow2 / (nbytes > kLarge ? 32 : 8);
  return (nbytes + step - 1) / step * step;
}

Block Allocator::allocate(std::size_t nbytes, MemoryCategory category) {
  MT_CHECK(nbytes <= kMaxRequest, "Allocator::allocate", "allocator({}): {} bytes requested, more than any device has",
           device_.str(), nbytes);
  const std::uintptr_t stream = source_->stream_key();  // outside the lock: it may ask CUDA
  std::unique_lock lock(mutex_);
  if (budget_ && stats_.live_bytes + nbytes > *budget_) {
    const std::string msg = fmt::format(
        "allocator({}): allocating {} of {} would exceed the budget of {} ({} live)\n{}", device_.str(),
        human_bytes(nbytes), category_name(category), human_bytes(*budget_), human_bytes(stats_.live_bytes),
        report_locked());
    throw OutOfBudget(msg);
  }
  detail::CachedBlock block = cache_->take(nbytes, stream);
  if (block.ptr != nullptr) {
    stats_.cached_bytes -= block.bytes;
    ++stats_.cache_hits;
  } else {
    const std::size_t segment_bytes = cache_->segment_bytes(nbytes);
    const std::vector<detail::Segment> trimmed = trim_cache_locked(segment_bytes, nbytes);
    lock.unlock();  // the OS/driver calls may be slow; accounting below happens under the lock again
    free_segments(trimmed);
    void* segment = allocate_segment(segment_bytes, nbytes, category);
    lock.lock();
    block = cache_->add_segment(segment, segment_bytes, nbytes, stream);
    stats_.reserved_bytes += segment_bytes;
    stats_.reserved_peak_bytes = std::max(stats_.reserved_peak_bytes, stats_.reserved_bytes);
    stats_.cached_bytes += segment_bytes - block.bytes;  // the segment's tail, if split off, is free cache
  }
  ++stats_.num_allocs;
  stats_.allocated_bytes += nbytes;
  auto& cs = stats_.by_category[static_cast<int>(category)];
  cs.live_bytes += nbytes;
  cs.peak_bytes = std::max(cs.peak_bytes, cs.live_bytes);
  ++cs.live_blocks;
  stats_.live_bytes += nbytes;
  if (stats_.live_bytes > stats_.peak_bytes) {
    stats_.peak_bytes = stats_.live_bytes;
    for (auto& c : stats_.by_category) c.at_total_peak = c.live_bytes;
  }
  notify_observer_locked();
  return Block{block.ptr, nbytes, block.bytes, category, stream};
}

void* Allocator::allocate_segment(std::size_t segment_bytes, std::size_t nbytes, MemoryCategory category) {
  void* segment = nullptr;
  try {
    segment = source_->raw_allocate(segment_bytes);
  } catch (const Error& first) {
    std::vector<detail::Segment> released;
    {
      std::lock_guard lock(mutex_);
      released = release_free_segments_locked();
    }
    free_segments(released);
    std::size_t released_bytes = 0;
    for (const auto& s : released) released_bytes += s.bytes;
    const std::string retry = released.empty() ? std::string("no free cache to release")
                                               : fmt::format("released {} of free cache and retried",
                                                             human_bytes(released_bytes));
    // The source's message names its own call (cudaMalloc of the segment size); say what was asked for.
    auto out_of_memory = [&](const Error& cause) {
      std::lock_guard lock(mutex_);
      return Error(fmt::format("allocator({}): out of memory allocating {} bytes of {} (a {}-byte segment; {}; "
                               "{} still reserved): {}",
                               device_.str(), nbytes, category_name(category), segment_bytes, retry,
                               human_bytes(stats_.reserved_bytes), cause.what()));
    };
    if (released.empty()) throw out_of_memory(first);
    // Retry once with the cache handed back: the failure may have been memory we were only caching.
    try {
      segment = source_->raw_allocate(segment_bytes);
    } catch (const Error& second) {
      throw out_of_memory(second);
    }
  }
  const std::size_t alignment = cache_->segment_alignment();
  if (reinterpret_cast<std::uintptr_t>(segment) % alignment != 0) {
    source_->raw_free(segment, segment_bytes);
    detail::throw_error("Allocator::allocate",
                        fmt::format("allocator({}): the memory source returned {}, not {}-byte aligned",
                                    device_.str(), fmt::ptr(segment), alignment));
  }
  return segment;
}

void Allocator::deallocate(const Block& block) {
  if (block.ptr == nullptr) return;
  std::lock_guard lock(mutex_);
  cache_->give_back(block.ptr, block.class_bytes, block.stream);  // throws on a foreign or double-freed block
  auto& cs = stats_.by_category[static_cast<int>(block.category)];
  cs.live_bytes -= block.nbytes;
  --cs.live_blocks;
  stats_.live_bytes -= block.nbytes;
  stats_.cached_bytes += block.class_bytes;
  notify_observer_locked();
}

void Allocator::recategorize(Block& block, MemoryCategory category) {
  if (block.ptr == nullptr || block.category == category) return;
  std::lock_guard lock(mutex_);
  auto& from = stats_.by_category[static_cast<int>(block.category)];
  auto& to = stats_.by_category[static_cast<int>(category)];
  MT_CHECK(from.live_blocks > 0 && from.live_bytes >= block.nbytes, "Allocator::recategorize",
           "allocator({}): a block of {} bytes is not live under {}", device_.str(), block.nbytes,
           category_name(block.category));
  from.live_bytes -= block.nbytes;
  --from.live_blocks;
  to.live_bytes += block.nbytes;
  to.peak_bytes = std::max(to.peak_bytes, to.live_bytes);
  ++to.live_blocks;
  // At the total peak now (an op output just made): the peak's make-up is what these bytes turned out to be.
  if (stats_.live_bytes == stats_.peak_bytes) {
    for (auto& c : stats_.by_category) c.at_total_peak = c.live_bytes;
  }
  block.category = category;
  notify_observer_locked();
}

void Allocator::notify_observer_locked() const {
  if (!observer_) return;
  std::array<std::size_t, kNumMemoryCategories> live{};
  for (int i = 0; i < kNumMemoryCategories; ++i) live[i] = stats_.by_category[i].live_bytes;
  observer_(live);
}

void Allocator::set_observer(Observer observer) {
  std::lock_guard lock(mutex_);
  observer_ = std::move(observer);
}

MemoryStats Allocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void Allocator::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak_bytes = stats_.live_bytes;
  stats_.reserved_peak_bytes = stats_.reserved_bytes;
  for (auto& c : stats_.by_category) {
    c.peak_bytes = c.live_bytes;
    c.at_total_peak = c.live_bytes;
  }
}

std::vector<detail::Segment> Allocator::release_free_segments_locked(std::size_t at_least) {
  std::vector<detail::Segment> segments = cache_->release_free_segments(at_least);
  for (const auto& s : segments) {
    stats_.reserved_bytes -= s.bytes;
    stats_.cached_bytes -= s.bytes;
  }
  return segments;
}

std::vector<detail::Segment> Allocator::trim_cache_locked(std::size_t segment_bytes, std::size_t nbytes) {
  if (!reserve_limit_ || stats_.cached_bytes == 0) return {};
  const double peak = static_cast<double>(std::max(stats_.peak_bytes, stats_.live_bytes + nbytes));
  auto limit = static_cast<std::size_t>(*reserve_limit_ * peak);
  if (reserve_slack_) limit = std::min(limit, static_cast<std::size_t>(peak) + *reserve_slack_);
  const std::size_t wanted = stats_.reserved_bytes + segment_bytes;
  if (wanted <= limit) return {};
  return release_free_segments_locked(wanted - limit);
}

void Allocator::free_segments(const std::vector<detail::Segment>& segments) {
  for (const auto& s : segments) source_->raw_free(s.ptr, s.bytes);
}

void Allocator::empty_cache() {
  std::vector<detail::Segment> segments;
  {
    std::lock_guard lock(mutex_);
    segments = release_free_segments_locked();
  }
  free_segments(segments);  // outside the lock: cudaFree waits for the device
}

void Allocator::set_cache_policy(CachePolicy policy) {
  std::vector<detail::Segment> segments;
  {
    std::lock_guard lock(mutex_);
    if (policy == policy_) return;
    std::size_t blocks = 0;
    for (const CategoryStats& c : stats_.by_category) blocks += c.live_blocks;
    MT_CHECK(blocks == 0, "Allocator::set_cache_policy", "allocator({}) has {} blocks ({} bytes) in use, laid out by "
             "its current policy; free them first", device_.str(), blocks, stats_.live_bytes);
    segments = release_free_segments_locked();
    policy_ = policy;
    cache_ = make_cache(policy);
    reserve_limit_ = default_reserve_limit(policy);
    reserve_slack_ = default_reserve_slack(policy);
  }
  free_segments(segments);
}

CachePolicy Allocator::cache_policy() const {
  std::lock_guard lock(mutex_);
  return policy_;
}

CachePolicyGuard::CachePolicyGuard(Allocator& allocator, CachePolicy policy)
    : allocator_(allocator), previous_(allocator.cache_policy()) {
  allocator_.set_cache_policy(policy);
}

CachePolicyGuard::~CachePolicyGuard() {
  try {
    allocator_.set_cache_policy(previous_);
  } catch (const Error&) {
    // A block outlived the scope: it stays under the policy that laid it out.
  }
}

void Allocator::set_budget(std::optional<std::size_t> bytes) {
  std::lock_guard lock(mutex_);
  budget_ = bytes;
}

std::optional<std::size_t> Allocator::budget() const {
  std::lock_guard lock(mutex_);
  return budget_;
}

void Allocator::set_reserve_limit(std::optional<double> ratio_of_live_peak, std::optional<std::size_t> max_above_peak) {
  MT_CHECK(!ratio_of_live_peak || *ratio_of_live_peak >= 1.0, "Allocator::set_reserve_limit",
           "allocator({}): the reserve limit is a multiple of the live peak, >= 1; got {}", device_.str(),
           ratio_of_live_peak.value_or(0.0));
  MT_CHECK(ratio_of_live_peak || !max_above_peak, "Allocator::set_reserve_limit",
           "allocator({}): a byte cap above the live peak needs a ratio too (no limit means none)", device_.str());
  std::lock_guard lock(mutex_);
  reserve_limit_ = ratio_of_live_peak;
  reserve_slack_ = max_above_peak;
}

std::optional<double> Allocator::reserve_limit() const {
  std::lock_guard lock(mutex_);
  return reserve_limit_;
}

std::optional<std::size_t> Allocator::reserve_slack() const {
  std::lock_guard lock(mutex_);
  return reserve_slack_;
}

std::string Allocator::report() const {
  std::lock_guard lock(mutex_);
  return report_locked();
}

std::string Allocator::report_locked() const {
  std::string out = fmt::format("memory report ({})\n", device_.str());
  out += fmt::format("  {:<16} {:>12} {:>12} {:>12} {:>8}\n", "category", "live", "peak", "at peak", "blocks");
  for (int i = 0; i < kNumMemoryCategories; ++i) {
    const auto& c = stats_.by_category[i];
    out += fmt::format("  {:<16} {:>12} {:>12} {:>12} {:>8}\n", category_name(static_cast<MemoryCategory>(i)),
                       human_bytes(c.live_bytes), human_bytes(c.peak_bytes), human_bytes(c.at_total_peak),
                       c.live_blocks);
  }
  out += fmt::format("  {:<16} {:>12} {:>12}\n", "total", human_bytes(stats_.live_bytes),
                     human_bytes(stats_.peak_bytes));
  out += fmt::format("  reserved {} (cache {}), {} allocations, {} from cache", human_bytes(stats_.reserved_bytes),
                     human_bytes(stats_.cached_bytes), stats_.num_allocs, stats_.cache_hits);
  if (budget_) out += fmt::format(", budget {}", human_bytes(*budget_));
  out += "\n";
  return out;
}

std::string memory_report(Device device) { return Allocator::get(device).report(); }
MemoryStats memory_stats(Device device) { return Allocator::get(device).stats(); }

}  // namespace memtrain

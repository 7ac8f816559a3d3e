// Caching allocator with per-category accounting. See include/memtrain/core/allocator.h.
#include "memtrain/core/allocator.h"

#include "memtrain/core/error.h"
#include "memtrain/cuda/cuda.h"

#include <algorithm>
#include <cstdlib>
#include <new>

namespace memtrain {

namespace {

thread_local MemoryCategory t_category = MemoryCategory::other;

// Host memory: 64-byte aligned. Pages are touched by whoever writes first; the cache keeps them mapped.
class HostMemorySource final : public MemorySource {
 public:
  void* raw_allocate(std::size_t nbytes) override {
    void* p = std::aligned_alloc(64, nbytes);
    if (p == nullptr) throw Error(fmt::format("allocator(cpu): out of host memory allocating {} bytes", nbytes));
    return p;
  }
  void raw_free(void* ptr, std::size_t) override { std::free(ptr); }
};

using SourceFactory = std::unique_ptr<MemorySource> (*)(int);
SourceFactory& cuda_factory() {
  static SourceFactory f = nullptr;
  return f;
}

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

CategoryGuard::CategoryGuard(MemoryCategory c) : previous_(t_category) { t_category = c; }
CategoryGuard::~CategoryGuard() { t_category = previous_; }
MemoryCategory current_category() { return t_category; }

void register_memory_source_factory(DeviceType type, std::unique_ptr<MemorySource> (*factory)(int)) {
  MT_CHECK(type == DeviceType::cuda, "register_memory_source_factory", "only CUDA sources can be registered");
  cuda_factory() = factory;
}

Allocator::Allocator(Device device, std::unique_ptr<MemorySource> source)
    : device_(device), source_(std::move(source)) {}

Allocator::~Allocator() {
  // Blocks still live at exit belong to static tensors; only the cache is ours to return.
  empty_cache();
}

Allocator& Allocator::get(Device device) {
  if (device.is_cpu()) {
    // Leaked on purpose: tensors in other static objects may be freed after this one would be destroyed.
    static Allocator* cpu = new Allocator(Device::cpu(), std::make_unique<HostMemorySource>());
    return *cpu;
  }
  constexpr int kMaxCudaDevices = 64;
  MT_CHECK(device.index >= 0 && device.index < kMaxCudaDevices, "Allocator::get", "bad device index {}",
           device.index);
  // Asking the backend first registers its memory source (a static library may drop static initialisers).
  MT_CHECK(cuda::is_available(), "Allocator::get", "no memory for {}: {}", device.str(), cuda::unavailable_reason());
  static std::mutex mutex;
  static Allocator* cuda_allocators[kMaxCudaDevices] = {};
  std::lock_guard lock(mutex);
  if (cuda_allocators[device.index] == nullptr) {
    MT_CHECK(cuda_factory() != nullptr, "Allocator::get", "no memory source registered for {}", device.str());
    cuda_allocators[device.index] = new Allocator(device, cuda_factory()(device.index));
  }
  return *cuda_allocators[device.index];
}

std::size_t Allocator::size_class(std::size_t nbytes) {
  // 64-byte granularity up to 4 KiB, then 8 classes per power of two (<= 12.5% waste).
  constexpr std::size_t kSmall = 4096;
  if (nbytes <= kSmall) return std::max<std::size_t>(64, (nbytes + 63) & ~std::size_t{63});
  std::size_t pow2 = std::size_t{1} << (63 - __builtin_clzll(nbytes - 1));  // largest power of two < nbytes
  std::size_t step = pow2 / 8;
  return (nbytes + step - 1) / step * step;
}

Block Allocator::allocate(std::size_t nbytes, MemoryCategory category) {
  const std::size_t cls = size_class(nbytes);
  std::unique_lock lock(mutex_);
  if (budget_ && stats_.live_bytes + nbytes > *budget_) {
    const std::string msg = fmt::format(
        "allocator({}): allocating {} of {} would exceed the budget of {} ({} live)\n{}", device_.str(),
        human_bytes(nbytes), category_name(category), human_bytes(*budget_), human_bytes(stats_.live_bytes),
        report_locked());
    throw OutOfBudget(msg);
  }
  void* ptr = nullptr;
  auto it = cache_.find(cls);
  if (it != cache_.end()) {
    ptr = it->second;
    cache_.erase(it);
    stats_.cached_bytes -= cls;
    ++stats_.cache_hits;
  } else {
    lock.unlock();  // the OS/driver call may be slow; accounting below happens under the lock again
    try {
      ptr = source_->raw_allocate(cls);
    } catch (const Error&) {
      lock.lock();
      if (cache_.empty()) throw;
      lock.unlock();
      empty_cache();  // retry once with the cache handed back
      ptr = source_->raw_allocate(cls);
    }
    lock.lock();
    stats_.reserved_bytes += cls;
  }
  ++stats_.num_allocs;
  auto& cs = stats_.by_category[static_cast<int>(category)];
  cs.live_bytes += nbytes;
  cs.peak_bytes = std::max(cs.peak_bytes, cs.live_bytes);
  ++cs.live_blocks;
  stats_.live_bytes += nbytes;
  if (stats_.live_bytes > stats_.peak_bytes) {
    stats_.peak_bytes = stats_.live_bytes;
    for (auto& c : stats_.by_category) c.at_total_peak = c.live_bytes;
  }
  return Block{ptr, nbytes, cls, category};
}

void Allocator::deallocate(const Block& block) {
  if (block.ptr == nullptr) return;
  std::lock_guard lock(mutex_);
  auto& cs = stats_.by_category[static_cast<int>(block.category)];
  cs.live_bytes -= block.nbytes;
  --cs.live_blocks;
  stats_.live_bytes -= block.nbytes;
  cache_.emplace(block.class_bytes, block.ptr);
  stats_.cached_bytes += block.class_bytes;
}

MemoryStats Allocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void Allocator::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak_bytes = stats_.live_bytes;
  for (auto& c : stats_.by_category) {
    c.peak_bytes = c.live_bytes;
    c.at_total_peak = c.live_bytes;
  }
}

void Allocator::empty_cache() {
  std::multimap<std::size_t, void*> cache;
  {
    std::lock_guard lock(mutex_);
    cache.swap(cache_);
    stats_.reserved_bytes -= stats_.cached_bytes;
    stats_.cached_bytes = 0;
  }
  for (auto& [bytes, ptr] : cache) source_->raw_free(ptr, bytes);
}

void Allocator::set_budget(std::optional<std::size_t> bytes) {
  std::lock_guard lock(mutex_);
  budget_ = bytes;
}

std::optional<std::size_t> Allocator::budget() const {
  std::lock_guard lock(mutex_);
  return budget_;
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

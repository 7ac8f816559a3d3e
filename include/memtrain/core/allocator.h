// Memory accounting. Every allocation of tensor bytes goes through the Allocator of its device and is
// tagged with a MemoryCategory taken from the innermost CategoryGuard on the calling thread. The
// allocator keeps, per category and in total: live bytes (exactly the bytes tensors asked for), peak
// bytes, and what was live per category at the moment of the total peak. Freed blocks are cached by
// size class and reused, so steady-state training touches no fresh pages; the cache shows up as
// "reserved" in the report. An optional byte budget turns an overrun into OutOfBudget with the report.
#pragma once

#include "memtrain/core/device.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace memtrain {

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
class CategoryGuard {
 public:
  explicit CategoryGuard(MemoryCategory c);
  ~CategoryGuard();
  CategoryGuard(const CategoryGuard&) = delete;
  CategoryGuard& operator=(const CategoryGuard&) = delete;

 private:
  MemoryCategory previous_;
};
MemoryCategory current_category();  // MemoryCategory::other when no guard is active

// Where raw bytes come from for one device kind: host memory, CUDA memory, ...
class MemorySource {
 public:
  virtual ~MemorySource() = default;
  virtual void* raw_allocate(std::size_t nbytes) = 0;  // 64-byte aligned at least; throws on failure
  virtual void raw_free(void* ptr, std::size_t nbytes) = 0;
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
  std::size_t reserved_bytes = 0;  // bytes held from the OS/driver: live blocks + cache (size-class rounded)
  std::size_t cached_bytes = 0;    // bytes in the cache, ready for reuse
  std::size_t num_allocs = 0;      // allocations served
  std::size_t cache_hits = 0;      // of those, served from the cache
  const CategoryStats& operator[](MemoryCategory c) const { return by_category[static_cast<int>(c)]; }
};

// One allocation handed out by an Allocator. Returned to it by Allocator::deallocate.
struct Block {
  void* ptr = nullptr;
  std::size_t nbytes = 0;      // bytes asked for (what accounting counts)
  std::size_t class_bytes = 0; // bytes actually reserved (size class)
  MemoryCategory category = MemoryCategory::other;
};

class Allocator {
 public:
  Allocator(Device device, std::unique_ptr<MemorySource> source);
  ~Allocator();

  // The allocator of a device. CPU always exists; CUDA exists when built with CUDA.
  static Allocator& get(Device device);

  Block allocate(std::size_t nbytes, MemoryCategory category);
  Block allocate(std::size_t nbytes) { return allocate(nbytes, current_category()); }
  void deallocate(const Block& block);

  MemoryStats stats() const;
  const Device& device() const { return device_; }
  void reset_peak();     // peaks restart from the current live bytes
  void empty_cache();    // hand cached blocks back to the OS/driver
  void set_budget(std::optional<std::size_t> bytes);  // live-bytes budget; nullopt = unlimited
  std::optional<std::size_t> budget() const;

  // Human-readable table: category, live, peak, at-peak; then total, reserved, cache.
  std::string report() const;

  // Rounds a request to the size class the cache keys on (>= nbytes, multiple of 64).
  static std::size_t size_class(std::size_t nbytes);

 private:
  std::string report_locked() const;

  Device device_;
  std::unique_ptr<MemorySource> source_;
  mutable std::mutex mutex_;
  MemoryStats stats_;
  std::optional<std::size_t> budget_;
  std::multimap<std::size_t, void*> cache_;  // size class -> free block
};

// Shortcut for the CPU allocator's report / stats.
std::string memory_report(Device device = Device::cpu());
MemoryStats memory_stats(Device device = Device::cpu());

// Registers the source for CUDA devices (done by the CUDA backend at startup when built with CUDA).
void register_memory_source_factory(DeviceType type, std::unique_ptr<MemorySource> (*factory)(int index));

}  // namespace memtrain

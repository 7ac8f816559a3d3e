// Byte accounting of code run on the CPU and on the meta device, for the meta tests (tests/test_meta*.cpp).
#pragma once

#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"

#include <gtest/gtest.h>

#include <array>
#include <functional>
#include <string>

namespace memtrain::test_support {

// Per category: bytes above what was live before fn, at their peak and at the end.
struct Footprint {
  std::array<std::size_t, kNumMemoryCategories> peak{}, live{};
  std::size_t total_peak = 0;
};

inline Footprint measure(Device device, const std::function<void(Device)>& fn) {
  Allocator& alloc = Allocator::get(device);
  const MemoryStats before = alloc.stats();
  alloc.reset_peak();
  fn(device);
  const MemoryStats after = alloc.stats();
  Footprint f;
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    f.peak[c] = after.by_category[c].peak_bytes - before.by_category[c].live_bytes;
    f.live[c] = after.by_category[c].live_bytes - before.by_category[c].live_bytes;
  }
  f.total_peak = after.peak_bytes - before.live_bytes;
  return f;
}

// Runs fn on the CPU and on meta (same seed) and expects the same bytes in every category and the RNG
// stream in the same place after both; returns the CPU's footprint.
inline Footprint expect_same_footprint(const std::string& what, const std::function<void(Device)>& fn) {
  manual_seed(11);
  const Footprint cpu = measure(Device::cpu(), fn);
  const RngState after_cpu = get_rng_state();
  manual_seed(11);
  const Footprint meta = measure(Device::meta(), fn);
  EXPECT_EQ(get_rng_state(), after_cpu) << what << ": meta must consume the RNG stream as the CPU does";
  EXPECT_GT(cpu.total_peak, 0u) << what << ": the case allocates nothing, so it proves nothing";
  EXPECT_EQ(meta.total_peak, cpu.total_peak) << what;
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    const auto name = category_name(static_cast<MemoryCategory>(c));
    EXPECT_EQ(meta.peak[c], cpu.peak[c]) << what << ": peak " << name;
    EXPECT_EQ(meta.live[c], cpu.live[c]) << what << ": live " << name;
  }
  return cpu;
}

}  // namespace memtrain::test_support

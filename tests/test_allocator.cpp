// Memory accounting: exact byte counts per category, peaks, the snapshot at the peak, the budget error,
// alignment and cache reuse.
#include "memtrain/memtrain.h"

#include <gtest/gtest.h>

#include <cstdint>

using namespace memtrain;

namespace {

// Live bytes of one category on the CPU allocator.
std::size_t live(MemoryCategory c) { return memory_stats()[c].live_bytes; }

TEST(Allocator, CountsExactBytesOfKnownTensorsPerCategory) {
  const std::size_t params0 = live(MemoryCategory::parameters), acts0 = live(MemoryCategory::activations);
  {
    CategoryGuard g(MemoryCategory::parameters);
    Tensor w = zeros({3, 5}, DType::f32);  // 60 bytes
    Tensor b = zeros({7}, DType::bf16);    // 14 bytes
    EXPECT_EQ(live(MemoryCategory::parameters) - params0, 60u + 14u);
    {
      CategoryGuard inner(MemoryCategory::activations);
      Tensor a = zeros({2, 3, 4}, DType::f64);  // 192 bytes
      EXPECT_EQ(live(MemoryCategory::activations) - acts0, 192u);
      Tensor view = a.transpose(0, 2);  // a view allocates nothing
      EXPECT_EQ(live(MemoryCategory::activations) - acts0, 192u);
    }
    EXPECT_EQ(live(MemoryCategory::activations), acts0);
    // Back in the outer guard's category.
    Tensor c = zeros({1}, DType::i64);
    EXPECT_EQ(live(MemoryCategory::parameters) - params0, 60u + 14u + 8u);
  }
  EXPECT_EQ(live(MemoryCategory::parameters), params0);
}

TEST(Allocator, DefaultCategoryIsOther) {
  EXPECT_EQ(current_category(), MemoryCategory::other);
  const std::size_t before = live(MemoryCategory::other);
  Tensor t = zeros({10}, DType::u8);
  EXPECT_EQ(live(MemoryCategory::other) - before, 10u);
}

TEST(Allocator, TracksPeakAndWhatWasLiveAtThePeak) {
  Allocator& alloc = Allocator::get(Device::cpu());
  alloc.reset_peak();
  const MemoryStats base = alloc.stats();
  {
    CategoryGuard g(MemoryCategory::workspace);
    Tensor a = Tensor::empty({1000}, DType::f32);  // 4000
    {
      CategoryGuard d(MemoryCategory::data);
      Tensor b = Tensor::empty({500}, DType::f64);  // 4000
      const MemoryStats s = alloc.stats();
      EXPECT_EQ(s.peak_bytes - base.live_bytes, 8000u);
    }
    Tensor c = Tensor::empty({100}, DType::f32);  // 400: total stays below the previous peak
  }
  const MemoryStats s = alloc.stats();
  EXPECT_EQ(s.peak_bytes - base.live_bytes, 8000u);
  EXPECT_EQ(s[MemoryCategory::workspace].at_total_peak - base[MemoryCategory::workspace].live_bytes, 4000u);
  EXPECT_EQ(s[MemoryCategory::data].at_total_peak - base[MemoryCategory::data].live_bytes, 4000u);
  EXPECT_EQ(s[MemoryCategory::workspace].peak_bytes - base[MemoryCategory::workspace].live_bytes, 4400u);
  EXPECT_EQ(s.live_bytes, base.live_bytes);
}

TEST(Allocator, BudgetOverrunThrowsWithTheReport) {
  Allocator& alloc = Allocator::get(Device::cpu());
  const std::size_t base = alloc.stats().live_bytes;
  alloc.set_budget(base + 1000);
  CategoryGuard g(MemoryCategory::activations);
  Tensor ok = Tensor::empty({250}, DType::f32);  // exactly at the budget
  try {
    Tensor too_much = Tensor::empty({1}, DType::f32);
    alloc.set_budget(std::nullopt);
    FAIL() << "expected OutOfBudget";
  } catch (const OutOfBudget& e) {
    alloc.set_budget(std::nullopt);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("exceed the budget"), std::string::npos) << msg;
    EXPECT_NE(msg.find("activations"), std::string::npos) << msg;
    EXPECT_NE(msg.find("memory report"), std::string::npos) << msg;
  }
  alloc.set_budget(std::nullopt);
  EXPECT_EQ(alloc.stats().live_bytes, base + 1000);
}

TEST(Allocator, BlocksAre64ByteAlignedAndCachedForReuse) {
  Allocator& alloc = Allocator::get(Device::cpu());
  void* first = nullptr;
  {
    Tensor a = Tensor::empty({12345}, DType::f32);
    first = a.data_ptr();
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(first) % 64, 0u);
  }
  const MemoryStats before = alloc.stats();
  Tensor b = Tensor::empty({12345}, DType::f32);
  const MemoryStats after = alloc.stats();
  EXPECT_EQ(b.data_ptr(), first);  // served from the cache, no fresh pages
  EXPECT_EQ(after.cache_hits, before.cache_hits + 1);
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
  for (std::size_t n : {1u, 63u, 64u, 65u, 4096u, 4097u, 1u << 20, (1u << 20) + 1}) {
    const std::size_t cls = Allocator::size_class(n);
    EXPECT_GE(cls, n);
    EXPECT_EQ(cls % 64, 0u);
    EXPECT_LE(cls, n + n / 8 + 64) << n;  // at most 12.5% rounding waste past the small sizes
  }
}

TEST(Allocator, EmptyCacheReturnsCachedBytes) {
  Allocator& alloc = Allocator::get(Device::cpu());
  { Tensor a = Tensor::empty({1 << 16}, DType::f32); }
  EXPECT_GT(alloc.stats().cached_bytes, 0u);
  alloc.empty_cache();
  const MemoryStats s = alloc.stats();
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_GE(s.reserved_bytes, s.live_bytes);
}

TEST(Allocator, ReportListsEveryCategory) {
  const std::string report = memory_report();
  for (int i = 0; i < kNumMemoryCategories; ++i)
    EXPECT_NE(report.find(category_name(static_cast<MemoryCategory>(i))), std::string::npos) << report;
  EXPECT_NE(report.find("reserved"), std::string::npos);
}

TEST(Allocator, CudaAllocatorIsUnavailableWithoutADevice) {
  if (cuda::is_available()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_THROW(zeros({4}, DType::f32, Device::cuda(0)), Error);
}

}  // namespace

// The device cache policy (CachePolicy::segments, src/core/segment_pool.h) on the CPU: an Allocator for
// cuda:0 built directly over a fake MemorySource that hands out real, 256-byte aligned host memory and
// records every segment. Checks splitting, coalescing, best fit, that live blocks never overlap, what
// empty_cache() releases, the out-of-memory retry, and that the accounting and budget are those of the
// CPU allocator. The last tests run the real cuda:0 allocator and skip without a device.
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/cuda/cuda.h"

#include "core/segment_pool.h"
#ifdef MEMTRAIN_HAVE_CUDA
#include "cuda/device_ops.h"  // the backend's raw fill, for the tests on a real device
#include "cuda_test_util.h"
#endif

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace memtrain {
namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;

std::size_t round512(std::size_t n) { return std::max<std::size_t>(512, (n + 511) / 512 * 512); }

// What the fake source holds; shared with the test, which outlives or not the Allocator that owns the source.
struct FakeMemory {
  std::map<char*, std::size_t> segments;  // base -> bytes, as handed out
  std::size_t capacity = std::numeric_limits<std::size_t>::max();
  std::size_t allocations = 0, failures = 0;

  std::size_t held() const {
    std::size_t sum = 0;
    for (const auto& [p, n] : segments) sum += n;
    return sum;
  }
  // The segment holding [p, p + n), or nullptr when no single segment does.
  char* segment_of(const void* p, std::size_t n) const {
    const char* c = static_cast<const char*>(p);
    auto it = segments.upper_bound(const_cast<char*>(c));
    if (it == segments.begin()) return nullptr;
    --it;
    return c + n <= it->first + it->second ? it->first : nullptr;
  }
  ~FakeMemory() {
    for (const auto& [p, n] : segments) std::free(p);  // blocks a failed test left live
  }
};

class FakeSource final : public MemorySource {
 public:
  explicit FakeSource(std::shared_ptr<FakeMemory> memory) : memory_(std::move(memory)) {}
  void* raw_allocate(std::size_t nbytes) override {
    if (memory_->held() + nbytes > memory_->capacity) {
      ++memory_->failures;
      throw Error(fmt::format("fakeMalloc of {} bytes: out of fake device memory", nbytes));
    }
    // aligned_alloc wants a size that is a multiple of the alignment; segments of 2 MiB already are.
    char* p = static_cast<char*>(std::aligned_alloc(256, (nbytes + 255) / 256 * 256));
    if (p == nullptr) throw Error("fakeMalloc: host out of memory");
    memory_->segments.emplace(p, nbytes);
    ++memory_->allocations;
    return p;
  }
  void raw_free(void* ptr, std::size_t nbytes) override {
    auto it = memory_->segments.find(static_cast<char*>(ptr));
    if (it == memory_->segments.end() || it->second != nbytes) {
      ADD_FAILURE() << "raw_free of a segment the source did not hand out: " << ptr << " " << nbytes;
      return;
    }
    memory_->segments.erase(it);
    std::free(ptr);
  }

 private:
  std::shared_ptr<FakeMemory> memory_;
};

struct FakeDevice {
  std::shared_ptr<FakeMemory> memory = std::make_shared<FakeMemory>();
  Allocator alloc{Device::cuda(0), std::make_unique<FakeSource>(memory)};  // default policy for a device
};

// reserved = what the source holds; reserved - cached = the bytes of the blocks in use.
void expect_consistent(const FakeDevice& d, std::size_t live_requested, std::size_t live_block_bytes) {
  const MemoryStats s = d.alloc.stats();
  EXPECT_EQ(s.live_bytes, live_requested);
  EXPECT_EQ(s.reserved_bytes, d.memory->held());
  EXPECT_EQ(s.reserved_bytes - s.cached_bytes, live_block_bytes);
}

TEST(DeviceAllocator, OneSegmentServesManySmallRequests) {
  FakeDevice d;
  std::vector<Block> blocks;
  std::size_t requested = 0, block_bytes = 0;
  for (std::size_t i = 0; i < 100; ++i) {
    const std::size_t n = 1 + i * 157;  // 1 B .. ~15 KiB, 100 of them: about 800 KiB in all
    blocks.push_back(d.alloc.allocate(n, MemoryCategory::activations));
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(blocks.back().ptr) % 256, 0u);
    EXPECT_EQ(blocks.back().class_bytes, round512(n));
    requested += n;
    block_bytes += blocks.back().class_bytes;
  }
  EXPECT_EQ(d.memory->segments.size(), 1u);
  EXPECT_EQ(d.alloc.stats().reserved_bytes, 2 * MiB);
  EXPECT_EQ(d.alloc.stats().cache_hits, 99u);  // all but the first came out of the segment
  EXPECT_EQ(d.alloc.stats().num_allocs, 100u);
  expect_consistent(d, requested, block_bytes);
  for (const Block& b : blocks) d.alloc.deallocate(b);
  expect_consistent(d, 0, 0);
  EXPECT_EQ(d.alloc.stats().cached_bytes, 2 * MiB);
}

// Four blocks that exactly tile one segment, freed in every order tried; the merged segment then serves
// a request as big as all four together without asking the source again.
TEST(DeviceAllocator, FreedNeighboursCoalesceInAnyOrder) {
  const std::vector<std::vector<int>> orders = {{0, 1, 2, 3}, {3, 2, 1, 0}, {0, 2, 1, 3}, {1, 3, 0, 2}, {2, 0, 3, 1}};
  for (const auto& order : orders) {
    FakeDevice d;
    {  // large pool: an 8 MiB segment cut into 4 x 2 MiB
      const Block whole = d.alloc.allocate(8 * MiB);
      d.alloc.deallocate(whole);
      std::vector<Block> parts;
      for (int i = 0; i < 4; ++i) parts.push_back(d.alloc.allocate(2 * MiB));
      ASSERT_EQ(d.memory->segments.size(), 1u);
      for (int i = 0; i < 4; ++i) EXPECT_EQ(parts[i].ptr, static_cast<char*>(whole.ptr) + i * 2 * MiB);
      for (int i : order) d.alloc.deallocate(parts[i]);
      const Block again = d.alloc.allocate(8 * MiB);
      EXPECT_EQ(again.ptr, whole.ptr);
      EXPECT_EQ(d.memory->allocations, 1u);
      d.alloc.deallocate(again);
    }
    {  // small pool: a 2 MiB segment cut into 4 x 512 KiB; the middle two merge into 1 MiB
      std::vector<Block> parts;
      for (int i = 0; i < 4; ++i) parts.push_back(d.alloc.allocate(512 * KiB));
      ASSERT_EQ(d.memory->segments.size(), 2u);
      d.alloc.deallocate(parts[1]);
      d.alloc.deallocate(parts[2]);
      const Block mid = d.alloc.allocate(MiB);
      EXPECT_EQ(mid.ptr, parts[1].ptr);
      d.alloc.deallocate(mid);
      for (int i : {0, 3}) d.alloc.deallocate(parts[i]);
      for (int i : order) parts[i] = d.alloc.allocate(512 * KiB);
      for (int i : order) d.alloc.deallocate(parts[i]);
      const Block top = d.alloc.allocate(MiB);  // the largest small request, from the merged segment
      EXPECT_EQ(d.memory->allocations, 2u);
      d.alloc.deallocate(top);
    }
    expect_consistent(d, 0, 0);
    d.alloc.empty_cache();
    EXPECT_TRUE(d.memory->segments.empty());
  }
}

TEST(DeviceAllocator, ServesTheSmallestFreeBlockThatFits) {
  FakeDevice d;
  // Free holes of 64, 16 and 32 KiB, kept apart by live 4 KiB blocks; the segment's tail is free too.
  const Block a = d.alloc.allocate(64 * KiB), s1 = d.alloc.allocate(4 * KiB);
  const Block c = d.alloc.allocate(16 * KiB), s2 = d.alloc.allocate(4 * KiB);
  const Block e = d.alloc.allocate(32 * KiB), s3 = d.alloc.allocate(4 * KiB);
  d.alloc.deallocate(a);
  d.alloc.deallocate(c);
  d.alloc.deallocate(e);
  const Block x = d.alloc.allocate(10 * KiB);
  EXPECT_EQ(x.ptr, c.ptr);  // 16 KiB is the tightest fit
  EXPECT_EQ(x.class_bytes, 10 * KiB);
  const Block y = d.alloc.allocate(6 * KiB);
  EXPECT_EQ(y.ptr, static_cast<char*>(c.ptr) + 10 * KiB);  // the 6 KiB left of that hole, exactly
  const Block z = d.alloc.allocate(20 * KiB);
  EXPECT_EQ(z.ptr, e.ptr);
  const Block w = d.alloc.allocate(64 * KiB);
  EXPECT_EQ(w.ptr, a.ptr);
  const Block v = d.alloc.allocate(100 * KiB);
  EXPECT_GT(v.ptr, s3.ptr);  // no hole fits: the tail
  EXPECT_EQ(d.memory->allocations, 1u);
  for (const Block& b : {s1, s2, s3, x, y, z, w, v}) d.alloc.deallocate(b);
  expect_consistent(d, 0, 0);
}

TEST(DeviceAllocator, LargeBlocksSplitOnlyWhenMoreThanOneMiBRemains) {
  FakeDevice d;
  const Block big = d.alloc.allocate(3 * MiB);  // a 4 MiB segment; the 1 MiB tail stays with the block
  EXPECT_EQ(d.memory->segments.begin()->second, 4 * MiB);
  EXPECT_EQ(big.class_bytes, 4 * MiB);
  EXPECT_EQ(d.alloc.stats().cached_bytes, 0u);
  d.alloc.deallocate(big);
  const Block b2 = d.alloc.allocate(2 * MiB + 1);  // leaves 2 MiB - 512 of the 4 MiB, more than 1 MiB: split
  EXPECT_EQ(b2.class_bytes, 2 * MiB + 512);
  EXPECT_EQ(d.alloc.stats().cached_bytes, 2 * MiB - 512);
  // Small requests never come from the large pool: a new 2 MiB segment.
  const Block small = d.alloc.allocate(1000);
  EXPECT_EQ(d.memory->segments.size(), 2u);
  for (const Block& b : {b2, small}) d.alloc.deallocate(b);
  expect_consistent(d, 0, 0);
}

// 2000 random allocations and frees. Every live block must lie inside one segment, 256-byte aligned, and
// overlap no other live block; each block is filled with its own byte, checked when it is freed, so a
// block handed out twice shows up as a corrupted pattern. Accounting is checked after every step.
TEST(DeviceAllocator, RandomSequenceNeverOverlapsLiveBlocks) {
  FakeDevice d;
  std::mt19937_64 rng(1234);
  struct Live {
    Block block;
    unsigned char pattern;
  };
  std::map<char*, Live> live;  // by address
  std::size_t requested = 0, block_bytes = 0;
  auto random_size = [&]() -> std::size_t {
    const std::uint64_t r = rng() % 100;
    if (r < 5) return 0;
    if (r < 70) return 1 + rng() % (64 * KiB);
    if (r < 95) return 64 * KiB + rng() % (960 * KiB);
    return MiB + rng() % (6 * MiB);
  };
  for (int op = 0; op < 2000; ++op) {
    const bool do_free = !live.empty() && (rng() % 100 < 45 || live.size() > 200);
    if (do_free) {
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      const Live l = it->second;
      const auto* bytes = static_cast<const unsigned char*>(l.block.ptr);
      std::size_t corrupted = 0;
      for (std::size_t i = 0; i < l.block.nbytes; ++i) corrupted += bytes[i] != l.pattern;
      ASSERT_EQ(corrupted, 0u) << "op " << op << ": a block's bytes were overwritten while it was live";
      d.alloc.deallocate(l.block);
      requested -= l.block.nbytes;
      block_bytes -= l.block.class_bytes;
      live.erase(it);
    } else {
      const std::size_t n = random_size();
      const Block b = d.alloc.allocate(n, static_cast<MemoryCategory>(rng() % kNumMemoryCategories));
      char* p = static_cast<char*>(b.ptr);
      ASSERT_NE(p, nullptr);
      ASSERT_EQ(reinterpret_cast<std::uintptr_t>(p) % 256, 0u) << "op " << op;
      ASSERT_GE(b.class_bytes, std::max<std::size_t>(n, 1));
      ASSERT_NE(d.memory->segment_of(p, b.class_bytes), nullptr) << "op " << op << ": block outside every segment";
      auto next = live.lower_bound(p);
      if (next != live.end()) ASSERT_LE(p + b.class_bytes, next->first) << "op " << op << ": overlaps the next block";
      if (next != live.begin()) {
        const auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second.block.class_bytes, p) << "op " << op << ": overlaps the previous block";
      }
      const auto pattern = static_cast<unsigned char>(op % 251 + 1);
      std::memset(p, pattern, n);
      live.emplace(p, Live{b, pattern});
      requested += n;
      block_bytes += b.class_bytes;
    }
    if (op % 97 == 96) d.alloc.empty_cache();  // releases only segments with nothing live
    expect_consistent(d, requested, block_bytes);
    if (::testing::Test::HasFailure()) return;
  }
  // Splitting at work: most allocations were carved from segments already held.
  const MemoryStats s = d.alloc.stats();
  EXPECT_GT(s.cache_hits, s.num_allocs * 3 / 4) << s.cache_hits << " of " << s.num_allocs;
  for (const auto& [p, l] : live) d.alloc.deallocate(l.block);
  expect_consistent(d, 0, 0);
  d.alloc.empty_cache();
  EXPECT_TRUE(d.memory->segments.empty());
  EXPECT_EQ(d.alloc.stats().reserved_bytes, 0u);
  EXPECT_EQ(d.alloc.stats().cached_bytes, 0u);
}

// The pool alone, with its structural invariants (blocks tile segments, free neighbours merged, free
// lists in step) checked after each of 2000 random operations.
TEST(SegmentPool, InvariantsHoldThroughRandomOperations) {
  detail::SegmentPool pool;
  std::mt19937_64 rng(99);
  std::vector<detail::CachedBlock> lent;
  std::size_t next_base = 0x100000;  // fake, aligned, non-overlapping addresses: the pool never dereferences
  for (int op = 0; op < 2000; ++op) {
    if (!lent.empty() && rng() % 100 < 45) {
      const std::size_t i = rng() % lent.size();
      pool.give_back(lent[i].ptr, lent[i].bytes);
      lent.erase(lent.begin() + static_cast<long>(i));
    } else {
      const std::size_t n = rng() % 4 == 0 ? rng() % (5 * MiB) : rng() % (200 * KiB);
      detail::CachedBlock b = pool.take(n);
      if (b.ptr == nullptr) {
        const std::size_t seg = pool.segment_bytes(n);
        // Sometimes adjacent to the previous segment, as cudaMalloc may place them: merging must not cross.
        if (rng() % 2) next_base += 2 * MiB;
        b = pool.add_segment(reinterpret_cast<void*>(next_base), seg, n);
        next_base += seg;
      }
      ASSERT_GE(b.bytes, n);
      lent.push_back(b);
    }
    if (op % 50 == 49) pool.release_free_segments();
    ASSERT_NO_THROW(pool.check_invariants()) << "op " << op;
  }
  for (const auto& b : lent) pool.give_back(b.ptr, b.bytes);
  pool.release_free_segments();
  EXPECT_EQ(pool.num_segments(), 0u);
  pool.check_invariants();
}

TEST(DeviceAllocator, EmptyCacheReleasesOnlyEntirelyFreeSegments) {
  FakeDevice d;
  const Block small = d.alloc.allocate(1000);  // 2 MiB small segment
  const Block big1 = d.alloc.allocate(3 * MiB);  // its own 4 MiB segment
  const Block big2 = d.alloc.allocate(5 * MiB);  // its own 6 MiB segment
  ASSERT_EQ(d.memory->segments.size(), 3u);
  d.alloc.deallocate(big1);
  d.alloc.empty_cache();
  EXPECT_EQ(d.memory->segments.size(), 2u);
  EXPECT_EQ(d.memory->segments.count(static_cast<char*>(big1.ptr)), 0u);
  EXPECT_EQ(d.alloc.stats().reserved_bytes, 8 * MiB);
  EXPECT_EQ(d.alloc.stats().cached_bytes, 2 * MiB - 1024);  // the small segment's free tail stays
  d.alloc.deallocate(small);
  d.alloc.empty_cache();
  EXPECT_EQ(d.memory->segments.size(), 1u);
  EXPECT_EQ(d.alloc.stats().reserved_bytes, 6 * MiB);
  EXPECT_EQ(d.alloc.stats().cached_bytes, 0u);
  d.alloc.deallocate(big2);
  d.alloc.empty_cache();
  EXPECT_TRUE(d.memory->segments.empty());
  expect_consistent(d, 0, 0);
}

TEST(DeviceAllocator, OutOfMemoryReleasesTheCacheRetriesOnceThenThrows) {
  FakeDevice d;
  d.memory->capacity = 10 * MiB;
  const Block pinned = d.alloc.allocate(1000);  // keeps its 2 MiB segment in use throughout
  d.alloc.deallocate(d.alloc.allocate(6 * MiB));  // 6 MiB cached, too small for what follows
  // 7 MiB needs an 8 MiB segment: 2 + 6 + 8 > 10 fails, the cached 6 MiB goes back, 2 + 8 fits.
  const Block seven = d.alloc.allocate(7 * MiB);
  EXPECT_EQ(d.memory->failures, 1u);
  EXPECT_EQ(d.memory->segments.size(), 2u);
  expect_consistent(d, 1000 + 7 * MiB, 1024 + 8 * MiB);

  // Nothing to release: the source's failure comes back naming the request and the device.
  auto message = [&](std::size_t n) {
    try {
      d.alloc.deallocate(d.alloc.allocate(n, MemoryCategory::gradients));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  std::string msg = message(3 * MiB);
  EXPECT_NE(msg.find("3145728 bytes of gradients"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fakeMalloc of 4194304 bytes"), std::string::npos) << msg;  // the source's own words
  EXPECT_NE(msg.find("no free cache to release"), std::string::npos) << msg;
  EXPECT_EQ(d.memory->failures, 2u);

  // Cache released, retried once, still too big: throws, and the cache is gone.
  d.alloc.deallocate(seven);
  msg = message(12 * MiB);
  EXPECT_NE(msg.find("12582912 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("released 8.00 MiB of free cache and retried"), std::string::npos) << msg;
  EXPECT_EQ(d.memory->failures, 4u);  // the first try and the one retry
  EXPECT_EQ(d.memory->segments.size(), 1u);
  expect_consistent(d, 1000, 1024);

  // The failure left nothing behind: a request that fits still works.
  const Block fits = d.alloc.allocate(8 * MiB);
  expect_consistent(d, 1000 + 8 * MiB, 1024 + 8 * MiB);
  for (const Block& b : {pinned, fits}) d.alloc.deallocate(b);
}

TEST(DeviceAllocator, AccountsRequestedBytesPerCategoryAndKeepsTheBudget) {
  FakeDevice d;
  const Block p = d.alloc.allocate(1000, MemoryCategory::parameters);
  const Block g = d.alloc.allocate(3 * MiB, MemoryCategory::gradients);
  const Block a = d.alloc.allocate(777, MemoryCategory::activations);
  MemoryStats s = d.alloc.stats();
  EXPECT_EQ(s[MemoryCategory::parameters].live_bytes, 1000u);
  EXPECT_EQ(s[MemoryCategory::gradients].live_bytes, 3 * MiB);
  EXPECT_EQ(s[MemoryCategory::activations].live_bytes, 777u);
  EXPECT_EQ(s[MemoryCategory::activations].live_blocks, 1u);
  EXPECT_EQ(s.live_bytes, 1000 + 3 * MiB + 777);
  EXPECT_EQ(s.peak_bytes, s.live_bytes);
  d.alloc.deallocate(g);
  s = d.alloc.stats();
  EXPECT_EQ(s[MemoryCategory::gradients].live_bytes, 0u);
  EXPECT_EQ(s[MemoryCategory::gradients].peak_bytes, 3 * MiB);
  EXPECT_EQ(s[MemoryCategory::gradients].at_total_peak, 3 * MiB);
  expect_consistent(d, 1777, 1024 + 1024);

  // The budget counts requested bytes, not the segment rounding: 2 MiB are reserved, 1777 B live.
  d.alloc.set_budget(1777 + 5000);
  const Block ok = d.alloc.allocate(5000, MemoryCategory::workspace);  // exactly at the budget
  const std::size_t segments = d.memory->allocations;
  try {
    d.alloc.allocate(1, MemoryCategory::workspace);
    ADD_FAILURE() << "expected OutOfBudget";
  } catch (const OutOfBudget& e) {
    EXPECT_NE(std::string(e.what()).find("exceed the budget"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
  EXPECT_EQ(d.memory->allocations, segments);  // the source was not asked
  d.alloc.set_budget(std::nullopt);
  expect_consistent(d, 1777 + 5000, 1024 + 1024 + 5120);
  for (const Block& b : {p, a, ok}) d.alloc.deallocate(b);
  expect_consistent(d, 0, 0);
}

TEST(DeviceAllocator, ForeignOrDoubleFreedBlocksThrow) {
  FakeDevice d;
  const Block b = d.alloc.allocate(4096);
  Block wrong = b;
  wrong.class_bytes = 8192;
  EXPECT_THROW(d.alloc.deallocate(wrong), Error);
  int elsewhere = 0;
  EXPECT_THROW(d.alloc.deallocate(Block{&elsewhere, 4, 512, MemoryCategory::other}), Error);
  d.alloc.deallocate(b);
  try {
    d.alloc.deallocate(b);
    ADD_FAILURE() << "a double free did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Allocator::deallocate"), std::string::npos) << e.what();
  }
  expect_consistent(d, 0, 0);
}

TEST(DeviceAllocator, CpuKeepsSizeClassesUnlessToldOtherwise) {
  auto memory = std::make_shared<FakeMemory>();
  {
    Allocator cpu(Device::cpu(), std::make_unique<FakeSource>(memory));
    const Block a = cpu.allocate(1000), b = cpu.allocate(1000);
    EXPECT_EQ(memory->segments.size(), 2u);  // no splitting: one source allocation per block
    EXPECT_EQ(a.class_bytes, Allocator::size_class(1000));
    EXPECT_EQ(cpu.stats().reserved_bytes, 2 * Allocator::size_class(1000));
    for (const Block& blk : {a, b}) cpu.deallocate(blk);
  }
  EXPECT_TRUE(memory->segments.empty());  // the destructor returned the cache
  {
    Allocator split(Device::cpu(), std::make_unique<FakeSource>(memory), CachePolicy::segments);
    const Block a = split.allocate(1000), b = split.allocate(1000);
    EXPECT_EQ(memory->segments.size(), 1u);
    for (const Block& blk : {a, b}) split.deallocate(blk);
  }
  EXPECT_TRUE(memory->segments.empty());
}

// ---- stream-ordered reuse (fake source whose stream key the test switches) ----

// The fake source answering with a stream key the test sets, as the CUDA source answers with the
// calling thread's current stream.
class KeyedSource final : public MemorySource {
 public:
  KeyedSource(std::shared_ptr<FakeMemory> memory, std::shared_ptr<std::uintptr_t> key)
      : inner_(std::move(memory)), key_(std::move(key)) {}
  void* raw_allocate(std::size_t nbytes) override { return inner_.raw_allocate(nbytes); }
  void raw_free(void* ptr, std::size_t nbytes) override { inner_.raw_free(ptr, nbytes); }
  std::uintptr_t stream_key() const override { return *key_; }

 private:
  FakeSource inner_;
  std::shared_ptr<std::uintptr_t> key_;
};

constexpr std::uintptr_t kStreamA = 0;  // the legacy default stream's key
constexpr std::uintptr_t kStreamB = 0x7f00b000;

struct KeyedDevice {
  std::shared_ptr<FakeMemory> memory = std::make_shared<FakeMemory>();
  std::shared_ptr<std::uintptr_t> key = std::make_shared<std::uintptr_t>(kStreamA);
  Allocator alloc{Device::cuda(0), std::make_unique<KeyedSource>(memory, key)};

  void expect_consistent(std::size_t live_requested, std::size_t live_block_bytes) const {
    const MemoryStats s = alloc.stats();
    EXPECT_EQ(s.live_bytes, live_requested);
    EXPECT_EQ(s.reserved_bytes, memory->held());
    EXPECT_EQ(s.reserved_bytes - s.cached_bytes, live_block_bytes);
  }
};

// A prediction of a device run caches on meta as the device would (Allocator::set_cache_policy): on one random
// trace of requests from 1 byte to 24 MiB, the meta allocator under segments reserves and caches what the
// device allocator does, after every operation, and goes back to size classes afterwards.
TEST(DeviceAllocator, MetaUnderSegmentsReservesWhatTheDeviceReserves) {
  FakeDevice d;
  Allocator& meta = Allocator::get(Device::meta());
  meta.empty_cache();
  {
    const CachePolicyGuard as_device(meta, CachePolicy::segments);
    EXPECT_EQ(meta.cache_policy(), CachePolicy::segments);
    const MemoryStats start = meta.stats();
    std::mt19937 rng(29);
    std::uniform_int_distribution<int> coin(0, 2), scale(0, 24);
    std::vector<Block> on_device, on_meta;
    for (int op = 0; op < 600; ++op) {
      if (!on_device.empty() && coin(rng) == 0) {
        const std::size_t i = std::uniform_int_distribution<std::size_t>(0, on_device.size() - 1)(rng);
        d.alloc.deallocate(on_device[i]);
        meta.deallocate(on_meta[i]);
        on_device.erase(on_device.begin() + static_cast<std::ptrdiff_t>(i));
        on_meta.erase(on_meta.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        const std::size_t n = std::uniform_int_distribution<std::size_t>(1, std::size_t{1} << scale(rng))(rng);
        on_device.push_back(d.alloc.allocate(n, MemoryCategory::activations));
        on_meta.push_back(meta.allocate(n, MemoryCategory::activations));
        ASSERT_EQ(on_meta.back().class_bytes, on_device.back().class_bytes) << "after operation " << op;
      }
      const MemoryStats dev = d.alloc.stats(), m = meta.stats();
      ASSERT_EQ(m.reserved_bytes - start.reserved_bytes, dev.reserved_bytes) << "after operation " << op;
      ASSERT_EQ(m.cached_bytes - start.cached_bytes, dev.cached_bytes) << "after operation " << op;
    }
    // A block in use keeps the policy that laid it out.
    EXPECT_THROW(meta.set_cache_policy(CachePolicy::size_classes), Error);
    for (const Block& b : on_meta) meta.deallocate(b);
    for (const Block& b : on_device) d.alloc.deallocate(b);
  }
  EXPECT_EQ(meta.cache_policy(), CachePolicy::size_classes);
}

TEST(DeviceAllocatorStreams, ABlockFreedOnOneStreamIsNotReusedOnAnother) {
  KeyedDevice d;
  for (const std::size_t n : {std::size_t{1000}, 3 * MiB}) {  // the small and the large pool
    *d.key = kStreamA;
    const Block a = d.alloc.allocate(n);
    EXPECT_EQ(a.stream, kStreamA);
    d.alloc.deallocate(a);
    const std::size_t segments_before = d.memory->segments.size();
    *d.key = kStreamB;
    const Block b = d.alloc.allocate(n);
    EXPECT_EQ(b.stream, kStreamB);
    EXPECT_EQ(d.memory->segments.size(), segments_before + 1) << n << ": stream B got a segment of its own";
    EXPECT_NE(d.memory->segment_of(b.ptr, b.class_bytes), d.memory->segment_of(a.ptr, a.class_bytes)) << n;
    d.expect_consistent(n, b.class_bytes);
    *d.key = kStreamA;
    const Block again = d.alloc.allocate(n);
    EXPECT_EQ(again.ptr, a.ptr) << n << ": stream A reuses its own freed block";
    d.alloc.deallocate(again);
    d.alloc.deallocate(b);
    d.expect_consistent(0, 0);
  }
}

// A block goes back to the cache of the stream it was allocated on, whichever stream is current when it
// is freed.
TEST(DeviceAllocatorStreams, ABlockReturnsToItsOwnStreamWhenFreedUnderAnother) {
  KeyedDevice d;
  *d.key = kStreamB;
  const Block b = d.alloc.allocate(4096);
  *d.key = kStreamA;
  d.alloc.deallocate(b);
  const Block a = d.alloc.allocate(4096);
  EXPECT_EQ(d.memory->segments.size(), 2u);
  EXPECT_NE(d.memory->segment_of(a.ptr, a.class_bytes), d.memory->segment_of(b.ptr, b.class_bytes));
  *d.key = kStreamB;
  const Block b2 = d.alloc.allocate(4096);
  EXPECT_EQ(b2.ptr, b.ptr);
  EXPECT_EQ(d.memory->segments.size(), 2u);
  EXPECT_EQ(d.alloc.stats().cache_hits, 1u);  // b2 only: a and b each opened a segment
  for (const Block& blk : {a, b2}) d.alloc.deallocate(blk);
  d.expect_consistent(0, 0);
  // A block whose recorded stream was altered is not one this allocator lent.
  const Block c = d.alloc.allocate(512);
  Block forged = c;
  forged.stream = kStreamA;
  EXPECT_THROW(d.alloc.deallocate(forged), Error);
  d.alloc.deallocate(c);
}

// Random requests on three streams: every block lies in a segment opened for its own stream, live
// blocks never overlap, and the accounting stays exact; empty_cache then releases every stream's segments.
TEST(DeviceAllocatorStreams, EachStreamGetsItsOwnSegmentsAndEmptyCacheReleasesAll) {
  KeyedDevice d;
  const std::uintptr_t keys[] = {kStreamA, kStreamB, kStreamB + 0x100};
  std::map<char*, std::uintptr_t> segment_stream;  // which stream opened each segment
  std::mt19937_64 rng(5);
  std::vector<Block> live;
  std::size_t requested = 0, block_bytes = 0;
  for (int op = 0; op < 1500; ++op) {
    *d.key = keys[rng() % 3];
    if (!live.empty() && rng() % 100 < 45) {
      const std::size_t i = rng() % live.size();
      requested -= live[i].nbytes;
      block_bytes -= live[i].class_bytes;
      d.alloc.deallocate(live[i]);  // under whatever stream is current now
      live.erase(live.begin() + static_cast<long>(i));
      continue;
    }
    const std::size_t n = rng() % 5 == 0 ? rng() % (5 * MiB) : 1 + rng() % (100 * KiB);
    const std::size_t before = d.memory->allocations;
    const Block b = d.alloc.allocate(n);
    char* seg = d.memory->segment_of(b.ptr, b.class_bytes);
    ASSERT_NE(seg, nullptr);
    if (d.memory->allocations != before) segment_stream[seg] = *d.key;  // a fresh segment for this stream
    ASSERT_EQ(segment_stream.count(seg), 1u);
    ASSERT_EQ(segment_stream[seg], *d.key) << "op " << op << ": a block of another stream's segment";
    EXPECT_EQ(b.stream, *d.key);
    for (const Block& other : live) {
      const char* p = static_cast<const char*>(b.ptr);
      const char* q = static_cast<const char*>(other.ptr);
      ASSERT_TRUE(p + b.class_bytes <= q || q + other.class_bytes <= p) << "op " << op << ": overlap";
    }
    live.push_back(b);
    requested += n;
    block_bytes += b.class_bytes;
    if (op % 100 == 99) d.expect_consistent(requested, block_bytes);
  }
  std::set<std::uintptr_t> streams_with_segments;
  for (const auto& [seg, key] : segment_stream) {
    if (d.memory->segments.count(seg)) streams_with_segments.insert(key);
  }
  EXPECT_EQ(streams_with_segments.size(), 3u);
  for (const Block& b : live) d.alloc.deallocate(b);
  d.expect_consistent(0, 0);
  *d.key = kStreamB;  // empty_cache releases the free segments of every stream, not only the current one
  d.alloc.empty_cache();
  EXPECT_TRUE(d.memory->segments.empty());
  EXPECT_EQ(d.alloc.stats().reserved_bytes, 0u);
  EXPECT_EQ(d.alloc.stats().cached_bytes, 0u);
}

// The out-of-memory retry may release another stream's free segments.
TEST(DeviceAllocatorStreams, OutOfMemoryRetryReleasesOtherStreamsCache) {
  KeyedDevice d;
  d.memory->capacity = 8 * MiB;
  *d.key = kStreamA;
  d.alloc.deallocate(d.alloc.allocate(5 * MiB));  // a 6 MiB segment of stream A, all cached
  *d.key = kStreamB;
  const Block b = d.alloc.allocate(3 * MiB);  // 4 MiB: 6 + 4 > 8 fails, A's cache goes, then it fits
  EXPECT_EQ(d.memory->failures, 1u);
  EXPECT_EQ(d.memory->segments.size(), 1u);
  d.expect_consistent(3 * MiB, 4 * MiB);
  d.alloc.deallocate(b);
}

// The CPU's size-class cache honours the stream key too (a source may be keyed under either policy).
TEST(DeviceAllocatorStreams, SizeClassCacheKeepsStreamsApart) {
  KeyedDevice d;
  Allocator alloc(Device::cpu(), std::make_unique<KeyedSource>(d.memory, d.key), CachePolicy::size_classes);
  alloc.set_reserve_limit(std::nullopt);  // keep every freed block cached: this is about who may reuse one
  *d.key = kStreamB;
  const Block b = alloc.allocate(1000);
  alloc.deallocate(b);
  *d.key = kStreamA;
  const Block a = alloc.allocate(1000);
  EXPECT_NE(a.ptr, b.ptr);
  EXPECT_EQ(d.memory->segments.size(), 2u);
  alloc.deallocate(a);
  *d.key = kStreamB;
  const Block b2 = alloc.allocate(1000);
  EXPECT_EQ(b2.ptr, b.ptr);
  alloc.deallocate(b2);
  alloc.empty_cache();
  EXPECT_TRUE(d.memory->segments.empty());
}

// The pool alone on several streams: invariants (including one stream per segment) after every step, and
// every block taken for a stream lies in a segment added for that stream.
TEST(SegmentPool, StreamsNeverShareASegment) {
  detail::SegmentPool pool;
  std::mt19937_64 rng(17);
  struct Lent {
    detail::CachedBlock block;
    std::uintptr_t stream;
  };
  std::vector<Lent> lent;
  std::map<char*, std::pair<std::size_t, std::uintptr_t>> segments;  // base -> (bytes, stream)
  std::size_t next_base = 0x100000;
  for (int op = 0; op < 2000; ++op) {
    const std::uintptr_t stream = rng() % 3 * 0x1000;
    if (!lent.empty() && rng() % 100 < 45) {
      const std::size_t i = rng() % lent.size();
      pool.give_back(lent[i].block.ptr, lent[i].block.bytes, lent[i].stream);
      lent.erase(lent.begin() + static_cast<long>(i));
    } else {
      const std::size_t n = rng() % 4 == 0 ? rng() % (5 * MiB) : rng() % (200 * KiB);
      detail::CachedBlock b = pool.take(n, stream);
      if (b.ptr == nullptr) {
        const std::size_t seg = pool.segment_bytes(n);
        if (rng() % 2) next_base += 2 * MiB;
        b = pool.add_segment(reinterpret_cast<void*>(next_base), seg, n, stream);
        segments[reinterpret_cast<char*>(next_base)] = {seg, stream};
        next_base += seg;
      }
      char* p = static_cast<char*>(b.ptr);
      auto seg = segments.upper_bound(p);
      ASSERT_NE(seg, segments.begin());
      --seg;
      ASSERT_LE(p + b.bytes, seg->first + seg->second.first);
      ASSERT_EQ(seg->second.second, stream) << "op " << op << ": block of another stream's segment";
      lent.push_back({b, stream});
    }
    if (op % 50 == 49) {
      for (const detail::Segment& s : pool.release_free_segments()) segments.erase(static_cast<char*>(s.ptr));
    }
    ASSERT_NO_THROW(pool.check_invariants()) << "op " << op;
  }
  for (const Lent& l : lent) EXPECT_THROW(pool.give_back(l.block.ptr, l.block.bytes, l.stream + 1), Error);
  for (const Lent& l : lent) pool.give_back(l.block.ptr, l.block.bytes, l.stream);
  pool.release_free_segments();
  EXPECT_EQ(pool.num_segments(), 0u);
  pool.check_invariants();
}

#ifdef MEMTRAIN_HAVE_CUDA  // (a build without CUDA has no raw device entry points to test with)
// ---- the real cuda:0 allocator (skips without a device) ----

TEST(DeviceAllocatorOnDevice, SplitBlocksHoldTheirOwnBytes) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  Allocator& alloc = test_support::device_allocator();
  alloc.empty_cache();
  const std::size_t reserved0 = alloc.stats().reserved_bytes;
  std::mt19937 rng(7);
  std::vector<Block> blocks;
  std::size_t total = 0;
  while (total < MiB) {  // small blocks worth < 2 MiB: at most one new segment between them
    blocks.push_back(alloc.allocate(1 + rng() % (60 * KiB)));
    total += blocks.back().class_bytes;
  }
  EXPECT_LE(alloc.stats().reserved_bytes - reserved0, 2 * MiB);
  for (std::size_t i = 0; i < blocks.size(); ++i)
    cuda::fill(blocks[i].ptr, DType::u8, blocks[i].nbytes, static_cast<double>(i % 250 + 1), 0);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const auto got = test_support::download<std::uint8_t>(blocks[i].ptr, blocks[i].nbytes);
    const auto want = static_cast<std::uint8_t>(i % 250 + 1);
    EXPECT_EQ(std::count(got.begin(), got.end(), want), static_cast<long>(got.size())) << "block " << i;
  }
  for (const Block& b : blocks) alloc.deallocate(b);
  alloc.empty_cache();
  EXPECT_EQ(alloc.stats().reserved_bytes, reserved0);
}

TEST(DeviceAllocatorOnDevice, ALargeBlockSplitsAndMergesBack) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  Allocator& alloc = test_support::device_allocator();
  alloc.empty_cache();
  const std::size_t reserved0 = alloc.stats().reserved_bytes;
  alloc.deallocate(alloc.allocate(64 * MiB));
  const std::size_t reserved1 = alloc.stats().reserved_bytes;  // reserved0 + 64 MiB unless a free block fit
  std::vector<Block> parts;
  for (int i = 0; i < 8; ++i) parts.push_back(alloc.allocate(8 * MiB));
  EXPECT_EQ(alloc.stats().reserved_bytes, reserved1);  // all eight from the cached 64 MiB
  for (int i = 0; i < 8; ++i) cuda::fill(parts[i].ptr, DType::f32, 2 * MiB, i + 1.0, 0);
  for (int i = 0; i < 8; ++i) {
    const auto got = test_support::download<float>(parts[i].ptr, 2 * MiB);
    EXPECT_EQ(std::count(got.begin(), got.end(), float(i + 1)), static_cast<long>(got.size())) << "part " << i;
  }
  for (int i : {3, 1, 7, 0, 5, 2, 6, 4}) alloc.deallocate(parts[i]);
  const Block whole = alloc.allocate(64 * MiB);
  EXPECT_EQ(alloc.stats().reserved_bytes, reserved1);  // the eight merged back into one block
  alloc.deallocate(whole);
  alloc.empty_cache();
  EXPECT_EQ(alloc.stats().reserved_bytes, reserved0);
}
#endif  // MEMTRAIN_HAVE_CUDA

}  // namespace
}  // namespace memtrain

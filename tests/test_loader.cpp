// Datasets and the batch loader: determinism, sharding, resumption, prefetching, and bad input. Expected
// batches are computed here from the sample indices and the file contents the tests write themselves.
#include "temp_dir.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/core/tensor.h"
#include "memtrain/data/loader.h"
#include "memtrain/data/token_shard.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using namespace memtrain;
using namespace memtrain::data;
using ::testing::HasSubstr;

namespace {

using memtrain::test_support::TempDir;

// The message of the memtrain::Error fn throws ("" and a test failure when it throws none).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no memtrain::Error thrown";
  return "";
}

std::vector<std::int64_t> values_i64(const Tensor& t) {
  const auto* p = t.data<std::int64_t>();
  return {p, p + t.numel()};
}

// Sample i collates to inputs [i], targets [i]; optionally throws at one sample or sleeps per batch.
class IndexDataset : public Dataset {
 public:
  explicit IndexDataset(std::int64_t n, std::int64_t throw_at = -1, int sleep_us = 0)
      : n_(n), throw_at_(throw_at), sleep_us_(sleep_us) {}
  std::int64_t size() const override { return n_; }
  Batch collate(const std::vector<std::int64_t>& indices) const override {
    if (sleep_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    for (auto i : indices)
      if (i == throw_at_) throw std::runtime_error("IndexDataset: sample " + std::to_string(i) + " is poisoned");
    const auto b = static_cast<std::int64_t>(indices.size());
    Batch batch;
    batch.inputs = Tensor::empty({b}, DType::i64);  // deliberately no CategoryGuard: the loader's must apply
    batch.targets = Tensor::empty({b}, DType::i64);
    for (std::int64_t k = 0; k < b; ++k) {
      batch.inputs.data<std::int64_t>()[k] = indices[static_cast<std::size_t>(k)];
      batch.targets.data<std::int64_t>()[k] = indices[static_cast<std::size_t>(k)];
    }
    batch.samples = b;
    batch.targets_count = b;
    return batch;
  }
  std::string describe() const override { return "IndexDataset"; }

 private:
  std::int64_t n_, throw_at_;
  int sleep_us_;
};

LoaderOptions opts(std::int64_t batch_size, std::uint64_t seed, std::int64_t prefetch = 2) {
  LoaderOptions o;
  o.batch_size = batch_size;
  o.seed = seed;
  o.prefetch = prefetch;
  return o;
}

std::vector<std::vector<std::int64_t>> take(Loader& loader, int count) {
  std::vector<std::vector<std::int64_t>> out;
  for (int i = 0; i < count; ++i) out.push_back(values_i64(loader.next().inputs));
  return out;
}

// ---- IDX writing, byte by byte from the format: 0, 0, 0x08, ndim, big-endian dims, data ----
std::string idx_bytes(const std::vector<std::uint32_t>& dims, const std::vector<std::uint8_t>& data) {
  std::string s{'\0', '\0', '\x08', static_cast<char>(dims.size())};
  for (auto d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) s.push_back(static_cast<char>((d >> shift) & 0xFF));
  s.append(data.begin(), data.end());
  return s;
}

void write_file(const std::string& path, const std::string& bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
    gzclose(f);
  } else {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
}

// n images of h x w where pixel k of image i is (7 i + k) mod 256; label i is i mod classes.
void write_idx_pair(const std::string& dir, const std::string& split, std::uint32_t n, std::uint32_t h,
                    std::uint32_t w, std::uint32_t classes, bool gzip, std::uint32_t n_labels = 0) {
  if (n_labels == 0) n_labels = n;
  std::vector<std::uint8_t> px(static_cast<std::size_t>(n) * h * w), lab(n_labels);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t k = 0; k < h * w; ++k) px[i * h * w + k] = static_cast<std::uint8_t>((7 * i + k) % 256);
  for (std::size_t i = 0; i < n_labels; ++i) lab[i] = static_cast<std::uint8_t>(i % classes);
  const std::string ext = gzip ? ".gz" : "";
  write_file(dir + "/" + split + "-images-idx3-ubyte" + ext, idx_bytes({n, h, w}, px), gzip);
  write_file(dir + "/" + split + "-labels-idx1-ubyte" + ext, idx_bytes({n_labels}, lab), gzip);
}

}  // namespace

// ============================== Loader ==============================

TEST(LoaderDeterminism, SameOptionsSameBatchesOtherSeedDiffers) {
  auto ds = std::make_shared<IndexDataset>(50);
  Loader a(ds, opts(4, 7)), b(ds, opts(4, 7)), c(ds, opts(4, 8));
  const auto ba = take(a, 30), bb = take(b, 30), bc = take(c, 30);  // 30 > 12 batches/epoch: crosses epochs
  EXPECT_EQ(ba, bb);
  EXPECT_NE(ba, bc);
  EXPECT_EQ(a.batches_per_epoch(), 12);
  // batch_indices is what collate received.
  EXPECT_EQ(ba[13], (a.batch_indices({1, 1})));
}

TEST(LoaderDeterminism, NoShuffleIsIdentityOrder) {
  auto ds = std::make_shared<IndexDataset>(10);
  auto o = opts(3, 1);
  o.shuffle = false;
  Loader l(ds, o);
  EXPECT_EQ(take(l, 4), (std::vector<std::vector<std::int64_t>>{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {0, 1, 2}}));
}

TEST(LoaderDeterminism, EpochsArePermutationsAndRanksDisjoint) {
  const std::int64_t n = 103, world = 4, batch = 5;
  auto ds = std::make_shared<IndexDataset>(n);
  const std::int64_t share = n / world;  // 25: every rank the same count, the permutation's tail of 3 dropped
  std::vector<std::vector<std::int64_t>> epoch_orders;
  for (std::int64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int> seen(n, 0);
    std::vector<std::int64_t> all;
    for (std::int64_t rank = 0; rank < world; ++rank) {
      auto o = opts(batch, 42);
      o.rank = rank;
      o.world_size = world;
      o.drop_last = false;
      Loader l(ds, o);
      EXPECT_EQ(l.batches_per_epoch(), (share + batch - 1) / batch);
      l.seek({epoch, 0});
      std::int64_t got = 0;
      for (std::int64_t k = 0; k < l.batches_per_epoch(); ++k) {
        for (auto i : values_i64(l.next().inputs)) {
          ASSERT_GE(i, 0);
          ASSERT_LT(i, n);
          ++seen[static_cast<std::size_t>(i)];
          all.push_back(i);
          ++got;
        }
      }
      EXPECT_EQ(got, share) << "rank " << rank;
      EXPECT_EQ(l.position(), (LoaderPosition{epoch + 1, 0}));
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), share * world) << "epoch " << epoch;
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 0), n - share * world) << "epoch " << epoch;
    epoch_orders.push_back(all);
  }
  EXPECT_NE(epoch_orders[0], epoch_orders[1]);
  EXPECT_NE(epoch_orders[1], epoch_orders[2]);
}

TEST(LoaderDeterminism, ShuffleIsUniformAndLeavesGlobalRngAlone) {
  // Where sample 0 lands over 4000 seeds: 8 positions, 500 expected each; a sd of ~21, so [380, 620]
  // fails only on a real bias (or an off-by-one in Fisher-Yates, which never leaves an item in place or
  // favours the front).
  manual_seed(123);
  const RngState before = get_rng_state();
  auto ds = std::make_shared<IndexDataset>(8);
  std::vector<int> where(8, 0), stays(8, 0);
  for (std::uint64_t seed = 0; seed < 4000; ++seed) {
    auto o = opts(8, seed, 0);
    const auto order = epoch_share(8, o, 0);
    for (std::size_t k = 0; k < 8; ++k) {
      if (order[k] == 0) ++where[k];
      if (order[k] == static_cast<std::int64_t>(k)) ++stays[k];
    }
  }
  for (int k = 0; k < 8; ++k) {
    EXPECT_GE(where[k], 380) << "position " << k;
    EXPECT_LE(where[k], 620) << "position " << k;
    EXPECT_GE(stays[k], 380) << "position " << k;
    EXPECT_LE(stays[k], 620) << "position " << k;
  }
  Loader l(ds, opts(2, 5));
  take(l, 10);
  EXPECT_EQ(get_rng_state(), before);
  // And the model's stream does not change the loader's order.
  manual_seed(999);
  Loader l2(ds, opts(2, 5));
  Loader l3(ds, opts(2, 5));
  EXPECT_EQ(take(l2, 6), take(l3, 6));
}

TEST(LoaderResume, SeekAfterKBatchesMatchesUninterruptedRun) {
  auto ds = std::make_shared<IndexDataset>(37);
  const auto o = opts(4, 3, 3);  // 9 batches per epoch
  Loader full(ds, o);
  const auto reference = take(full, 25);

  Loader first(ds, o);
  take(first, 11);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let the worker run ahead to fill the queue
  const LoaderPosition pos = first.position();
  EXPECT_EQ(pos, (LoaderPosition{1, 2}));  // handed-out batches, not the prefetched ones

  Loader resumed(ds, o);
  resumed.seek(pos);
  EXPECT_EQ(resumed.position(), pos);
  const auto rest = take(resumed, 14);
  EXPECT_EQ(rest, std::vector<std::vector<std::int64_t>>(reference.begin() + 11, reference.end()));
  // The original loader continues the same way, and seeking back replays.
  EXPECT_EQ(take(first, 3), std::vector<std::vector<std::int64_t>>(reference.begin() + 11, reference.begin() + 14));
  first.seek({0, 5});
  EXPECT_EQ(take(first, 2), std::vector<std::vector<std::int64_t>>(reference.begin() + 5, reference.begin() + 7));
}

TEST(LoaderResume, SeekRejectsPositionsOutsideTheEpoch) {
  auto ds = std::make_shared<IndexDataset>(20);
  Loader l(ds, opts(4, 0));
  EXPECT_THAT(error_of([&] { l.seek({0, 5}); }), HasSubstr("batch 5"));
  EXPECT_THAT(error_of([&] { l.seek({-1, 0}); }), HasSubstr("epoch -1"));
  EXPECT_EQ(take(l, 1).size(), 1u);  // still usable
}

TEST(LoaderPrefetch, ZeroAndFourGiveTheSameBatches) {
  auto ds = std::make_shared<IndexDataset>(29);
  for (bool drop_last : {true, false}) {
    auto o0 = opts(4, 11, 0), o4 = opts(4, 11, 4);
    o0.drop_last = o4.drop_last = drop_last;
    Loader a(ds, o0), b(ds, o4);
    EXPECT_EQ(take(a, 20), take(b, 20)) << "drop_last " << drop_last;
    EXPECT_EQ(a.position(), b.position());
  }
}

TEST(LoaderPrefetch, CollateExceptionSurfacesFromNext) {
  for (std::int64_t prefetch : {0, 1, 4}) {
    auto ds = std::make_shared<IndexDataset>(20, /*throw_at=*/9);
    auto o = opts(4, 0, prefetch);
    o.shuffle = false;
    Loader l(ds, o);
    EXPECT_EQ(take(l, 2).size(), 2u);  // batches 0 and 1 (samples 0..7) are fine
    try {
      l.next();  // batch 2 holds sample 9
      ADD_FAILURE() << "no exception, prefetch " << prefetch;
    } catch (const std::runtime_error& e) {
      EXPECT_THAT(e.what(), HasSubstr("sample 9 is poisoned")) << "prefetch " << prefetch;
    }
    EXPECT_EQ(l.position(), (LoaderPosition{0, 2}));
    l.seek({0, 3});  // past the bad batch: works again
    EXPECT_EQ(values_i64(l.next().inputs), (std::vector<std::int64_t>{12, 13, 14, 15}));
  }
}

TEST(LoaderPrefetch, BatchesAreCountedAsDataMemory) {
  auto ds = std::make_shared<IndexDataset>(16);
  for (std::int64_t prefetch : {0, 2}) {
    Loader l(ds, opts(4, 0, prefetch));
    const Batch b = l.next();
    EXPECT_EQ(b.inputs.storage()->category(), MemoryCategory::data) << "prefetch " << prefetch;
    EXPECT_EQ(b.targets.storage()->category(), MemoryCategory::data) << "prefetch " << prefetch;
  }
}

TEST(LoaderPrefetch, DestructorJoinsWhileWorkerIsBlockedOrBusy) {
  auto ds = std::make_shared<IndexDataset>(64, -1, 2000);
  {
    Loader blocked(ds, opts(2, 0, 2));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // queue full, worker waiting for space
  }
  {
    Loader busy(ds, opts(2, 0, 2));  // worker inside collate's sleep
  }
  SUCCEED();
}

// Prefetch works ahead of the consumer: with prefetch 2 the worker collates batches k+1 and k+2 while the
// caller holds batch k, without being asked. No clock is read: the check waits (up to 10 s) for the worker's
// collate count to reach what prefetching implies, and fails if it never does (synchronous collation).
TEST(LoaderPrefetch, WorkerCollatesAheadOfTheConsumer) {
  class CountingDataset : public IndexDataset {
   public:
    using IndexDataset::IndexDataset;
    Batch collate(const std::vector<std::int64_t>& indices) const override {
      ++calls;
      return IndexDataset::collate(indices);
    }
    mutable std::atomic<int> calls{0};
  };
  auto ds = std::make_shared<CountingDataset>(64);
  Loader l(ds, opts(4, 0, 2));
  l.next();
  auto wait_for = [&](int n) {
    for (int i = 0; i < 1000 && ds->calls.load() < n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return ds->calls.load();
  };
  EXPECT_EQ(wait_for(3), 3);  // batch 0 handed out, batches 1 and 2 ready in the queue
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(ds->calls.load(), 3);  // and no further: the queue is bounded by prefetch
  l.next();
  EXPECT_EQ(wait_for(4), 4);
}

// Sharing whole batches: at 1, 2 and 4 ranks with the same global group of 4 batches, rank r takes batches
// [r*k, (r+1)*k) of each group of the one-rank stream, across an epoch boundary too (5 batches per epoch), with
// and without prefetch; seek goes to a group start and refuses anything else.
TEST(LoaderBatchBlocks, RanksTakeBlocksOfTheOneRankStream) {
  auto ds = std::make_shared<IndexDataset>(20);
  std::vector<std::vector<std::int64_t>> alone;
  {
    Loader l(ds, opts(4, 9));
    alone = take(l, 12);  // 3 groups of 4 batches, crossing epoch 0 -> 1 after batch 5
  }
  for (const std::int64_t world : {1, 2, 4}) {
    for (const std::int64_t prefetch : {0, 2}) {
      const std::int64_t block = 4 / world;
      std::vector<std::vector<std::vector<std::int64_t>>> per_rank;
      for (std::int64_t rank = 0; rank < world; ++rank) {
        auto o = opts(4, 9, prefetch);
        o.rank = rank;
        o.world_size = world;
        o.batch_block = block;
        Loader l(ds, o);
        EXPECT_EQ(l.batches_per_epoch(), 5);
        per_rank.push_back(take(l, static_cast<int>(3 * block)));
      }
      for (std::int64_t g = 0; g < 12; ++g) {
        const std::int64_t group = g / 4, in_group = g % 4, rank = in_group / block;
        EXPECT_EQ(per_rank[static_cast<std::size_t>(rank)][static_cast<std::size_t>(group * block + in_group % block)],
                  alone[static_cast<std::size_t>(g)])
            << "world " << world << " global batch " << g;
      }
    }
  }
  auto o = opts(4, 9);
  o.rank = 1;
  o.world_size = 2;
  o.batch_block = 2;
  Loader l(ds, o);
  l.seek({1, 3});  // global batch 8: a group start
  EXPECT_EQ(l.next().inputs.size(0), 4);
  EXPECT_EQ(l.position(), (LoaderPosition{2, 1}));  // global 10 handed out; rank 1's next is global 11
  EXPECT_THAT(error_of([&] { l.seek({0, 2}); }), HasSubstr("not the start of a group of 4"));
}

TEST(LoaderOptions, ValidationAndTooSmallShares) {
  auto ds = std::make_shared<IndexDataset>(10);
  auto o = opts(0, 0);
  EXPECT_THAT(error_of([&] { Loader l(ds, o); }), HasSubstr("batch_size 0"));
  o = opts(2, 0);
  o.rank = 2;
  o.world_size = 2;
  EXPECT_THAT(error_of([&] { Loader l(ds, o); }), HasSubstr("rank 2"));
  o = opts(2, 0, -1);
  EXPECT_THAT(error_of([&] { Loader l(ds, o); }), HasSubstr("prefetch -1"));
  o = opts(6, 0);  // share of 5 over world 2 holds no full batch of 6
  o.world_size = 2;
  EXPECT_THAT(error_of([&] { Loader l(ds, o); }), HasSubstr("no full batch"));
  o.drop_last = false;  // but a partial one is fine
  Loader ok(ds, o);
  EXPECT_EQ(ok.batches_per_epoch(), 1);
  EXPECT_EQ(ok.next().samples, 5);
}

TEST(LoaderDropLast, FalseGivesASmallerLastBatch) {
  auto ds = std::make_shared<IndexDataset>(10);
  auto o = opts(4, 2, 1);
  o.drop_last = false;
  Loader l(ds, o);
  EXPECT_EQ(l.batches_per_epoch(), 3);
  std::vector<std::int64_t> sizes;
  std::set<std::int64_t> samples;
  for (int k = 0; k < 3; ++k) {
    const Batch b = l.next();
    sizes.push_back(b.samples);
    EXPECT_EQ(b.targets_count, b.samples);
    EXPECT_EQ(b.inputs.numel(), b.samples);
    for (auto i : values_i64(b.inputs)) samples.insert(i);
  }
  EXPECT_EQ(sizes, (std::vector<std::int64_t>{4, 4, 2}));
  EXPECT_EQ(samples.size(), 10u);
  EXPECT_EQ(l.position(), (LoaderPosition{1, 0}));
  o.drop_last = true;
  Loader d(ds, o);
  EXPECT_EQ(d.batches_per_epoch(), 2);
}

// ============================== TokenWindowDataset ==============================

namespace {
// Tokens start, start+1, ... (mod vocab) in a shard at path.
void write_counting_shard(const std::string& path, std::uint16_t start, std::size_t count) {
  std::vector<std::uint16_t> tokens(count);
  for (std::size_t i = 0; i < count; ++i) tokens[i] = static_cast<std::uint16_t>(start + i);
  write_token_shard(path, tokens);
}
}  // namespace

TEST(TokenWindowDataset, WindowsAcrossShardsMatchTheStream) {
  TempDir dir;
  // Stream 0..29 over shards of 13, 0 and 17 tokens: windows of T = 4 cross the shard boundary at 13.
  write_counting_shard(dir.file("a.bin"), 0, 13);
  write_counting_shard(dir.file("b.bin"), 13, 0);
  write_counting_shard(dir.file("c.bin"), 13, 17);
  const std::int64_t t = 4;
  auto ds = std::make_shared<TokenWindowDataset>(
      std::vector<std::string>{dir.file("a.bin"), dir.file("b.bin"), dir.file("c.bin")}, t, 30);
  EXPECT_EQ(ds->total_tokens(), 30);
  EXPECT_EQ(ds->size(), (30 - 1) / t);  // 7 windows; the last uses tokens 24..28
  EXPECT_THAT(ds->describe(), HasSubstr("a.bin"));

  auto o = opts(3, 9, 2);
  o.drop_last = false;
  Loader l(ds, o);
  for (int k = 0; k < 5; ++k) {
    const LoaderPosition pos = l.position();
    const auto idx = l.batch_indices(pos);
    const Batch b = l.next();
    const auto bsz = static_cast<std::int64_t>(idx.size());
    ASSERT_EQ(b.inputs.shape(), (Shape{bsz, t}));
    ASSERT_EQ(b.targets.shape(), (Shape{bsz, t}));
    EXPECT_EQ(b.inputs.dtype(), DType::i64);
    EXPECT_EQ(b.targets.dtype(), DType::i64);
    EXPECT_EQ(b.samples, bsz);
    EXPECT_EQ(b.targets_count, bsz * t);
    EXPECT_EQ(b.inputs.storage()->category(), MemoryCategory::data);
    std::vector<std::int64_t> want_in, want_tg;
    for (auto i : idx)
      for (std::int64_t j = 0; j < t; ++j) {
        want_in.push_back(i * t + j);
        want_tg.push_back(i * t + j + 1);
      }
    EXPECT_EQ(values_i64(b.inputs), want_in) << "batch " << k;
    EXPECT_EQ(values_i64(b.targets), want_tg) << "batch " << k;
  }
}

TEST(TokenWindowDataset, RejectsBadShards) {
  TempDir dir;
  write_counting_shard(dir.file("ok.bin"), 0, 40);

  // Token >= vocab: shard, index and byte offset 1024 + 2 * index.
  std::string msg = error_of([&] { TokenWindowDataset ds({dir.file("ok.bin")}, 4, 35); });
  EXPECT_THAT(msg, HasSubstr("ok.bin"));
  EXPECT_THAT(msg, HasSubstr("token 35 at index 35"));
  EXPECT_THAT(msg, HasSubstr("offset 1094"));

  // Truncated: cut the last token in half.
  write_counting_shard(dir.file("trunc.bin"), 0, 40);
  fs::resize_file(dir.file("trunc.bin"), 1024 + 2 * 40 - 1);
  msg = error_of([&] { TokenWindowDataset ds({dir.file("ok.bin"), dir.file("trunc.bin")}, 4, 100); });
  EXPECT_THAT(msg, HasSubstr("trunc.bin"));
  EXPECT_THAT(msg, HasSubstr("truncated"));
  EXPECT_THAT(msg, HasSubstr("offset 8"));

  // Wrong magic.
  {
    std::fstream f(dir.file("ok.bin"), std::ios::in | std::ios::out | std::ios::binary);
    const std::int32_t bad = 12345;
    f.write(reinterpret_cast<const char*>(&bad), sizeof(bad));
  }
  msg = error_of([&] { TokenWindowDataset ds({dir.file("ok.bin")}, 4, 100); });
  EXPECT_THAT(msg, HasSubstr("ok.bin"));
  EXPECT_THAT(msg, HasSubstr("bad magic 12345 at offset 0"));

  // Too short for one window of T + 1 tokens.
  write_counting_shard(dir.file("short.bin"), 0, 8);
  msg = error_of([&] { TokenWindowDataset ds({dir.file("short.bin")}, 8, 100); });
  EXPECT_THAT(msg, HasSubstr("short.bin"));
  EXPECT_THAT(msg, HasSubstr("8 tokens"));
  TokenWindowDataset exactly({dir.file("short.bin")}, 7, 100);
  EXPECT_EQ(exactly.size(), 1);

  EXPECT_THAT(error_of([&] { exactly.collate({1}); }), HasSubstr("sample index 1"));
  EXPECT_THAT(error_of([&] { TokenWindowDataset ds({dir.file("missing.bin")}, 4, 100); }), HasSubstr("missing.bin"));
}

// ============================== ImageDataset ==============================

TEST(ImageDataset, FromIdxDirNormalisesAndFindsGzOrPlain) {
  TempDir dir;
  write_idx_pair(dir.path(), "train", 12, 3, 2, 10, /*gzip=*/true);
  write_idx_pair(dir.path(), "t10k", 5, 3, 2, 10, /*gzip=*/false);
  const double mean = 0.25, sd = 0.5;
  auto train = ImageDataset::from_idx_dir(dir.path(), "train", 10, mean, sd);
  auto test = ImageDataset::from_idx_dir(dir.path(), "t10k", 10, mean, sd);
  EXPECT_EQ(train->size(), 12);
  EXPECT_EQ(test->size(), 5);
  EXPECT_THAT(train->describe(), HasSubstr("train-images-idx3-ubyte.gz"));

  const std::vector<std::int64_t> idx = {11, 0, 4};
  const Batch b = train->collate(idx);
  ASSERT_EQ(b.inputs.shape(), (Shape{3, 1, 3, 2}));
  ASSERT_EQ(b.targets.shape(), (Shape{3}));
  EXPECT_EQ(b.inputs.dtype(), DType::f32);
  EXPECT_EQ(b.targets.dtype(), DType::i64);
  EXPECT_EQ(b.samples, 3);
  EXPECT_EQ(b.targets_count, 3);
  EXPECT_EQ(b.inputs.storage()->category(), MemoryCategory::data);
  for (std::size_t r = 0; r < idx.size(); ++r) {
    EXPECT_EQ(b.targets.data<std::int64_t>()[r], idx[r] % 10);
    for (int k = 0; k < 6; ++k) {
      const double x = static_cast<double>((7 * idx[r] + k) % 256) / 255.0;
      EXPECT_NEAR(b.inputs.data<float>()[r * 6 + k], (x - mean) / sd, 1e-6) << "sample " << idx[r] << " px " << k;
    }
  }
  EXPECT_THAT(error_of([&] { ImageDataset::from_idx_dir(dir.path(), "val"); }),
              HasSubstr("val-images-idx3-ubyte.gz"));
}

TEST(ImageDataset, RejectsBadLabelsCountsAndShapes) {
  TempDir dir;
  // Labels i mod 12 with 10 classes: sample 10 is the first bad one, at byte 8 + 10 of the label file.
  write_idx_pair(dir.path(), "train", 14, 2, 2, 12, /*gzip=*/false);
  std::string msg = error_of([&] { ImageDataset::from_idx_dir(dir.path(), "train", 10); });
  EXPECT_THAT(msg, HasSubstr("train-labels-idx1-ubyte"));
  EXPECT_THAT(msg, HasSubstr("label 10 of sample 10 at offset 18"));

  write_idx_pair(dir.path(), "t10k", 6, 2, 2, 10, /*gzip=*/true, /*n_labels=*/5);
  msg = error_of([&] { ImageDataset::from_idx_dir(dir.path(), "t10k"); });
  EXPECT_THAT(msg, HasSubstr("t10k-images-idx3-ubyte.gz' holds 6 images"));
  EXPECT_THAT(msg, HasSubstr("t10k-labels-idx1-ubyte.gz' holds 5 labels"));

  const Tensor images = zeros({4, 2, 2}, DType::u8);
  const Tensor labels = tensor<std::int64_t>({0, 1, 2, 3}, {4}).to(DType::u8);
  msg = error_of([&] { ImageDataset ds(images, labels, 3, "mem"); });
  EXPECT_THAT(msg, HasSubstr("'mem'"));
  EXPECT_THAT(msg, HasSubstr("label 3 of sample 3 (byte offset 3"));
  EXPECT_THAT(error_of([&] { ImageDataset ds(images.to(DType::f32), labels, 4, "mem"); }), HasSubstr("u8 [N, H, W]"));
  EXPECT_THAT(error_of([&] { ImageDataset ds(zeros({4, 4}, DType::u8), labels, 4, "mem"); }), HasSubstr("[4, 4]"));
  EXPECT_THAT(error_of([&] { ImageDataset ds(images, labels.to(DType::i64), 4, "mem"); }), HasSubstr("labels must"));
  EXPECT_THAT(error_of([&] { ImageDataset ds(zeros({5, 2, 2}, DType::u8), labels, 4, "mem"); }),
              HasSubstr("5 images"));
  ImageDataset ok(images, labels, 4, "mem");
  EXPECT_EQ(ok.size(), 4);
}

TEST(ImageDataset, FashionMnistDefaultsMatchTheData) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir + "/train-images-idx3-ubyte.gz") && !fs::exists(dir + "/train-images-idx3-ubyte"))
    GTEST_SKIP() << "Fashion-MNIST not installed at " << dir << " (Debian package dataset-fashion-mnist)";
  auto train = ImageDataset::from_idx_dir(dir, "train");
  auto test = ImageDataset::from_idx_dir(dir, "t10k");
  EXPECT_EQ(train->size(), 60000);
  EXPECT_EQ(test->size(), 10000);
  // The default mean/std normalise the training set to mean ~0 and std ~1: a check of the constants.
  Loader l(train, opts(1000, 0, 2));
  double sum = 0, sumsq = 0;
  std::int64_t count = 0;
  std::vector<std::int64_t> per_class(10, 0);
  for (std::int64_t k = 0; k < l.batches_per_epoch(); ++k) {
    const Batch b = l.next();
    ASSERT_EQ(b.inputs.shape(), (Shape{1000, 1, 28, 28}));
    const float* x = b.inputs.data<float>();
    for (std::int64_t i = 0; i < b.inputs.numel(); ++i) {
      sum += x[i];
      sumsq += static_cast<double>(x[i]) * x[i];
    }
    count += b.inputs.numel();
    for (auto y : values_i64(b.targets)) ++per_class[static_cast<std::size_t>(y)];
  }
  const double mean = sum / static_cast<double>(count);
  const double sd = std::sqrt(sumsq / static_cast<double>(count) - mean * mean);
  EXPECT_NEAR(mean, 0.0, 2e-3);
  EXPECT_NEAR(sd, 1.0, 2e-3);
  for (auto c : per_class) EXPECT_EQ(c, 6000);  // Fashion-MNIST's training set is balanced
}

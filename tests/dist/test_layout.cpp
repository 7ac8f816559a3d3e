// canonical_split and shard_bounds: pure functions, the same on every rank.
#include "memtrain/dist/communicator.h"

#include <gtest/gtest.h>

#include <vector>

namespace dist = memtrain::dist;
using Bounds = std::vector<std::int64_t>;

TEST(DistLayout, CanonicalSplitIsTheLargestPowerOfTwoBelowN) {
  EXPECT_EQ(dist::canonical_split(2), 1);
  EXPECT_EQ(dist::canonical_split(3), 2);
  EXPECT_EQ(dist::canonical_split(4), 2);
  EXPECT_EQ(dist::canonical_split(5), 4);
  EXPECT_EQ(dist::canonical_split(8), 4);
  EXPECT_EQ(dist::canonical_split(9), 8);
  EXPECT_EQ(dist::canonical_split(std::int64_t{1} << 40), std::int64_t{1} << 39);
  EXPECT_THROW(dist::canonical_split(1), memtrain::Error);
}

TEST(DistLayout, ShardBoundsAreAlignedEvenAndLowerRanksTakeTheExtraBlocks) {
  // 10 blocks of 256 over 4 ranks: 3, 3, 2, 2 blocks; the last block is partial.
  EXPECT_EQ(dist::shard_bounds(9 * 256 + 7, 4), (Bounds{0, 768, 1536, 2048, 2311}));
  EXPECT_EQ(dist::shard_bounds(1024, 4), (Bounds{0, 256, 512, 768, 1024}));
  EXPECT_EQ(dist::shard_bounds(10, 3, 1), (Bounds{0, 4, 7, 10}));
  for (std::int64_t numel : {0, 1, 255, 256, 257, 5000, 65536}) {
    for (std::int64_t world : {1, 2, 3, 4, 7}) {
      const Bounds b = dist::shard_bounds(numel, world);
      ASSERT_EQ(b.size(), static_cast<std::size_t>(world) + 1);
      EXPECT_EQ(b.front(), 0);
      EXPECT_EQ(b.back(), numel);
      for (std::int64_t q = 0; q < world; ++q) {
        EXPECT_LE(b[q], b[q + 1]);
        if (q > 0) EXPECT_TRUE(b[q] % 256 == 0 || b[q] == numel) << numel << " " << world << " " << q;
        // As even as whole blocks allow: no part has more blocks than rank 0's, nor more than one fewer.
        const auto blocks = [&](std::int64_t r) { return (b[r + 1] - b[r] + 255) / 256; };
        EXPECT_LE(blocks(q), blocks(0));
        EXPECT_GE(blocks(q) + 1, blocks(0));
      }
    }
  }
}

TEST(DistLayout, ShardBoundsEmptyPartsAndTheGroupOfOne) {
  // Fewer elements than one block: all of it on rank 0, the others empty.
  EXPECT_EQ(dist::shard_bounds(100, 3), (Bounds{0, 100, 100, 100}));
  EXPECT_EQ(dist::shard_bounds(0, 2), (Bounds{0, 0, 0}));
  EXPECT_EQ(dist::shard_bounds(2, 4, 1), (Bounds{0, 1, 2, 2, 2}));
  EXPECT_EQ(dist::shard_bounds(12345, 1), (Bounds{0, 12345}));
  EXPECT_THROW(dist::shard_bounds(10, 0), memtrain::Error);
  EXPECT_THROW(dist::shard_bounds(10, 2, 0), memtrain::Error);
  EXPECT_THROW(dist::shard_bounds(-1, 2), memtrain::Error);
}

// The backend entry block_sums_of_squares, the unit of the canonical gradient norm (src/train/grad_norm.h):
// against long-double sums, independent of how a gradient is split at 256-element boundaries, silent on meta,
// and the same on CUDA as on the CPU (skipped without a device).
#include "core/backend.h"
#include "memtrain/core/tensor.h"
#include "memtrain/cuda/cuda.h"
#include "train/grad_norm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace memtrain {
namespace {

constexpr std::int64_t kBlock = 256;

std::vector<float> random_values(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<double> blocks_of(const Tensor& x) {
  std::vector<double> out(static_cast<std::size_t>((x.numel() + kBlock - 1) / kBlock), -1.0);
  detail::backend_for(x.device()).block_sums_of_squares(x, out.data());
  return out;
}

TEST(BlockSumsOfSquares, CpuMatchesLongDoubleSumsIncludingTheShortLastBlock) {
  const std::int64_t n = 5 * kBlock + 37;
  const std::vector<float> v = random_values(n, 11);
  const std::vector<double> got = blocks_of(from_buffer(v.data(), {n}, DType::f32, DType::f32));
  ASSERT_EQ(got.size(), 6u);
  for (std::size_t b = 0; b < got.size(); ++b) {
    long double want = 0.0L;
    for (std::int64_t j = static_cast<std::int64_t>(b) * kBlock; j < std::min(n, (static_cast<std::int64_t>(b) + 1) * kBlock);
         ++j)
      want += static_cast<long double>(v[static_cast<std::size_t>(j)]) * v[static_cast<std::size_t>(j)];
    EXPECT_NEAR(got[b], static_cast<double>(want), 1e-13 * static_cast<double>(want)) << "block " << b;
  }
}

TEST(BlockSumsOfSquares, AShardStartingOnABlockGivesTheWholeTensorsBitsForItsBlocks) {
  const std::int64_t n = 9 * kBlock + 5;
  const std::vector<float> v = random_values(n, 12);
  const Tensor whole = from_buffer(v.data(), {n}, DType::f32, DType::f32);
  const std::vector<double> all = blocks_of(whole);
  const std::vector<double> tail = blocks_of(whole.narrow(0, 4 * kBlock, n - 4 * kBlock));
  ASSERT_EQ(tail.size(), all.size() - 4);
  for (std::size_t b = 0; b < tail.size(); ++b) EXPECT_EQ(tail[b], all[b + 4]) << "block " << b;
}

TEST(BlockSumsOfSquares, CanonicalNormIsTheLongDoubleNorm) {
  const std::int64_t n = 3 * kBlock + 200;
  const std::vector<float> v = random_values(n, 13);
  long double sum = 0.0L;
  for (const float x : v) sum += static_cast<long double>(x) * x;
  const double norm = train::detail::canonical_norm(from_buffer(v.data(), {n}, DType::f32, DType::f32));
  EXPECT_NEAR(norm, std::sqrt(static_cast<double>(sum)), 1e-13 * std::sqrt(static_cast<double>(sum)));
}

TEST(BlockSumsOfSquares, MetaWritesNothing) {
  const Tensor m = Tensor::empty({3 * kBlock}, DType::f32, Device::meta());
  for (const double b : blocks_of(m)) EXPECT_EQ(b, -1.0);
  EXPECT_EQ(train::detail::canonical_norm(m), 0.0);
}

TEST(BlockSumsOfSquares, CudaMatchesTheCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (const std::int64_t n : {std::int64_t{1}, kBlock, 7 * kBlock + 129, 4099 * kBlock + 3}) {
    const std::vector<float> v = random_values(n, 14 + static_cast<std::uint64_t>(n));
    const Tensor host = from_buffer(v.data(), {n}, DType::f32, DType::f32);
    const std::vector<double> want = blocks_of(host);
    const std::vector<double> got = blocks_of(host.to(Device::cuda(0)));
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t b = 0; b < got.size(); ++b)
      EXPECT_NEAR(got[b], want[b], 1e-13 * want[b]) << "n " << n << " block " << b;
    EXPECT_NEAR(train::detail::canonical_norm(host.to(Device::cuda(0))), train::detail::canonical_norm(host),
                1e-13 * train::detail::canonical_norm(host))
        << "n " << n;
  }
}

}  // namespace
}  // namespace memtrain

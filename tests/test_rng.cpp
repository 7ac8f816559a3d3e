// Philox known answers, replay by state, and the distributions of rand/randn.
#include "memtrain/memtrain.h"
#include "memtrain/core/philox.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace memtrain;

namespace {

// Known-answer vectors published with Random123 (kat_vectors, philox4x32 with 10 rounds).
TEST(Rng, PhiloxMatchesPublishedKnownAnswers) {
  const Philox4x32 zero = philox4x32_10(0, 0, 0);
  EXPECT_EQ(zero.v[0], 0x6627e8d5u);
  EXPECT_EQ(zero.v[1], 0xe169c58du);
  EXPECT_EQ(zero.v[2], 0xbc57ac4cu);
  EXPECT_EQ(zero.v[3], 0x9b00dbd8u);
  const Philox4x32 ones = philox4x32_10(~0ull, ~0ull, ~0ull);
  EXPECT_EQ(ones.v[0], 0x408f276du);
  EXPECT_EQ(ones.v[1], 0x41c83b0eu);
  EXPECT_EQ(ones.v[2], 0xa20bc7c6u);
  EXPECT_EQ(ones.v[3], 0x6d5451fdu);
  // counter = (243f6a88 85a308d3 13198a2e 03707344), key = (a4093822 299f31d0): digits of pi.
  const Philox4x32 pi = philox4x32_10(0x85a308d3243f6a88ull, 0x0370734413198a2eull, 0x299f31d0a4093822ull);
  EXPECT_EQ(pi.v[0], 0xd16cfe09u);
  EXPECT_EQ(pi.v[1], 0x94fdccebu);
  EXPECT_EQ(pi.v[2], 0x5001e420u);
  EXPECT_EQ(pi.v[3], 0x24126ea1u);
}

TEST(Rng, RestoringTheStateReplaysTheSameNumbers) {
  manual_seed(1234);
  const RngState state = get_rng_state();
  Tensor a = randn({1000});
  Tensor b = randn({1000});
  set_rng_state(state);
  Tensor a2 = randn({1000});
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(a.data<float>()[i], a2.data<float>()[i]);
  bool differs = false;
  for (int i = 0; i < 1000; ++i) differs |= a.data<float>()[i] != b.data<float>()[i];
  EXPECT_TRUE(differs);
  EXPECT_EQ(get_rng_state().offset, state.offset + 250);  // 1000 elements = 250 Philox blocks
}

TEST(Rng, GuardRestoresTheStream) {
  manual_seed(7);
  const RngState before = get_rng_state();
  {
    RngStateGuard guard;
    Tensor x = rand({17});
  }
  EXPECT_EQ(get_rng_state(), before);
}

TEST(Rng, DistributionsHaveTheRightMoments) {
  manual_seed(42);
  const int n = 200000;
  Tensor u = rand({n});
  Tensor z = randn({n});
  double su = 0, su2 = 0, sz = 0, sz2 = 0;
  for (int i = 0; i < n; ++i) {
    const double x = u.data<float>()[i], y = z.data<float>()[i];
    ASSERT_GT(x, 0.0);
    ASSERT_LE(x, 1.0);
    su += x; su2 += x * x; sz += y; sz2 += y * y;
  }
  // Standard errors: uniform mean 0.29/sqrt(n) ~ 6.5e-4, normal mean 1/sqrt(n) ~ 2.2e-3; allow 5 sigma.
  EXPECT_NEAR(su / n, 0.5, 5 * 6.5e-4);
  EXPECT_NEAR(su2 / n - 0.25, 1.0 / 12, 5e-3);
  EXPECT_NEAR(sz / n, 0.0, 5 * 2.2e-3);
  EXPECT_NEAR(sz2 / n, 1.0, 5 * 3.2e-3);
}

TEST(Rng, ElementsDependOnlyOnTheirCounter) {
  // The tail of a long draw equals a short draw started at the matching offset (any thread can make any element).
  RngState s{99, 10};
  std::vector<float> whole(64), tail(16);
  cpu::fill_normal(whole.data(), 64, s);
  cpu::fill_normal(tail.data(), 16, RngState{99, 10 + 12});
  for (int i = 0; i < 16; ++i) EXPECT_EQ(whole[48 + i], tail[i]);
}

}  // namespace

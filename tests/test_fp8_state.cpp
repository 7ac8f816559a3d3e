// amp::Fp8State: one delayed-scaling meta per weight, made at first use; blockwise keeps none; save/load by
// weight name restores the exact state and refuses entries of weights the model does not have.
#include "memtrain/amp/fp8_state.h"
#include "memtrain/core/error.h"
#include "memtrain/core/rng.h"

#include <gtest/gtest.h>

namespace memtrain {
namespace {

using amp::Fp8Recipe;
using amp::Fp8ScalingKind;
using amp::Fp8State;

Fp8Recipe delayed(int history) { return Fp8Recipe{.kind = Fp8ScalingKind::delayed, .delayed = {.history_len = history}}; }

// A state whose two metas have seen a few steps of distinct amaxes.
void drive(Fp8State& s, const Tensor& w1, const Tensor& w2) {
  for (int step = 1; step <= 5; ++step) {
    s.meta_for(w1)->input.record_amax(0.5f * static_cast<float>(step));
    s.meta_for(w1)->grad.record_amax(1e-3f * static_cast<float>(step));
    s.meta_for(w2)->weight.record_amax(3.0f / static_cast<float>(step));
    s.update_scales();
  }
}

TEST(Fp8State, OneMetaPerWeightForDelayedNoneForBlockwise) {
  manual_seed(1);
  const Tensor w1 = randn({4, 4}).set_requires_grad(), w2 = randn({4, 4}).set_requires_grad();
  Fp8State s(delayed(8));
  EXPECT_EQ(s.meta_for(w1), s.meta_for(w1));
  EXPECT_NE(s.meta_for(w1), s.meta_for(w2));
  EXPECT_EQ(s.layers(), 2u);
  EXPECT_EQ(s.bytes(), 2u * 3u * (8u * 4u + 8u));
  Fp8State b(Fp8Recipe{});
  EXPECT_EQ(b.meta_for(w1), nullptr);
  EXPECT_EQ(b.layers(), 0u);
  EXPECT_THROW(Fp8State(delayed(0)), Error);
  EXPECT_EQ(amp::fp8_scaling_from_name("delayed"), Fp8ScalingKind::delayed);
  EXPECT_THROW(amp::fp8_scaling_from_name("tensorwise"), Error);
}

TEST(Fp8State, SaveLoadByNameContinuesExactly) {
  manual_seed(2);
  const Tensor w1 = randn({4, 4}).set_requires_grad(), w2 = randn({4, 4}).set_requires_grad();
  Fp8State a(delayed(3));
  drive(a, w1, w2);
  std::map<std::string, Tensor> file;
  a.save(file, "fp8", {{"h.0.fc", w1}, {"h.0.proj", w2}});
  EXPECT_EQ(file.size(), 2u * 3u * 2u);

  // Another model object with the same names: the state follows the names, not the tensors.
  const Tensor v1 = w1.detach().clone().set_requires_grad(), v2 = w2.detach().clone().set_requires_grad();
  Fp8State b(delayed(3));
  b.load(file, "fp8", {{"h.0.fc", v1}, {"h.0.proj", v2}});
  ASSERT_EQ(b.layers(), 2u);
  for (auto [x, y] : {std::pair{w1, v1}, std::pair{w2, v2}}) {
    EXPECT_EQ(b.meta_for(y)->input.scale(), a.meta_for(x)->input.scale());
    EXPECT_EQ(b.meta_for(y)->grad.inv_scale(), a.meta_for(x)->grad.inv_scale());
    EXPECT_EQ(b.meta_for(y)->weight.amax_history(), a.meta_for(x)->weight.amax_history());
  }
  // Both continue alike: the ring position came back too.
  drive(a, w1, w2);
  drive(b, v1, v2);
  EXPECT_EQ(b.meta_for(v1)->input.scale(), a.meta_for(w1)->input.scale());
  EXPECT_EQ(b.meta_for(v2)->weight.amax_history(), a.meta_for(w2)->weight.amax_history());
}

TEST(Fp8State, LoadRefusesForeignOrMalformedEntriesAndChangesNothing) {
  manual_seed(3);
  const Tensor w1 = randn({4, 4}).set_requires_grad(), w2 = randn({4, 4}).set_requires_grad();
  Fp8State a(delayed(3));
  drive(a, w1, w2);
  std::map<std::string, Tensor> file;
  a.save(file, "fp8", {{"fc", w1}, {"proj", w2}});

  Fp8State b(delayed(3));
  b.meta_for(w1)->input.record_amax(7.0f);
  b.update_scales();
  const float before = b.meta_for(w1)->input.scale();
  try {
    b.load(file, "fp8", {{"fc", w1}});  // "proj" is not in this model
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp8.proj."), std::string::npos) << e.what();
  }
  auto bad = file;
  bad["fp8.fc.grad.amax_history"] = zeros({5}, DType::f32);  // another history length
  try {
    b.load(bad, "fp8", {{"fc", w1}, {"proj", w2}});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp8.fc.grad.amax_history"), std::string::npos) << e.what();
  }
  EXPECT_EQ(b.layers(), 1u);
  EXPECT_EQ(b.meta_for(w1)->input.scale(), before);
}

}  // namespace
}  // namespace memtrain

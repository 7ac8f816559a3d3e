// Parameters stored in bf16 without an f32 master (optim::NarrowParams, TrainerConfig::param_dtype):
// - the backend's round_into_bf16: stochastic rounding is unbiased (the mean of many draws is the f32 value,
//   to within the binomial noise) and lands only on the two bf16 neighbours; its bits depend on (seed, stream,
//   element) alone, so 1 and 2 threads and the CUDA kernel (skipped without a device) agree bit for bit;
//   Kahan keeps param + compensation within 2^-16 of the value;
// - the optimizer: a bf16 parameter's step lands on a neighbour of the f32-master step; tiny updates that
//   round-to-nearest would lose entirely accumulate under stochastic rounding (on average) and under Kahan;
//   a state_dict round trip continues bit for bit; Kahan's compensation is state (2 bytes per element);
// - the Trainer: GPT trains with bf16 parameters (AdamW, stochastic and Kahan; the 8-bit GaLore layer-wise
//   recipe) to within 3% of the f32-master loss, with parameters at 2 bytes each.
#include "core/backend.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/float_types.h"
#include "memtrain/cuda/cuda.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/ops/nn.h"
#include "memtrain/optim/adamw8bit.h"
#include "memtrain/optim/optim.h"
#include "memtrain/train/train.h"

#include "token_dataset.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <random>
#include <vector>

namespace memtrain {
namespace {

std::vector<std::uint16_t> bits_of(const Tensor& t) {
  const Tensor c = t.detach().to(Device::cpu()).contiguous();
  std::vector<std::uint16_t> out(static_cast<std::size_t>(c.numel()));
  std::memcpy(out.data(), c.data_ptr(), out.size() * sizeof(std::uint16_t));
  return out;
}

float bf16_value(std::uint16_t bits) { return BFloat16::from_bits(bits).to_float(); }

Tensor f32_tensor(const std::vector<float>& v) {
  return from_buffer(v.data(), {static_cast<std::int64_t>(v.size())}, DType::f32, DType::f32);
}

std::vector<std::uint16_t> round_stochastic(const std::vector<float>& v, std::uint64_t seed, std::uint64_t stream,
                                            Device device = Device::cpu(), std::uint64_t first = 0) {
  const Tensor value = f32_tensor(v).to(device);
  const Tensor param = Tensor::empty(value.shape(), DType::bf16, device);
  detail::backend_for(device).round_into_bf16(param, value, Tensor(), seed, stream, first);
  return bits_of(param);
}

std::vector<float> random_values(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(RoundIntoBf16, StochasticRoundingIsUnbiasedAndLandsOnANeighbour) {
  constexpr std::size_t kDraws = 1 << 16;
  // 0.3 and 0.85 of the way between neighbours, of either sign, at two scales.
  for (const float x : {1.0f + 0.3f * 0x1p-7f, -(1.0f + 0.3f * 0x1p-7f), 3e-3f * (1.0f + 0.85f * 0x1p-7f),
                        -3e-3f * (1.0f + 0.85f * 0x1p-7f)}) {
    SCOPED_TRACE(x);
    const std::uint16_t down = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(x) >> 16);
    const float lo = bf16_value(down), hi = bf16_value(static_cast<std::uint16_t>(down + 1));
    const double p_up = (static_cast<double>(x) - lo) / (static_cast<double>(hi) - lo);
    const std::vector<std::uint16_t> got = round_stochastic(std::vector<float>(kDraws, x), 99, 3);
    std::size_t ups = 0;
    double sum = 0.0;
    for (const std::uint16_t b : got) {
      ASSERT_TRUE(b == down || b == down + 1) << "bits " << b << " are not a neighbour of " << x;
      ups += b != down;
      sum += bf16_value(b);
    }
    // Binomial: 5 standard deviations of the fraction rounded up.
    const double sd = std::sqrt(p_up * (1.0 - p_up) / kDraws);
    EXPECT_NEAR(static_cast<double>(ups) / kDraws, p_up, 5.0 * sd);
    EXPECT_NEAR(sum / kDraws, static_cast<double>(x), 5.0 * sd * std::abs(static_cast<double>(hi) - lo));
  }
}

TEST(RoundIntoBf16, ExactValuesAndNonFiniteOnesAreKept) {
  const std::vector<float> v = {0.0f, -0.0f, 1.0f, -2.5f, INFINITY, -INFINITY, NAN};
  const std::vector<std::uint16_t> got = round_stochastic(v, 1, 1);
  for (std::size_t i = 0; i + 1 < v.size(); ++i) EXPECT_EQ(got[i], BFloat16::from_float(v[i]).bits) << v[i];
  EXPECT_TRUE(std::isnan(bf16_value(got.back())));
}

TEST(RoundIntoBf16, BitsDependOnSeedStreamAndElementOnlyNotOnThreads) {
  const std::vector<float> v = random_values(300001, 5);  // above the kernel's OpenMP threshold, not a multiple of 8
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<std::uint16_t> one = round_stochastic(v, 7, 11);
  omp_set_num_threads(2);
  const std::vector<std::uint16_t> two = round_stochastic(v, 7, 11);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, two);
  // A tail element rounds as it does inside a longer tensor: its bits are its index's.
  const std::vector<float> head(v.begin(), v.begin() + 1001);
  const std::vector<std::uint16_t> short_run = round_stochastic(head, 7, 11);
  EXPECT_TRUE(std::equal(short_run.begin(), short_run.end(), one.begin()));
  // A slice that says where it starts in its parameter draws that part of the parameter's bits.
  const std::vector<float> middle(v.begin() + 1000, v.begin() + 3001);
  const std::vector<std::uint16_t> slice = round_stochastic(middle, 7, 11, Device::cpu(), 1000);
  EXPECT_TRUE(std::equal(slice.begin(), slice.end(), one.begin() + 1000));
  EXPECT_NE(round_stochastic(v, 7, 12), one) << "another stream draws other bits";
  EXPECT_NE(round_stochastic(v, 8, 11), one) << "another seed draws other bits";
}

TEST(RoundIntoBf16, KahanKeepsTheRemainder) {
  const std::vector<float> v = random_values(4099, 6);
  const Tensor param = Tensor::empty({4099}, DType::bf16);
  const Tensor comp = Tensor::empty({4099}, DType::bf16);
  detail::backend_for(Device::cpu()).round_into_bf16(param, f32_tensor(v), comp, 0, 0, 0);
  const std::vector<std::uint16_t> p = bits_of(param), c = bits_of(comp);
  for (std::size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(p[i], BFloat16::from_float(v[i]).bits) << "param rounds to nearest, element " << i;
    const double sum = static_cast<double>(bf16_value(p[i])) + bf16_value(c[i]);
    ASSERT_LE(std::abs(sum - v[i]), std::ldexp(std::abs(static_cast<double>(v[i])), -16)) << "element " << i;
  }
}

TEST(RoundIntoBf16, RefusesWrongOperands) {
  const Tensor value = zeros({8}, DType::f32);
  const auto& cpu = detail::backend_for(Device::cpu());
  EXPECT_THROW(cpu.round_into_bf16(zeros({8}, DType::f32), value, Tensor(), 0, 0, 0), Error);
  EXPECT_THROW(cpu.round_into_bf16(zeros({9}, DType::bf16), value, Tensor(), 0, 0, 0), Error);
  EXPECT_THROW(cpu.round_into_bf16(zeros({8}, DType::bf16), value, zeros({8}, DType::f32), 0, 0, 0), Error);
  EXPECT_THROW(cpu.round_into_bf16(zeros({8}, DType::bf16), value, Tensor(), 0, 0, 4), Error) << "first % 8 != 0";
}

TEST(RoundIntoBf16, CudaDrawsTheCpusBits) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  const std::vector<float> v = random_values(100003, 8);
  EXPECT_EQ(round_stochastic(v, 3, 77, Device::cuda(0)), round_stochastic(v, 3, 77));
  const Tensor param = Tensor::empty({100003}, DType::bf16, Device::cuda(0));
  const Tensor comp = Tensor::empty({100003}, DType::bf16, Device::cuda(0));
  detail::backend_for(Device::cuda(0)).round_into_bf16(param, f32_tensor(v).to(Device::cuda(0)), comp, 0, 0, 0);
  const Tensor cpu_param = Tensor::empty({100003}, DType::bf16), cpu_comp = Tensor::empty({100003}, DType::bf16);
  detail::backend_for(Device::cpu()).round_into_bf16(cpu_param, f32_tensor(v), cpu_comp, 0, 0, 0);
  EXPECT_EQ(bits_of(param), bits_of(cpu_param));
  EXPECT_EQ(bits_of(comp), bits_of(cpu_comp));
}

// ---- the optimizer ----

Tensor bf16_param(const std::vector<float>& v) {
  Tensor p = f32_tensor(v).to(DType::bf16);
  p.set_requires_grad(true);
  return p;
}

std::vector<float> floats_of(const Tensor& t) {
  const Tensor c = t.detach().to(DType::f32).contiguous();
  return {c.data<float>(), c.data<float>() + c.numel()};
}

TEST(NarrowParams, AStepLandsOnANeighbourOfTheF32MasterStep) {
  const std::vector<float> w = floats_of(f32_tensor(random_values(1000, 9)).to(DType::bf16));  // bf16-exact start
  const std::vector<float> g = random_values(1000, 10);
  Tensor narrow = bf16_param(w);
  Tensor master = f32_tensor(w);
  master.set_requires_grad(true);
  optim::AdamW a({{.params = {narrow}, .lr = 1e-2, .weight_decay = 0.1}});
  optim::AdamW b({{.params = {master}, .lr = 1e-2, .weight_decay = 0.1}});
  narrow.set_grad(f32_tensor(g).to(DType::bf16));
  master.set_grad(f32_tensor(g).to(DType::bf16).to(DType::f32));
  a.step();
  b.step();
  EXPECT_EQ(narrow.dtype(), DType::bf16);
  EXPECT_TRUE(narrow.grad().defined()) << "the step leaves the gradient in place, as for an f32 parameter";
  const std::vector<float> got = floats_of(narrow), want = floats_of(master);
  for (std::size_t i = 0; i < w.size(); ++i) {
    const std::uint16_t down = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(want[i]) >> 16);
    const std::uint16_t b16 = BFloat16::from_float(got[i]).bits;
    ASSERT_TRUE(b16 == down || b16 == down + 1) << "element " << i << ": " << got[i] << " vs f32 " << want[i];
  }
  EXPECT_EQ(a.state_bytes(), b.state_bytes()) << "stochastic rounding keeps no state";
}

// SGD, lr 1e-4, gradient 1 on 1.0 for 100 steps: 0.99 exactly in real numbers. Each update is 1/39 of bf16's
// half-ulp at 1, so rounding to nearest would leave every weight at 1.
TEST(NarrowParams, TinyUpdatesAccumulateUnderStochasticRoundingAndKahan) {
  constexpr std::int64_t kN = 4096, kSteps = 100;
  for (const bool kahan : {false, true}) {
    SCOPED_TRACE(kahan ? "kahan" : "stochastic");
    Tensor p = bf16_param(std::vector<float>(kN, 1.0f));
    optim::SGD sgd({{.params = {p}, .lr = 1e-4, .beta1 = 0.0}});
    sgd.set_narrow_params({.seed = 4, .kahan = kahan});
    for (std::int64_t s = 0; s < kSteps; ++s) {
      p.set_grad(ones({kN}, DType::bf16));
      sgd.step();
    }
    const std::vector<float> v = floats_of(p);
    double mean = 0.0;
    for (const float x : v) mean += x;
    mean /= kN;
    if (kahan) {
      const optim::StateDict state = sgd.state_dict();
      const std::vector<float> c = floats_of(state.at("0.kahan"));
      // The compensation is itself rounded to bf16 each step (a float64 simulation of this loop ends 5.9e-5
      // off); without it every weight would stay 1.0 off by 1e-2.
      for (std::int64_t i = 0; i < kN; ++i) ASSERT_NEAR(v[i] + c[i], 0.99, 1e-4) << "element " << i;
      EXPECT_EQ(sgd.compensation_bytes(), 2u * kN);
      EXPECT_EQ(sgd.state_bytes(), 2u * kN) << "plain SGD's only state is the compensation";
    } else {
      EXPECT_NEAR(mean, 0.99, 5e-4) << "unbiased: the mean weight follows the exact path";
      EXPECT_EQ(sgd.state_bytes(), 0u);
    }
  }
}

// Steps 1-3, the state saved and loaded into a fresh optimizer over a copy of the parameter, then steps 4-6,
// against 6 steps uninterrupted: the same bits, rounding included (its stream follows the saved step count).
TEST(NarrowParams, AStateDictRoundTripContinuesBitForBit) {
  const std::vector<float> w = random_values(777, 12);
  for (const bool kahan : {false, true}) {
    SCOPED_TRACE(kahan ? "kahan" : "stochastic");
    auto grad_at = [](std::int64_t step) { return f32_tensor(random_values(777, 100 + step)).to(DType::bf16); };
    Tensor whole = bf16_param(w);
    optim::AdamW a({{.params = {whole}, .lr = 1e-3}});
    a.set_narrow_params({.seed = 5, .kahan = kahan});
    for (std::int64_t s = 0; s < 6; ++s) {
      whole.set_grad(grad_at(s));
      a.step();
    }
    Tensor first = bf16_param(w);
    optim::AdamW b({{.params = {first}, .lr = 1e-3}});
    b.set_narrow_params({.seed = 5, .kahan = kahan});
    for (std::int64_t s = 0; s < 3; ++s) {
      first.set_grad(grad_at(s));
      b.step();
    }
    const optim::StateDict saved = b.state_dict();
    EXPECT_EQ(saved.count("0.kahan"), kahan ? 1u : 0u);
    Tensor resumed = first.detach().clone();
    resumed.set_requires_grad(true);
    optim::AdamW c({{.params = {resumed}, .lr = 1e-3}});
    c.set_narrow_params({.seed = 5, .kahan = kahan});
    c.load_state_dict(saved);
    for (std::int64_t s = 3; s < 6; ++s) {
      resumed.set_grad(grad_at(s));
      c.step();
    }
    EXPECT_EQ(bits_of(resumed), bits_of(whole));
  }
}

// An elementwise rule steps a bf16 parameter a slice at a time: slices of 1024 (AdamW8bit: on its 256-blocks)
// give the bits of one whole slice, parameter and state, over 3 steps, stochastic and Kahan; and the f32 copies
// stay within the slice (workspace peak 2 x 4 bytes x 1024 plus the rule's own per-slice scratch).
TEST(NarrowParams, SlicesGiveTheBitsOfTheWholeTensorWithinTheSlicesWorkspace) {
  using Make = std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>;
  const std::vector<std::pair<const char*, Make>> rules = {
      {"AdamW", [](auto g) { return std::make_unique<optim::AdamW>(std::move(g)); }},
      {"AdamW8bit", [](auto g) { return std::make_unique<optim::AdamW8bit>(std::move(g)); }},
      {"Lion", [](auto g) { return std::make_unique<optim::Lion>(std::move(g)); }},
      {"SGD", [](auto g) { return std::make_unique<optim::SGD>(std::move(g)); }}};
  constexpr std::int64_t kN = 40000;  // not a multiple of the slice or of 256
  const std::vector<float> w = random_values(kN, 14);
  for (const auto& [rule, make] : rules) {
    for (const bool kahan : {false, true}) {
      SCOPED_TRACE(std::string(rule) + (kahan ? " kahan" : " stochastic"));
      std::vector<std::vector<std::uint16_t>> bits;
      std::vector<optim::StateDict> states;
      std::vector<std::size_t> workspace;
      for (const std::int64_t slice : {std::int64_t{1} << 22, std::int64_t{1024}}) {
        Tensor p = bf16_param(w);
        auto opt = make({{.params = {p}, .lr = 1e-3, .weight_decay = 0.1}});
        opt->set_narrow_params({.seed = 9, .kahan = kahan, .slice_elements = slice});
        Allocator& cpu = Allocator::get(Device::cpu());
        for (std::int64_t s = 0; s < 3; ++s) {
          p.set_grad(f32_tensor(random_values(kN, 200 + s)).to(DType::bf16));
          cpu.reset_peak();
          const std::size_t before = cpu.stats().by_category[static_cast<int>(MemoryCategory::workspace)].live_bytes;
          ASSERT_EQ(opt->step().updated, 1);
          workspace.push_back(cpu.stats().by_category[static_cast<int>(MemoryCategory::workspace)].peak_bytes - before);
        }
        bits.push_back(bits_of(p));
        states.push_back(opt->state_dict());
      }
      EXPECT_EQ(bits[0], bits[1]);
      ASSERT_EQ(states[0].size(), states[1].size());
      for (const auto& [key, t] : states[0]) {
        const Tensor& u = states[1].at(key);
        ASSERT_EQ(t.nbytes(), u.nbytes()) << key;
        EXPECT_EQ(std::memcmp(t.contiguous().data_ptr(), u.contiguous().data_ptr(), t.nbytes()), 0) << key;
      }
      EXPECT_GE(workspace[0], 2u * 4u * kN) << "one slice: f32 copies of the whole parameter and its gradient";
      EXPECT_LE(workspace[5], 2u * 4u * 1024u + 16384u) << "slices of 1024: their f32 copies, and little else";
    }
  }
}

TEST(NarrowParams, KahanStateLoadsOnlyIntoAKahanOptimizer) {
  Tensor p = bf16_param(random_values(64, 13));
  optim::AdamW kahan({{.params = {p}, .lr = 1e-3}});
  kahan.set_narrow_params({.kahan = true});
  p.set_grad(ones({64}, DType::bf16));
  kahan.step();
  EXPECT_THROW(kahan.set_narrow_params({.kahan = false}), Error) << "switching Kahan off mid-run";
  Tensor q = bf16_param(random_values(64, 13));
  optim::AdamW stochastic({{.params = {q}, .lr = 1e-3}});
  try {
    stochastic.load_state_dict(kahan.state_dict());
    FAIL() << "a Kahan compensation was loaded into a stochastic-rounding optimizer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("0.kahan"), std::string::npos) << e.what();
  }
}

// A bf16 table (no f32 master): the lookup gathers its rows as they are, and the backward adds each row's
// occurrences, summed in f32 in position order, into the bf16 gradient with one rounding; neither makes an f32
// copy of the table (workspace stays far below its 4-byte size). Reference: float64 sums of the same values.
TEST(NarrowParams, Bf16EmbeddingGathersAndScatterAddsWithoutAnF32Table) {
  constexpr std::int64_t kV = 500, kC = 24;
  const std::vector<std::int64_t> idx = {3, 7, 3, 499, 0, 3, 7, 42, 3, 3};  // row 3 five times
  const auto N = static_cast<std::int64_t>(idx.size());
  Tensor table = f32_tensor(random_values(kV * kC, 15)).view({kV, kC}).to(DType::bf16);
  table.set_requires_grad(true);
  const Tensor index = tensor(idx, {N});
  Allocator& cpu = Allocator::get(Device::cpu());
  cpu.reset_peak();
  const std::size_t ws = cpu.stats().by_category[static_cast<int>(MemoryCategory::workspace)].live_bytes;
  const Tensor out = ops::embedding(table, index);
  ASSERT_EQ(out.dtype(), DType::bf16);
  const std::vector<float> rows = floats_of(out), t = floats_of(table);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < kC; ++c)
      ASSERT_EQ(rows[n * kC + c], t[idx[n] * kC + c]) << "row " << n << " column " << c;
  const std::vector<float> up = random_values(N * kC, 16);
  out.backward(f32_tensor(up).view({N, kC}).to(DType::bf16));
  EXPECT_LT(cpu.stats().by_category[static_cast<int>(MemoryCategory::workspace)].peak_bytes - ws, 4u * kV * kC / 4)
      << "no f32 copy of the table";
  ASSERT_EQ(table.grad().dtype(), DType::bf16);
  const std::vector<float> g = floats_of(table.grad()), u = floats_of(f32_tensor(up).to(DType::bf16));
  std::vector<double> want(kV * kC, 0.0);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < kC; ++c) want[idx[n] * kC + c] += u[n * kC + c];
  for (std::int64_t i = 0; i < kV * kC; ++i)
    ASSERT_NEAR(g[i], want[i], std::ldexp(std::abs(want[i]), -8) + 1e-30) << "element " << i << ": rounded once";
}

// The optimizers' finite gate reads a bf16 / f16 gradient's bits as they are: the right answer for Inf, NaN and
// the largest finite values, and no f32 copy of the gradient (at gpt2-124M's wte, 147 MiB).
TEST(NarrowParams, FiniteGateReadsNarrowGradientsWithoutACopy) {
  const auto& cpu = detail::backend_for(Device::cpu());
  for (const DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<float> v = random_values(100000, 17);
    v[5] = dt == DType::bf16 ? 3.0e38f : 65504.0f;  // finite: the largest values
    EXPECT_TRUE(cpu.all_finite(f32_tensor(v).to(dt)));
    for (const float bad : {INFINITY, -INFINITY, NAN}) {
      std::vector<float> w = v;
      w[99999] = bad;
      EXPECT_FALSE(cpu.all_finite(f32_tensor(w).to(dt))) << bad;
    }
    const Tensor g = f32_tensor(v).to(dt);
    Allocator& a = Allocator::get(Device::cpu());
    const std::size_t live = a.stats().live_bytes;
    a.reset_peak();
    EXPECT_TRUE(cpu.all_finite(g));
    EXPECT_EQ(a.stats().peak_bytes, live);
  }
}

// Adafactor couples elements (its factored statistics, the update's RMS), so the backend computes its statistics
// from the whole gradient first and then widens, steps and rounds back one slice at a time
// (adafactor_step_bf16). A bf16 matrix [300, 200] (factored) and vector [40000], 3 steps: (a) slices of 1024
// give the bits of one whole slice, parameter and state, stochastic and Kahan; (b) stochastic: each step's bits
// equal an f32 Adafactor stepping the widened value, rounded by round_into_bf16 with the same seed and stream
// (the statistics depend on the gradients only, so the f32 run's state stays equal).
TEST(NarrowParams, AdafactorStepsSlicesWithTheBitsOfTheF32StepRounded) {
  constexpr std::uint64_t kSeed = 21;
  for (const Shape& shape : {Shape{300, 200}, Shape{40000}}) {
    const std::int64_t n = shape_numel(shape);
    const std::vector<float> w = random_values(static_cast<std::size_t>(n), 18);
    const auto grad_at = [&](std::int64_t s) { return f32_tensor(random_values(n, 300 + s)).view(shape).to(DType::bf16); };
    for (const bool kahan : {false, true}) {
      SCOPED_TRACE(shape_str(shape) + (kahan ? " kahan" : " stochastic"));
      std::vector<std::vector<std::uint16_t>> bits;
      std::vector<optim::StateDict> states;
      for (const std::int64_t slice : {std::int64_t{1} << 22, std::int64_t{1024}}) {
        Tensor p = bf16_param(w).view(shape).detach().set_requires_grad(true);
        optim::Adafactor opt({{.params = {p}, .lr = 1e-2, .weight_decay = 0.1}});
        opt.set_narrow_params({.seed = kSeed, .kahan = kahan, .slice_elements = slice});
        Tensor ref = p.detach().to(DType::f32).set_requires_grad(true);  // the f32 Adafactor, re-synced each step
        optim::Adafactor ref_opt({{.params = {ref}, .lr = 1e-2, .weight_decay = 0.1}});
        for (std::int64_t s = 1; s <= 3; ++s) {
          ref.detach().copy_(p.detach());
          p.set_grad(grad_at(s));
          ref.set_grad(grad_at(s).to(DType::f32));
          ASSERT_EQ(opt.step().updated, 1);
          ASSERT_EQ(ref_opt.step().updated, 1);
          if (kahan) continue;
          Tensor want = Tensor::empty(shape, DType::bf16);
          // Parameter 0's rounding stream is its step count.
          detail::backend_for(Device::cpu()).round_into_bf16(want, ref.detach(), Tensor(), kSeed, s, 0);
          ASSERT_EQ(bits_of(p), bits_of(want)) << "step " << s;
        }
        bits.push_back(bits_of(p));
        states.push_back(opt.state_dict());
      }
      EXPECT_EQ(bits[0], bits[1]);
      for (const auto& [key, t] : states[0]) {
        const Tensor& u = states[1].at(key);
        ASSERT_EQ(t.nbytes(), u.nbytes()) << key;
        EXPECT_EQ(std::memcmp(t.contiguous().data_ptr(), u.contiguous().data_ptr(), t.nbytes()), 0) << key;
      }
    }
  }
}

// The gradient norm of a bf16 gradient widens it 1 Mi elements at a time: no f32 copy of the whole gradient, and
// the float64 sum of the squares of its values.
TEST(NarrowParams, GradientNormWidensABf16GradientInChunks) {
  constexpr std::int64_t kN = (std::int64_t{5} << 20) / 2;  // 2.5 Mi elements
  const Tensor g = f32_tensor(random_values(kN, 19)).to(DType::bf16);
  const std::vector<float> v = floats_of(g);
  double want = 0.0;
  for (const float x : v) want += static_cast<double>(x) * x;
  Allocator& a = Allocator::get(Device::cpu());
  const std::size_t live = a.stats().live_bytes;
  a.reset_peak();
  const double got = detail::backend_for(Device::cpu()).sum_of_squares({g});
  EXPECT_NEAR(got, want, 1e-12 * want);
  EXPECT_LE(a.stats().peak_bytes - live, 4u << 20) << "one 1 Mi-element f32 chunk, not 4 bytes x 2.5 Mi";
}

// ---- the Trainer ----

std::shared_ptr<nn::GPT> make_gpt() {
  manual_seed(7);
  nn::GPTConfig c;
  c.vocab_size = 64;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  return std::make_shared<nn::GPT>(c);
}

train::TrainerConfig config(amp::ParamDtype params) {
  train::TrainerConfig c;
  c.precision = amp::Precision::bf16;
  c.param_dtype = params;
  c.data.prefetch = 0;
  c.schedule.decay = train::LrDecay::constant;
  c.micro_batch = 4;
  c.grad_accum = 2;
  c.max_steps = 60;
  c.eval_interval = 0;
  c.log_interval = 1000;
  c.optimizer = optim::Spec::adamw({.lr = 3e-3, .weight_decay = 0.1});
  return c;
}

double mean_loss_of_last_10(train::Trainer& t, std::int64_t steps) {
  std::vector<double> losses;
  for (std::int64_t s = 0; s < steps; ++s) losses.push_back(t.train_step().loss);
  double sum = 0.0;
  for (std::size_t i = losses.size() - 10; i < losses.size(); ++i) {
    EXPECT_TRUE(std::isfinite(losses[i]));
    sum += losses[i];
  }
  return sum / 10.0;
}

// adamw8bit + GaLore rank 8 + layer-wise updates + full activation checkpointing: issue 29's recipe, small.
void use_recipe(train::TrainerConfig& c) {
  c.optimizer = optim::Spec::adamw8bit({.lr = 3e-3, .weight_decay = 0.1});
  c.galore_rank = 8;
  c.galore_update_gap = 20;
  c.layerwise_update = true;
  c.activation_checkpointing = ckpt::Policy::full();
}

std::size_t live_parameter_bytes() {
  return Allocator::get(Device::cpu()).stats().by_category[static_cast<int>(MemoryCategory::parameters)].live_bytes;
}

// Mean loss of the last 10 of 60 steps, and whether the parameters were stored as expected.
double train_and_check(const train::TrainerConfig& c, const std::shared_ptr<const data::Dataset>& ds) {
  auto model = make_gpt();
  std::size_t numel = 0;
  for (const auto& [name, p] : model->named_parameters()) numel += static_cast<std::size_t>(p.numel());
  const std::size_t before = live_parameter_bytes();
  train::Trainer t(c, model, [model](const data::Batch& b) { return model->loss(b.inputs, b.targets); }, ds);
  const DType stored = amp::param_storage_dtype(c.param_dtype);
  if (stored == DType::bf16) EXPECT_EQ(before - live_parameter_bytes(), 2 * numel) << "4 bytes per parameter to 2";
  for (const auto& [name, p] : model->named_parameters()) EXPECT_EQ(p.dtype(), stored) << name;
  return mean_loss_of_last_10(t, 60);
}

TEST(TrainerNarrowParams, Bf16ParametersTrainWithinThreePercentOfF32Masters) {
  auto ds = std::make_shared<test_support::TokenDataset>(64, 16, 64);
  const double adamw = train_and_check(config(amp::ParamDtype::f32), ds);
  train::TrainerConfig recipe_f32 = config(amp::ParamDtype::f32);
  use_recipe(recipe_f32);
  const double recipe = train_and_check(recipe_f32, ds);
  struct Run {
    const char* name;
    amp::ParamDtype params;
    bool recipe;
  };
  for (const Run run : {Run{"bf16", amp::ParamDtype::bf16, false}, Run{"bf16-kahan", amp::ParamDtype::bf16_kahan, false},
                        Run{"bf16 recipe", amp::ParamDtype::bf16, true}}) {
    SCOPED_TRACE(run.name);
    train::TrainerConfig c = config(run.params);
    if (run.recipe) use_recipe(c);
    const double want = run.recipe ? recipe : adamw;
    const double got = train_and_check(c, ds);
    EXPECT_NEAR(got, want, 0.03 * want);
    std::printf("%s: mean loss of the last 10 of 60 steps %.4f (the same with f32 masters %.4f)\n", run.name, got,
                want);
  }
}

TEST(TrainerNarrowParams, ConfigRefusesWhatCannotWork) {
  train::TrainerConfig c = config(amp::ParamDtype::bf16);
  c.precision = amp::Precision::fp32;
  EXPECT_THROW(c.validate(), Error) << "bf16 weights under fp32 compute";
  c = config(amp::ParamDtype::bf16);
  c.lisa_layers = 1;
  EXPECT_THROW(c.validate(), Error);
  c = config(amp::ParamDtype::bf16_kahan);
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(train::TrainerConfig::from_json(c.to_json()).param_dtype, amp::ParamDtype::bf16_kahan);
  EXPECT_THROW(amp::parse_param_dtype("fp16"), Error);
}

}  // namespace
}  // namespace memtrain

// CUDA optimizer steps and block-wise quantization (src/cuda/optim.h) against the CPU references:
// the optimizer classes (optim::SGD, AdamW, Lion, AdamW8bit, Lion8bit) stepped side by side with the
// kernels on the same gradients, and detail::quantize_block_reference / dequantize_block bit for bit.
// Every device buffer carries a sentinel tail that must survive (out-of-bounds writes), outputs are
// poisoned first (unwritten elements), and device tests skip with cuda::unavailable_reason() when no
// usable device exists. Argument checks run everywhere.
//
// Tolerances, and why:
// - f32 steps: |got - want| <= 1e-6 + 1e-5 |want| for parameters and state after every step of a free run.
//   The kernels round each operation as the CPU source is written; the CPU build (-march=native) may fuse
//   a product and a sum into one FMA in SGD and Lion, which moves results by an ulp or so. AdamW's CPU
//   kernel has FMA contraction off and its two explicit FMAs are mirrored, so it is usually bit-exact;
//   the exact fraction is printed, not asserted.
// - 8-bit steps: each step starts both sides from the same state (the CPU's codes, absmax and parameters
//   are uploaded before the step), so differences cannot compound. Parameters as f32; absmax 1e-5
//   relative; codes equal except where an ulp of f32 difference crosses a decision midpoint: such codes
//   must differ by exactly one and be at most 1e-3 of all codes (the measured count is printed).
// - The kernels' nearest-code encoder (quant::encode_code, __host__ __device__) is run on the CPU here and
//   must equal detail::quantize_nearest exactly on every adversarial float (CudaOptimEncode, no GPU needed).
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "cuda/device_ops.h"
#include "cuda/optim.h"
#include "memtrain/optim/adamw.h"
#include "memtrain/optim/adamw8bit.h"
#include "memtrain/optim/lion.h"
#include "memtrain/optim/lion8bit.h"
#include "memtrain/optim/quantized_state.h"
#include "memtrain/optim/sgd.h"
#include "cpu/quantized_kernels.h"

#define MEMTRAIN_OPTIM_ENCODE_ONLY
#include "../kernels/optim.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace memtrain {
namespace {

using optim::QuantMap;

constexpr std::size_t kPad = 64;             // sentinel elements after every device buffer
constexpr unsigned char kSentinel = 0xA5;    // their byte pattern
constexpr double kRel = 1e-5, kAbs = 1e-6;   // f32 tolerance (see the top of the file)
constexpr double kMaxCodeDiffFraction = 1e-3;

#define SKIP_WITHOUT_DEVICE() \
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason()

// n elements of T on cuda:0 followed by kPad sentinel elements; freed on scope exit.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n)
      : n_(n), block_(Allocator::get(Device::cuda(0)).allocate((n + kPad) * sizeof(T), MemoryCategory::other)) {
    fill_bytes(kSentinel);
  }
  ~DeviceArray() { Allocator::get(Device::cuda(0)).deallocate(block_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return static_cast<T*>(block_.ptr); }
  void upload(const std::vector<T>& host) {
    ASSERT_EQ(host.size(), n_);
    cuda::copy(get(), Device::cuda(0), host.data(), Device::cpu(), n_ * sizeof(T));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    cuda::copy(host.data(), Device::cpu(), get(), Device::cuda(0), n_ * sizeof(T));
    return host;
  }
  // Fills the n elements (not the tail) with a byte pattern.
  void poison(unsigned char byte) {
    const std::vector<unsigned char> bytes(n_ * sizeof(T), byte);
    cuda::copy(get(), Device::cuda(0), bytes.data(), Device::cpu(), bytes.size());
  }
  bool tail_intact() const {
    std::vector<unsigned char> tail(kPad * sizeof(T));
    cuda::copy(tail.data(), Device::cpu(), get() + n_, Device::cuda(0), tail.size());
    return std::all_of(tail.begin(), tail.end(), [](unsigned char b) { return b == kSentinel; });
  }

 private:
  void fill_bytes(unsigned char byte) {
    const std::vector<unsigned char> bytes((n_ + kPad) * sizeof(T), byte);
    cuda::copy(get(), Device::cuda(0), bytes.data(), Device::cpu(), bytes.size());
  }
  std::size_t n_;
  Block block_;
};

std::vector<float> normal(std::size_t n, double stddev, std::mt19937& rng) {
  std::normal_distribution<double> d(0.0, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(d(rng));
  return v;
}

Tensor make_param(const std::vector<float>& values) {
  Tensor t = tensor<float>(values, {static_cast<std::int64_t>(values.size())});
  t.set_requires_grad(true);
  return t;
}

template <typename T>
std::vector<T> values_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::vector<T>(c.data<T>(), c.data<T>() + c.numel());
}

template <typename T>
std::vector<T> cpu_state(const optim::Optimizer& opt, const std::string& name) {
  const optim::StateDict dict = opt.state_dict();
  auto it = dict.find("0." + name);
  if (it == dict.end()) {
    ADD_FAILURE() << "CPU optimizer has no state '" << name << "'";
    return {};
  }
  return values_of<T>(it->second);
}

optim::ParamGroup group_of(const Tensor& param, double lr, double wd, double beta1, double beta2, double eps = 1e-8) {
  optim::ParamGroup g;
  g.params = {param};
  g.lr = lr;
  g.weight_decay = wd;
  g.beta1 = beta1;
  g.beta2 = beta2;
  g.eps = eps;
  return g;
}

// Gradient for step k (1-based): scales change per step; on step 1 the first `zero_prefix` entries are 0.
std::vector<float> gradient(std::size_t n, int k, std::size_t zero_prefix, std::mt19937& rng) {
  static constexpr double kScales[] = {1.0, 0.1, 1e-3, 3.0, 0.02};
  std::vector<float> g = normal(n, kScales[(k - 1) % 5], rng);
  if (k == 1) std::fill_n(g.begin(), std::min(zero_prefix, n), 0.0f);
  return g;
}

// Compares got with want at the f32 tolerance; returns the number of bit-exact elements.
std::size_t expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  std::size_t exact = 0, bad = 0;
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i) {
    if (std::bit_cast<std::uint32_t>(got[i]) == std::bit_cast<std::uint32_t>(want[i])) {
      ++exact;
      continue;
    }
    const double err = std::fabs(double(got[i]) - want[i]);
    if (!(err <= kAbs + kRel * std::fabs(double(want[i])))) {
      if (bad++ < 3) ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " want " << want[i];
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements outside the tolerance";
  return exact;
}

// ---- f32 steps, free run against the CPU class ----

// gpu_step(p, g, state pointers, n, step); state arrays are initialised to zeros, or to NaN when poison_state.
struct F32Case {
  std::string name;
  std::vector<std::string> state_names;  // the CPU optimizer's state, in the order of the GPU arrays
  std::function<std::unique_ptr<optim::Optimizer>(const Tensor&)> make_cpu;
  std::function<void(float*, const float*, const std::vector<float*>&, std::size_t, std::int64_t)> gpu_step;
  bool poison_state = false;  // SGD: the momentum buffer is not read on step 1
};

void run_f32(const F32Case& c, std::size_t n, int steps, std::uint32_t seed, std::size_t* exact_params = nullptr) {
  SCOPED_TRACE(c.name + " n=" + std::to_string(n));
  std::mt19937 rng(seed);
  const std::vector<float> p0 = normal(n, 1.0, rng);
  Tensor param = make_param(p0);
  std::unique_ptr<optim::Optimizer> opt = c.make_cpu(param);
  DeviceArray<float> p(n), g(n);
  std::vector<std::unique_ptr<DeviceArray<float>>> state;
  std::vector<float*> state_ptrs;
  for (std::size_t s = 0; s < c.state_names.size(); ++s) {
    state.push_back(std::make_unique<DeviceArray<float>>(n));
    if (c.poison_state) state.back()->poison(0xFF);  // NaN
    else state.back()->upload(std::vector<float>(n, 0.0f));
    state_ptrs.push_back(state.back()->get());
  }
  p.upload(p0);
  for (int k = 1; k <= steps; ++k) {
    const std::vector<float> grad = gradient(n, k, 0, rng);
    param.set_grad(tensor<float>(grad, {static_cast<std::int64_t>(n)}));
    ASSERT_EQ(opt->step().updated, 1);
    g.upload(grad);
    c.gpu_step(p.get(), g.get(), state_ptrs, n, k);
    const std::string at = " step " + std::to_string(k);
    const std::size_t exact = expect_close(p.download(), values_of<float>(param), "param" + at);
    if (exact_params != nullptr) *exact_params += exact;
    for (std::size_t s = 0; s < state.size(); ++s)
      expect_close(state[s]->download(), cpu_state<float>(*opt, c.state_names[s]), c.state_names[s] + at);
  }
  EXPECT_TRUE(p.tail_intact() && g.tail_intact());
  for (const auto& s : state) EXPECT_TRUE(s->tail_intact());
}

const std::vector<std::size_t> kSizes = {1, 3, 127, 1000, 4097, 70001};

F32Case sgd_case(double momentum, bool nesterov) {
  F32Case c;
  c.name = "SGD momentum=" + std::to_string(momentum) + (nesterov ? " nesterov" : "");
  if (momentum > 0.0) c.state_names = {"momentum_buffer"};
  c.poison_state = true;
  const double lr = 0.05, wd = 0.01;
  c.make_cpu = [=](const Tensor& p) {
    return std::make_unique<optim::SGD>(std::vector<optim::ParamGroup>{group_of(p, lr, wd, momentum, 0.999)},
                                        nesterov);
  };
  c.gpu_step = [=](float* p, const float* g, const std::vector<float*>& s, std::size_t n, std::int64_t step) {
    cuda::SgdHyper h;
    h.lr = lr;
    h.weight_decay = wd;
    h.momentum = momentum;
    h.nesterov = nesterov;
    h.step = step;
    cuda::sgd_step(p, g, s.empty() ? nullptr : s[0], n, h, 0);
  };
  return c;
}

F32Case adamw_case() {
  F32Case c;
  c.name = "AdamW";
  c.state_names = {"exp_avg", "exp_avg_sq"};
  const double lr = 1e-2, wd = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  c.make_cpu = [=](const Tensor& p) {
    return std::make_unique<optim::AdamW>(std::vector<optim::ParamGroup>{group_of(p, lr, wd, b1, b2, eps)});
  };
  c.gpu_step = [=](float* p, const float* g, const std::vector<float*>& s, std::size_t n, std::int64_t step) {
    cuda::AdamWHyper h{lr, wd, b1, b2, eps, step};
    cuda::adamw_step(p, g, s[0], s[1], n, h, 0);
  };
  return c;
}

F32Case lion_case() {
  F32Case c;
  c.name = "Lion";
  c.state_names = {"exp_avg"};
  const double lr = 1e-3, wd = 0.1, b1 = 0.9, b2 = 0.99;
  c.make_cpu = [=](const Tensor& p) {
    return std::make_unique<optim::Lion>(std::vector<optim::ParamGroup>{group_of(p, lr, wd, b1, b2)});
  };
  c.gpu_step = [=](float* p, const float* g, const std::vector<float*>& s, std::size_t n, std::int64_t) {
    cuda::LionHyper h{lr, wd, b1, b2};
    cuda::lion_step(p, g, s[0], n, h, 0);
  };
  return c;
}

TEST(CudaOptimF32, SgdMatchesCpuClass) {
  SKIP_WITHOUT_DEVICE();
  std::uint32_t seed = 100;
  for (auto [momentum, nesterov] : {std::pair{0.0, false}, std::pair{0.9, false}, std::pair{0.9, true}})
    for (std::size_t n : kSizes) run_f32(sgd_case(momentum, nesterov), n, 4, seed++);
}

TEST(CudaOptimF32, AdamWMatchesCpuClass) {
  SKIP_WITHOUT_DEVICE();
  std::size_t exact = 0, total = 0;
  std::uint32_t seed = 200;
  for (std::size_t n : kSizes) {
    run_f32(adamw_case(), n, 5, seed++, &exact);
    total += 5 * n;
  }
  std::printf("[measured] AdamW f32: %zu of %zu parameter values bit-identical to the CPU\n", exact, total);
  RecordProperty("adamw_bit_identical", std::to_string(exact) + "/" + std::to_string(total));
}

TEST(CudaOptimF32, LionMatchesCpuClass) {
  SKIP_WITHOUT_DEVICE();
  std::uint32_t seed = 300;
  for (std::size_t n : kSizes) run_f32(lion_case(), n, 5, seed++);
}

TEST(CudaOptimF32, LargeTensorsUseTheGridStrideLoop) {
  SKIP_WITHOUT_DEVICE();
  const std::size_t n = (std::size_t{3} << 20) + 17;  // more elements than the capped grid has threads
  run_f32(adamw_case(), n, 2, 400);
  run_f32(sgd_case(0.9, true), n, 2, 401);
  run_f32(lion_case(), n, 2, 402);
}

// ---- 8-bit steps against the CPU classes, from the same state each step ----

struct CodeStats {
  std::size_t total = 0, off_by_one = 0;
};

void compare_codes(const std::vector<std::uint8_t>& got, const std::vector<std::uint8_t>& want, CodeStats& stats,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::size_t far = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const int d = std::abs(int(got[i]) - int(want[i]));
    if (d == 1) ++stats.off_by_one;
    if (d > 1 && far++ < 3)
      ADD_FAILURE() << what << ": code " << i << " got " << int(got[i]) << " want " << int(want[i]);
  }
  stats.total += got.size();
  EXPECT_EQ(far, 0u) << what;
}

void compare_absmax(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t b = 0; b < got.size(); ++b)
    EXPECT_LE(std::fabs(double(got[b]) - want[b]), kRel * std::fabs(double(want[b])))
        << what << ": block " << b << " got " << got[b] << " want " << want[b];
}

std::uint8_t zero_code(QuantMap m) { return optim::detail::quantize_nearest(0.0f, optim::dynamic_map(m).data()); }

// One 8-bit moment on the device: codes + absmax.
struct DeviceMoment {
  DeviceArray<std::uint8_t> codes;
  DeviceArray<float> absmax;
  DeviceMoment(std::size_t n, std::size_t blocks) : codes(n), absmax(blocks) {}
};

void run_8bit(bool adam, std::size_t n, std::int64_t bs, int steps, std::uint32_t seed, CodeStats& stats) {
  SCOPED_TRACE(std::string(adam ? "AdamW8bit" : "Lion8bit") + " n=" + std::to_string(n) + " block=" +
               std::to_string(bs));
  const double lr = adam ? 1e-2 : 1e-3, wd = 0.1, b1 = 0.9, b2 = adam ? 0.999 : 0.99, eps = 1e-8;
  std::mt19937 rng(seed);
  Tensor param = make_param(normal(n, 1.0, rng));
  std::unique_ptr<optim::Optimizer> opt;
  if (adam)
    opt = std::make_unique<optim::AdamW8bit>(std::vector<optim::ParamGroup>{group_of(param, lr, wd, b1, b2, eps)},
                                             bs, 0);
  else
    opt = std::make_unique<optim::Lion8bit>(std::vector<optim::ParamGroup>{group_of(param, lr, wd, b1, b2)}, bs, 0);
  const auto nb = static_cast<std::size_t>(optim::QuantizedState::num_blocks_for(static_cast<std::int64_t>(n), bs));
  DeviceArray<float> p(n), g(n);
  DeviceMoment m(n, nb), v(n, nb);
  const std::string mname = "exp_avg", vname = "exp_avg_sq";
  for (int k = 1; k <= steps; ++k) {
    // Both sides start the step from the CPU's parameters and state (zeros before the first step).
    p.upload(values_of<float>(param));
    m.codes.upload(k == 1 ? std::vector<std::uint8_t>(n, zero_code(QuantMap::signed_dynamic))
                          : cpu_state<std::uint8_t>(*opt, mname + ".codes"));
    m.absmax.upload(k == 1 ? std::vector<float>(nb, 0.0f) : cpu_state<float>(*opt, mname + ".absmax"));
    if (adam) {
      v.codes.upload(k == 1 ? std::vector<std::uint8_t>(n, zero_code(QuantMap::unsigned_dynamic))
                            : cpu_state<std::uint8_t>(*opt, vname + ".codes"));
      v.absmax.upload(k == 1 ? std::vector<float>(nb, 0.0f) : cpu_state<float>(*opt, vname + ".absmax"));
    }
    // Step 1 leaves the first block's moments at zero (the zero-scale path).
    const std::vector<float> grad = gradient(n, k, static_cast<std::size_t>(bs), rng);
    param.set_grad(tensor<float>(grad, {static_cast<std::int64_t>(n)}));
    ASSERT_EQ(opt->step().updated, 1);
    g.upload(grad);
    if (adam) {
      const cuda::AdamWHyper h{lr, wd, b1, b2, eps, k};
      cuda::adamw8bit_step(p.get(), g.get(), m.codes.get(), m.absmax.get(), v.codes.get(), v.absmax.get(), n, bs, h, 0);
    } else {
      const cuda::LionHyper h{lr, wd, b1, b2};
      cuda::lion8bit_step(p.get(), g.get(), m.codes.get(), m.absmax.get(), n, bs, h, 0);
    }
    const std::string at = " step " + std::to_string(k);
    expect_close(p.download(), values_of<float>(param), "param" + at);
    compare_codes(m.codes.download(), cpu_state<std::uint8_t>(*opt, mname + ".codes"), stats, mname + at);
    compare_absmax(m.absmax.download(), cpu_state<float>(*opt, mname + ".absmax"), mname + ".absmax" + at);
    if (adam) {
      compare_codes(v.codes.download(), cpu_state<std::uint8_t>(*opt, vname + ".codes"), stats, vname + at);
      compare_absmax(v.absmax.download(), cpu_state<float>(*opt, vname + ".absmax"), vname + ".absmax" + at);
    }
  }
  EXPECT_TRUE(p.tail_intact() && g.tail_intact() && m.codes.tail_intact() && m.absmax.tail_intact());
  if (adam) {
    EXPECT_TRUE(v.codes.tail_intact() && v.absmax.tail_intact());
  }
}

void run_8bit_sizes(bool adam, std::uint32_t seed) {
  CodeStats stats;
  for (std::int64_t bs : {64, 256, 2048}) {
    const auto b = static_cast<std::size_t>(bs);
    for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{127}, std::size_t{1000}, std::size_t{4097},
                          3 * b + 5})
      run_8bit(adam, n, bs, 4, seed++, stats);
  }
  std::printf("[measured] %s: %zu of %zu codes differ from the CPU by one code (max allowed fraction %g)\n",
              adam ? "AdamW8bit" : "Lion8bit", stats.off_by_one, stats.total, kMaxCodeDiffFraction);
  ::testing::Test::RecordProperty("codes_off_by_one",
                                  std::to_string(stats.off_by_one) + "/" + std::to_string(stats.total));
  EXPECT_LE(double(stats.off_by_one), kMaxCodeDiffFraction * double(stats.total));
}

TEST(CudaOptim8bit, AdamW8bitMatchesCpuClass) {
  SKIP_WITHOUT_DEVICE();
  run_8bit_sizes(true, 500);
}

TEST(CudaOptim8bit, Lion8bitMatchesCpuClass) {
  SKIP_WITHOUT_DEVICE();
  run_8bit_sizes(false, 600);
}

TEST(CudaOptim8bit, ManyBlocksUseTheBlockStrideLoop) {
  SKIP_WITHOUT_DEVICE();
  CodeStats stats;
  run_8bit(true, 64 * 20000 + 5, 64, 2, 700, stats);  // 20001 blocks: more than the capped grid
  run_8bit(false, 4096 * 40 + 1, 4096, 2, 701, stats);  // 16 elements per thread
  std::printf("[measured] 8-bit large: %zu of %zu codes off by one\n", stats.off_by_one, stats.total);
  EXPECT_LE(double(stats.off_by_one), kMaxCodeDiffFraction * double(stats.total));
}

// ---- the kernels' encoder, on the CPU ----

// Floats that stress the bucket table: every decision midpoint and map value with 3 ulps either side,
// every bucket's first and last float and their outer neighbours, signed zeros, denormals, the clamp edges
// 2^-24 and 1, values beyond 1, infinities and NaNs, and a strided sweep of all floats in [2^-26, 2).
std::vector<float> encode_adversarial(const optim::detail::EncodeTable& t) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  std::vector<float> xs;
  auto around = [&](float c, int ulps) {
    float lo = c, hi = c;
    xs.push_back(c);
    for (int k = 0; k < ulps; ++k) {
      lo = std::nextafter(lo, -inf);
      hi = std::nextafter(hi, inf);
      xs.push_back(lo);
      xs.push_back(hi);
    }
  };
  for (int i = 0; i < 256; ++i) {
    around(t.map[i], 3);
    if (i < 255) around(static_cast<float>((double(t.map[i]) + t.map[i + 1]) / 2.0), 3);
  }
  const std::uint32_t low_mask = (1u << t.low_bits) - 1u;
  for (std::uint32_t b = 0; b < t.buckets; ++b) {
    const std::uint32_t lo_bits = cuda::quant::kEncodeLoBits + (b << t.low_bits);
    around(std::bit_cast<float>(lo_bits), 1);
    around(std::bit_cast<float>(lo_bits | low_mask), 1);
  }
  for (float c : {0.0f, std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                  std::bit_cast<float>(cuda::quant::kEncodeLoBits), std::bit_cast<float>(cuda::quant::kEncodeHiBits), 1.0f, 1.5f,
                  2.0f, 1e4f, std::numeric_limits<float>::max(), inf})
    around(c, 2);
  for (std::uint32_t u = 101u << 23; u < 128u << 23; u += 613) xs.push_back(std::bit_cast<float>(u));
  const std::size_t positive = xs.size();
  for (std::size_t i = 0; i < positive; ++i) xs.push_back(-xs[i]);
  for (std::uint32_t nan_bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu})
    xs.push_back(std::bit_cast<float>(nan_bits));
  return xs;
}

TEST(CudaOptimEncode, EncodeCodeEqualsTheBinarySearchOnTheCpu) {
  ASSERT_EQ(cuda::quant::kEncodeLoBits, optim::detail::kEncodeLoBits);
  ASSERT_EQ(cuda::quant::kEncodeHiBits, optim::detail::kEncodeHiBits);
  for (QuantMap m : {QuantMap::signed_dynamic, QuantMap::unsigned_dynamic}) {
    const optim::detail::EncodeTable& t = optim::detail::encode_table(m);
    ASSERT_EQ(t.map, optim::dynamic_map(m).data());
    EXPECT_EQ(t.zero_code, zero_code(m));
    const std::vector<float> xs = encode_adversarial(t);
    std::size_t mismatches = 0;
    for (float x : xs) {
      const std::uint8_t got = cuda::quant::encode_code(x, t.table, t.low_bits, t.buckets);
      const std::uint8_t want = optim::detail::quantize_nearest(x, t.map);
      if (got != want && ++mismatches <= 10)
        ADD_FAILURE() << "map " << int(m) << " x " << x << " (bits 0x" << std::hex << std::bit_cast<std::uint32_t>(x)
                      << std::dec << ") got " << int(got) << " want " << int(want);
    }
    EXPECT_EQ(mismatches, 0u) << "map " << int(m) << " over " << xs.size() << " values";
    // The kernels stage the unsigned map's positive half only: non-negative values must index it.
    if (m == QuantMap::unsigned_dynamic) {
      for (float x : xs) {
        if (!std::signbit(x)) {
          ASSERT_LT(cuda::quant::bucket_of(x, t.low_bits, t.buckets).index, t.buckets) << x;
        }
      }
    }
  }
}

// ---- quantize / dequantize against the CPU reference, bit for bit ----

// Test data for one block size: kind 0 = normal values with a random scale per block, 1 = all zero but one
// block, 2 = small values with one huge outlier, 3 = blocks led by 1.0 (scale exactly 1) holding every
// decision midpoint of the map and its two neighbouring floats (ties go to the lower code).
std::vector<float> quant_data(int kind, std::size_t n, std::size_t bs, QuantMap m, std::mt19937& rng) {
  const bool non_negative = m == QuantMap::unsigned_dynamic;
  std::vector<float> x(n, 0.0f);
  std::uniform_real_distribution<double> exponent(-6.0, 3.0);
  std::normal_distribution<double> d(0.0, 1.0);
  auto sample = [&](double scale) {
    const double v = d(rng) * scale;
    return static_cast<float>(non_negative ? v * v : v);
  };
  if (kind == 0) {
    for (std::size_t b = 0; b < n; b += bs) {
      const double scale = std::pow(10.0, exponent(rng));
      for (std::size_t i = b; i < std::min(n, b + bs); ++i) x[i] = sample(scale);
    }
  } else if (kind == 1) {
    const std::size_t b = (n / bs) / 2 * bs;  // a middle block (the only one when n <= bs)
    for (std::size_t i = b; i < std::min(n, b + bs); ++i) x[i] = sample(1.0);
  } else if (kind == 2) {
    for (auto& v : x) v = sample(1e-3);
    x[std::uniform_int_distribution<std::size_t>(0, n - 1)(rng)] = (rng() & 1) && !non_negative ? -1e4f : 1e4f;
  } else {
    const auto& map = optim::dynamic_map(m);
    std::vector<float> ties;
    for (int i = 0; i + 1 < 256; ++i) {
      const float mid = static_cast<float>((double(map[i]) + map[i + 1]) / 2.0);
      for (float t : {std::nextafter(mid, -2.0f), mid, std::nextafter(mid, 2.0f)}) ties.push_back(t);
    }
    std::size_t t = 0;
    for (std::size_t i = 0; i < n; ++i) x[i] = i % bs == 0 ? 1.0f : ties[t++ % ties.size()];
  }
  return x;
}

TEST(CudaQuant, QuantizeMatchesReferenceBitForBit) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(800);
  for (std::int64_t bs : {32, 64, 256, 2048, 4096}) {
    const auto b = static_cast<std::size_t>(bs);
    for (QuantMap m : {QuantMap::signed_dynamic, QuantMap::unsigned_dynamic}) {
      const float* map = optim::dynamic_map(m).data();
      for (int kind = 0; kind < 4; ++kind) {
        for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{127}, b - 1, b, b + 1, std::size_t{1000},
                              std::size_t{4097}, 5 * b + 7}) {
          SCOPED_TRACE("block " + std::to_string(bs) + " map " + std::to_string(int(m)) + " kind " +
                       std::to_string(kind) + " n " + std::to_string(n));
          const std::vector<float> x = quant_data(kind, n, b, m, rng);
          const std::size_t nb = (n + b - 1) / b;
          std::vector<std::uint8_t> want_codes(n);
          std::vector<float> want_absmax(nb);
          for (std::size_t k = 0; k < nb; ++k) {
            const std::size_t off = k * b, len = std::min(b, n - off);
            want_absmax[k] = optim::detail::quantize_block_reference(x.data() + off, static_cast<std::int64_t>(len),
                                                                     map, want_codes.data() + off);
          }
          DeviceArray<float> src(n), absmax(nb);
          DeviceArray<std::uint8_t> codes(n);
          src.upload(x);
          // Two poisons: an unwritten code would keep one of them.
          for (unsigned char poison : {0x00, 0xFF}) {
            codes.poison(poison);
            absmax.poison(0xFF);
            cuda::quantize_blockwise(src.get(), codes.get(), absmax.get(), n, bs, m, 0);
            ASSERT_EQ(codes.download(), want_codes);
            const std::vector<float> got_absmax = absmax.download();
            for (std::size_t k = 0; k < nb; ++k)
              ASSERT_EQ(std::bit_cast<std::uint32_t>(got_absmax[k]), std::bit_cast<std::uint32_t>(want_absmax[k]))
                  << "block " << k << " got " << got_absmax[k] << " want " << want_absmax[k];
          }
          EXPECT_TRUE(src.tail_intact() && codes.tail_intact() && absmax.tail_intact());
        }
      }
    }
  }
}

TEST(CudaQuant, DequantizeMatchesReferenceBitForBit) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(900);
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> scale(0.0f, 10.0f);
  for (std::int64_t bs : {32, 64, 256, 2048, 4096}) {
    const auto b = static_cast<std::size_t>(bs);
    for (QuantMap m : {QuantMap::signed_dynamic, QuantMap::unsigned_dynamic}) {
      for (std::size_t n : {std::size_t{1}, std::size_t{127}, b + 1, std::size_t{4097}, 5 * b + 7}) {
        const std::size_t nb = (n + b - 1) / b;
        std::vector<std::uint8_t> c(n);
        for (auto& v : c) v = static_cast<std::uint8_t>(byte(rng));
        std::vector<float> a(nb);
        for (std::size_t k = 0; k < nb; ++k) a[k] = k % 4 == 1 ? 0.0f : scale(rng);
        std::vector<float> want(n);
        for (std::size_t k = 0; k < nb; ++k) {
          const std::size_t off = k * b;
          optim::detail::dequantize_block(c.data() + off, static_cast<std::int64_t>(std::min(b, n - off)), a[k],
                                          optim::dynamic_map(m).data(), want.data() + off);
        }
        DeviceArray<std::uint8_t> codes(n);
        DeviceArray<float> absmax(nb), dst(n);
        codes.upload(c);
        absmax.upload(a);
        dst.poison(0xFF);  // NaN
        cuda::dequantize_blockwise(codes.get(), absmax.get(), dst.get(), n, bs, m, 0);
        const std::vector<float> got = dst.download();
        for (std::size_t i = 0; i < n; ++i)
          ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want[i]))
              << "block " << bs << " n " << n << " element " << i;
        EXPECT_TRUE(codes.tail_intact() && absmax.tail_intact() && dst.tail_intact());
      }
    }
  }
}

TEST(CudaQuant, RoundTripThroughTheDeviceMatchesTheCpuState) {
  SKIP_WITHOUT_DEVICE();
  // QuantizedState (the CPU class the optimizers use) and the device agree on codes, absmax and values.
  std::mt19937 rng(950);
  const std::int64_t n = 256 * 9 + 3;
  const std::vector<float> x = normal(static_cast<std::size_t>(n), 0.05, rng);
  optim::QuantizedState q(n, QuantMap::signed_dynamic, 256);
  q.quantize(x.data());
  std::vector<float> want(x.size());
  q.dequantize(want.data());
  DeviceArray<float> src(x.size()), absmax(static_cast<std::size_t>(q.num_blocks())), back(x.size());
  DeviceArray<std::uint8_t> codes(x.size());
  src.upload(x);
  cuda::quantize_blockwise(src.get(), codes.get(), absmax.get(), x.size(), 256, QuantMap::signed_dynamic, 0);
  cuda::dequantize_blockwise(codes.get(), absmax.get(), back.get(), x.size(), 256, QuantMap::signed_dynamic, 0);
  EXPECT_EQ(codes.download(), values_of<std::uint8_t>(q.codes()));
  EXPECT_EQ(absmax.download(), values_of<float>(q.absmax()));
  EXPECT_EQ(back.download(), want);
}

// ---- non-finite gradients: skipped with everything untouched, as Optimizer::step does ----

TEST(CudaOptim, NonFiniteGradientLeavesParamAndStateUntouched) {
  SKIP_WITHOUT_DEVICE();
  const std::size_t n = 1000, nb = 4;
  const std::int64_t bs = 256;
  std::mt19937 rng(1000);
  std::uniform_int_distribution<int> byte(0, 255);
  auto random_codes = [&] {
    std::vector<std::uint8_t> c(n);
    for (auto& v : c) v = static_cast<std::uint8_t>(byte(rng));
    return c;
  };
  const std::vector<float> p0 = normal(n, 1.0, rng), s0 = normal(n, 0.1, rng), s1 = normal(n, 0.1, rng);
  std::vector<float> s1_sq(s1);
  for (auto& v : s1_sq) v = v * v;
  const std::vector<std::uint8_t> c0 = random_codes(), c1 = random_codes();
  const std::vector<float> a0 = normal(nb, 1.0, rng), a1 = {0.5f, 0.25f, 2.0f, 1.0f};
  DeviceArray<float> p(n), g(n), m(n), v(n), ma(nb), va(nb);
  DeviceArray<std::uint8_t> mc(n), vc(n);
  auto reset = [&] {
    p.upload(p0);
    m.upload(s0);
    v.upload(s1_sq);
    mc.upload(c0);
    vc.upload(c1);
    ma.upload(a0);
    va.upload(a1);
  };
  auto expect_untouched = [&](const std::string& what) {
    EXPECT_EQ(p.download(), p0) << what;
    EXPECT_EQ(m.download(), s0) << what;
    EXPECT_EQ(v.download(), s1_sq) << what;
    EXPECT_EQ(mc.download(), c0) << what;
    EXPECT_EQ(vc.download(), c1) << what;
    EXPECT_EQ(ma.download(), a0) << what;
    EXPECT_EQ(va.download(), a1) << what;
  };
  const cuda::SgdHyper sgd{0.1, 0.01, 0.9, true, 3};
  const cuda::AdamWHyper adam{1e-2, 0.1, 0.9, 0.999, 1e-8, 3};
  const cuda::LionHyper lion{1e-3, 0.1, 0.9, 0.99};
  const std::vector<std::pair<std::string, std::function<void()>>> steps = {
      {"sgd", [&] { cuda::sgd_step(p.get(), g.get(), m.get(), n, sgd, 0); }},
      {"adamw", [&] { cuda::adamw_step(p.get(), g.get(), m.get(), v.get(), n, adam, 0); }},
      {"lion", [&] { cuda::lion_step(p.get(), g.get(), m.get(), n, lion, 0); }},
      {"adamw8bit",
       [&] { cuda::adamw8bit_step(p.get(), g.get(), mc.get(), ma.get(), vc.get(), va.get(), n, bs, adam, 0); }},
      {"lion8bit", [&] { cuda::lion8bit_step(p.get(), g.get(), mc.get(), ma.get(), n, bs, lion, 0); }},
  };
  const float inf = std::numeric_limits<float>::infinity();
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), inf, -inf}) {
    std::vector<float> grad = normal(n, 1.0, rng);
    grad[537] = bad;
    g.upload(grad);
    EXPECT_FALSE(cuda::grad_is_finite(g.get(), n, 0));
    for (const auto& [name, step] : steps) {
      reset();
      step();
      expect_untouched(name + " with gradient " + std::to_string(bad));
    }
  }
  // The flag does not stick: a finite gradient after a skipped step updates again.
  const std::vector<float> good = normal(n, 1.0, rng);
  g.upload(good);
  EXPECT_TRUE(cuda::grad_is_finite(g.get(), n, 0));
  EXPECT_TRUE(cuda::grad_is_finite(nullptr, 0, 0));
  for (const auto& [name, step] : steps) {
    reset();
    step();
    EXPECT_NE(p.download(), p0) << name << " did not update after a skipped step";
  }
  // The CPU optimizers skip the same way (the rule mirrored here).
  Tensor param = make_param(p0);
  optim::AdamW cpu({group_of(param, 1e-2, 0.1, 0.9, 0.999)});
  std::vector<float> grad = good;
  grad[3] = std::numeric_limits<float>::quiet_NaN();
  param.set_grad(tensor<float>(grad, {static_cast<std::int64_t>(n)}));
  EXPECT_EQ(cpu.step().skipped_nonfinite, 1);
  EXPECT_EQ(values_of<float>(param), p0);
  // With the gate off the NaN reaches the parameter: the gate is what protects it.
  grad = good;
  grad[3] = std::numeric_limits<float>::quiet_NaN();
  g.upload(grad);
  reset();
  cuda::AdamWHyper ungated = adam;
  ungated.skip_nonfinite = false;
  cuda::adamw_step(p.get(), g.get(), m.get(), v.get(), n, ungated, 0);
  const std::vector<float> after = p.download();
  EXPECT_TRUE(std::isnan(after[3]));
  EXPECT_FALSE(std::isnan(after[4]));
}

// ---- argument errors: thrown before the device is touched (these run everywhere) ----

template <typename F>
void expect_error(F&& f, const std::string& op, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << op << " did not throw (expected '" << fragment << "')";
  } catch (const Error& e) {
    if (!cuda::built_with_cuda()) return;  // the stubs throw "built without CUDA" instead
    const std::string what = e.what();
    EXPECT_EQ(what.rfind(op + ": ", 0), 0u) << what;
    EXPECT_NE(what.find(fragment), std::string::npos) << what;
  }
}

TEST(CudaOptimArgs, BadArgumentsThrowBeforeTouchingTheDevice) {
  // Host arrays stand in for device pointers: every call must throw before using them.
  float f[8] = {};
  std::uint8_t u[8] = {};
  const cuda::AdamWHyper adam;
  const cuda::LionHyper lion;
  const cuda::SgdHyper sgd;
  expect_error([&] { cuda::adamw_step(nullptr, f, f, f, 8, adam, 0); }, "cuda::adamw_step", "null pointer");
  expect_error([&] { cuda::adamw_step(f, f, nullptr, f, 8, adam, 0); }, "cuda::adamw_step", "null pointer");
  expect_error([&] { cuda::lion_step(f, nullptr, f, 8, lion, 0); }, "cuda::lion_step", "null pointer");
  expect_error([&] { cuda::sgd_step(f, f, nullptr, 8, cuda::SgdHyper{0.1, 0.0, 0.9}, 0); }, "cuda::sgd_step",
               "momentum buffer");
  expect_error([&] { cuda::sgd_step(f, f, f, 8, cuda::SgdHyper{0.1, 0.0, 0.0, true}, 0); }, "cuda::sgd_step",
               "Nesterov");
  expect_error([&] { cuda::sgd_step(f, f, f, 8, cuda::SgdHyper{0.1, 0.0, -0.5}, 0); }, "cuda::sgd_step", "momentum");
  expect_error([&] { cuda::adamw8bit_step(f, f, u, nullptr, u, f, 8, 256, adam, 0); }, "cuda::adamw8bit_step",
               "null pointer");
  expect_error([&] { cuda::lion8bit_step(f, f, nullptr, f, 8, 256, lion, 0); }, "cuda::lion8bit_step",
               "null pointer");
  for (std::int64_t bs : {0, -256, 16, 100, 255, 8192}) {
    expect_error([&] { cuda::adamw8bit_step(f, f, u, f, u, f, 8, bs, adam, 0); }, "cuda::adamw8bit_step",
                 "block_size");
    expect_error([&] { cuda::lion8bit_step(f, f, u, f, 8, bs, lion, 0); }, "cuda::lion8bit_step", "block_size");
    expect_error([&] { cuda::quantize_blockwise(f, u, f, 8, bs, QuantMap::signed_dynamic, 0); },
                 "cuda::quantize_blockwise", "block_size");
    expect_error([&] { cuda::dequantize_blockwise(u, f, f, 8, bs, QuantMap::unsigned_dynamic, 0); },
                 "cuda::dequantize_blockwise", "block_size");
  }
  expect_error([&] { cuda::quantize_blockwise(f, u, f, 8, 256, static_cast<QuantMap>(7), 0); },
               "cuda::quantize_blockwise", "QuantMap");
  expect_error([&] { cuda::quantize_blockwise(f, nullptr, f, 8, 256, QuantMap::signed_dynamic, 0); },
               "cuda::quantize_blockwise", "null pointer");
  expect_error([&] { cuda::dequantize_blockwise(u, nullptr, f, 8, 256, QuantMap::signed_dynamic, 0); },
               "cuda::dequantize_blockwise", "null pointer");
  expect_error([&] { cuda::grad_is_finite(nullptr, 8, 0); }, "cuda::grad_is_finite", "null pointer");
  // Hyper-parameters are checked as the CPU classes check them, plus the 1-based step.
  expect_error([&] { cuda::adamw_step(f, f, f, f, 8, cuda::AdamWHyper{1e-3, 0.0, 1.0}, 0); }, "cuda::adamw_step",
               "betas");
  expect_error([&] { cuda::adamw_step(f, f, f, f, 8, cuda::AdamWHyper{1e-3, 0.0, 0.9, 0.999, -1.0}, 0); },
               "cuda::adamw_step", "eps");
  const cuda::AdamWHyper step0{1e-3, 0.0, 0.9, 0.999, 1e-8, 0};
  expect_error([&] { cuda::adamw8bit_step(f, f, u, f, u, f, 8, 256, step0, 0); }, "cuda::adamw8bit_step", "step");
  expect_error([&] { cuda::lion_step(f, f, f, 8, cuda::LionHyper{1e-4, 0.0, 1.5}, 0); }, "cuda::lion_step", "betas");
  expect_error([&] { cuda::sgd_step(f, f, f, 8, cuda::SgdHyper{0.1, 0.0, 0.9, false, 0}, 0); }, "cuda::sgd_step",
               "step");
  EXPECT_TRUE(cuda::quant_block_size_supported(32) && cuda::quant_block_size_supported(4096));
  EXPECT_FALSE(cuda::quant_block_size_supported(48) || cuda::quant_block_size_supported(8192));
}

TEST(CudaOptimArgs, ZeroElementsIsANoOp) {
  if (!cuda::built_with_cuda()) GTEST_SKIP() << "the stubs throw for every call";
  // No pointers are needed and no device is touched (this passes without a GPU too).
  EXPECT_NO_THROW(cuda::sgd_step(nullptr, nullptr, nullptr, 0, cuda::SgdHyper{0.1, 0.0, 0.9}, 0));
  EXPECT_NO_THROW(cuda::adamw_step(nullptr, nullptr, nullptr, nullptr, 0, cuda::AdamWHyper{}, 0));
  EXPECT_NO_THROW(cuda::lion_step(nullptr, nullptr, nullptr, 0, cuda::LionHyper{}, 0));
  EXPECT_NO_THROW(cuda::adamw8bit_step(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 256,
                                       cuda::AdamWHyper{}, 0));
  EXPECT_NO_THROW(cuda::lion8bit_step(nullptr, nullptr, nullptr, nullptr, 0, 2048, cuda::LionHyper{}, 0));
  EXPECT_NO_THROW(cuda::quantize_blockwise(nullptr, nullptr, nullptr, 0, 64, QuantMap::signed_dynamic, 0));
  EXPECT_NO_THROW(cuda::dequantize_blockwise(nullptr, nullptr, nullptr, 0, 64, QuantMap::unsigned_dynamic, 0));
  EXPECT_TRUE(cuda::grad_is_finite(nullptr, 0, 0));
}

}  // namespace
}  // namespace memtrain

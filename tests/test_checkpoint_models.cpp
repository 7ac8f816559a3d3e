// Checkpoint policies on the GPT and CNN models: bit-identical training, ordered activation peaks, budgets
// kept; the budget planner against brute force; policy strings.
#include "memtrain/autograd/engine.h"
#include "memtrain/ckpt/policy.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/nn/cnn.h"
#include "memtrain/nn/efficientnet.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/nn.h"
#include "memtrain/optim/adamw.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

namespace memtrain {
namespace {

using ckpt::Policy;

nn::GPTConfig small_gpt() {
  nn::GPTConfig c;
  c.vocab_size = 97;
  c.block_size = 16;
  c.n_layer = 4;
  c.n_head = 2;
  c.n_embd = 32;
  c.dropout = 0.1;
  return c;
}

Tensor random_tokens(const Shape& shape, std::int64_t vocab, std::uint32_t seed) {
  std::mt19937 gen(seed);
  Tensor t = Tensor::empty(shape, DType::i64);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<std::int64_t>()[i] = static_cast<std::int64_t>(gen() % vocab);
  return t;
}

// Losses of each step, then every parameter gradient of the last step, then the final parameters.
std::vector<Tensor> train_gpt(const Policy& policy, int steps) {
  manual_seed(21);
  nn::GPT model(small_gpt());
  model.set_checkpointing(policy);
  optim::AdamW opt({optim::ParamGroup{.params = model.parameters(), .lr = 1e-2}});
  const Tensor idx = random_tokens({3, 16}, 97, 1), targets = random_tokens({3, 16}, 97, 2);
  std::vector<Tensor> out;
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    const Tensor loss = model.loss(idx, targets);
    loss.backward();
    out.push_back(loss.detach().clone());
    if (s + 1 < steps) opt.step();
  }
  for (const Tensor& p : model.parameters()) out.push_back(p.grad().clone());
  for (const Tensor& p : model.parameters()) out.push_back(p.detach().clone());
  return out;
}

void expect_bit_identical(const std::vector<Tensor>& a, const std::vector<Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].defined() && b[i].defined()) << what << ": tensor " << i;
    ASSERT_EQ(a[i].shape(), b[i].shape()) << what << ": tensor " << i;
    const Tensor x = a[i].contiguous(), y = b[i].contiguous();
    ASSERT_EQ(std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * dtype_size(x.dtype())), 0)
        << what << ": tensor " << i << " differs";
  }
}

TEST(CheckpointModels, GptEveryPolicyTrainsBitIdentically) {
  const std::vector<Tensor> reference = train_gpt(Policy::none(), 2);
  for (const Policy& p : {Policy::full(), Policy::every(2), Policy::selective(), Policy::selective({"linear"}),
                          Policy::budget(std::size_t{40} << 10)}) {
    expect_bit_identical(train_gpt(p, 2), reference, p.to_string());
  }
}

// Keeping attention and the MLP's fc output but recomputing the qkv projection (op labels): still bit-identical
// over several steps with dropout on, the parameters moving in between.
TEST(CheckpointModels, GptLabelledSelectiveTrainsBitIdentically) {
  const std::vector<Tensor> reference = train_gpt(Policy::none(), 4);
  for (const char* policy : {"selective:scaled_dot_product_attention,linear@mlp.fc",
                             "selective:scaled_dot_product_attention,linear@attn.qkv,@mlp.fc"}) {
    expect_bit_identical(train_gpt(Policy::parse(policy), 4), reference, policy);
  }
}

// What each policy computes again in backward, by FLOPs of the block's GEMMs and attention (the figures from
// the config, not from the library): a re-run stops once mlp.proj's input is saved again, so mlp.proj's GEMM
// is never redone; selective redoes attn.proj only (ln_2 needs the residual it feeds).
TEST(CheckpointModels, GptRerunsRecomputeOnlyWhatBackwardNeeds) {
  const nn::GPTConfig c = small_gpt();
  const double B = 3, T = 16, N = B * T, C = static_cast<double>(c.n_embd), H = static_cast<double>(c.n_head);
  const double qkv = 2 * N * 3 * C * C, proj = 2 * N * C * C, fc = 2 * N * 4 * C * C;
  const double attention = 4 * B * H * T * T * (C / H) * 0.5;  // causal: half the scores
  const double layers = static_cast<double>(c.n_layer);
  const std::vector<std::pair<const char*, double>> expected = {
      {"none", 0.0},
      {"full", layers * (qkv + attention + proj + fc)},
      {"every:2", layers / 2 * (qkv + attention + proj + fc)},
      {"selective", layers * proj},
      {"selective:scaled_dot_product_attention,linear@mlp.fc", layers * (qkv + proj)},
  };
  const Tensor idx = random_tokens({3, 16}, 97, 1), targets = random_tokens({3, 16}, 97, 2);
  for (const auto& [policy, flops] : expected) {
    manual_seed(21);
    nn::GPT model(c);
    model.set_checkpointing(Policy::parse(policy));
    const ckpt::Counters before = ckpt::counters();
    model.loss(idx, targets).backward();
    EXPECT_DOUBLE_EQ(ckpt::counters().recomputed_flops - before.recomputed_flops, flops) << policy;
  }
}

// Losses and gradients of the CNN with batch norm inside the regions: the running statistics must be
// updated once per forward, not again by the re-run.
TEST(CheckpointModels, CnnEveryPolicyTrainsBitIdenticallyAndBatchNormCountsOnce) {
  auto run = [](const Policy& policy) {
    manual_seed(5);
    nn::CNNConfig c;
    c.image_size = 8;
    c.conv1_channels = 4;
    c.conv2_channels = 6;
    c.hidden = 16;
    c.dropout = 0.2;
    nn::CNN model(c);
    model.set_checkpointing(policy);
    const Tensor x = randn({5, 1, 8, 8});
    const Tensor y = random_tokens({5}, 10, 3);
    std::vector<Tensor> out;
    for (int s = 0; s < 2; ++s) {
      autograd::zero_grad(model.parameters());
      const Tensor loss = model.loss(x, y);
      loss.backward();
      out.push_back(loss.detach().clone());
    }
    for (const Tensor& p : model.parameters()) out.push_back(p.grad().clone());
    for (const auto& [name, b] : model.named_buffers()) out.push_back(b.clone());
    return out;
  };
  const std::vector<Tensor> reference = run(Policy::none());
  for (const Policy& p : {Policy::full(), Policy::every(2), Policy::selective()}) {
    expect_bit_identical(run(p), reference, p.to_string());
  }
}

// The same on the EfficientNet: MBConv blocks (depthwise convolutions, squeeze-and-excitation, batch norm,
// residuals) as the regions, for both SiLU kinds; two steps of AdamW so the second forward sees moved weights.
TEST(CheckpointModels, EfficientNetEveryPolicyTrainsBitIdentically) {
  for (const auto silu : {nn::SiluKind::saves_input, nn::SiluKind::saves_output}) {
    auto run = [silu](const Policy& policy) {
      manual_seed(8);
      nn::EfficientNetConfig c;
      c.image_size = 12;
      c.width_mult = 0.25;
      c.min_feature_size = 3;  // 12 -> 6 -> 3: the strided blocks too
      c.depth_mult = 0.34;  // stages of one block, two for the four-block stage
      c.head_channels = 16;
      c.dropout = 0.2;
      c.silu = silu;
      nn::EfficientNet model(c);
      model.set_checkpointing(policy);
      optim::AdamW opt({optim::ParamGroup{.params = model.parameters(), .lr = 1e-2}});
      const Tensor x = randn({4, 1, 12, 12});
      const Tensor y = random_tokens({4}, 10, 3);
      std::vector<Tensor> out;
      for (int s = 0; s < 2; ++s) {
        opt.zero_grad();
        const Tensor loss = model.loss(x, y);
        loss.backward();
        out.push_back(loss.detach().clone());
        if (s == 0) opt.step();
      }
      for (const Tensor& p : model.parameters()) out.push_back(p.grad().clone());
      for (const auto& [name, b] : model.named_buffers()) out.push_back(b.clone());
      return out;
    };
    const std::vector<Tensor> reference = run(Policy::none());
    for (const Policy& p : {Policy::full(), Policy::every(3), Policy::selective()})
      expect_bit_identical(run(p), reference, p.to_string());
  }
}

// Peak live activation bytes (forward and backward of one step) under a policy.
std::size_t activation_peak(const Policy& policy, nn::GPT& model, const Tensor& idx, const Tensor& targets) {
  model.set_checkpointing(policy);
  model.zero_grad();
  if (policy.kind == Policy::Kind::budget) {  // the first step profiles and plans; measure the second
    CategoryGuard category(MemoryCategory::activations);
    model.loss(idx, targets).backward();
    model.zero_grad();
  }
  Allocator& a = Allocator::get(Device::cpu());
  a.reset_peak();
  {
    CategoryGuard category(MemoryCategory::activations);
    model.loss(idx, targets).backward();
  }
  model.zero_grad();
  return a.stats()[MemoryCategory::activations].peak_bytes;
}

TEST(CheckpointModels, GptActivationPeaksAreOrderedAndBudgetsHold) {
  manual_seed(3);
  nn::GPTConfig c = small_gpt();
  c.n_layer = 6;
  c.n_embd = 64;
  c.block_size = 64;
  nn::GPT model(c);
  const Tensor idx = random_tokens({4, 64}, c.vocab_size, 7), targets = random_tokens({4, 64}, c.vocab_size, 8);
  const std::size_t none = activation_peak(Policy::none(), model, idx, targets);
  const std::size_t selective = activation_peak(Policy::selective(), model, idx, targets);
  const std::size_t full = activation_peak(Policy::full(), model, idx, targets);
  const std::size_t labelled =
      activation_peak(Policy::parse("selective:scaled_dot_product_attention,linear@mlp.fc"), model, idx, targets);
  EXPECT_GT(none, selective);
  EXPECT_GT(selective, labelled);  // the qkv projection's output [B, T, 3C] per block is no longer kept
  EXPECT_GT(labelled, full);

  // A budget between full and none: the plan fits it, and the measured peak exceeds the all-full peak by no
  // more than the budget (the full peak already holds one block's working set during its re-run).
  for (const double fraction : {0.25, 0.6}) {
    const auto budget = static_cast<std::size_t>(fraction * static_cast<double>(none - full));
    const std::size_t peak = activation_peak(Policy::budget(budget), model, idx, targets);
    ASSERT_TRUE(model.checkpointing().plan().has_value());
    const ckpt::Plan& plan = *model.checkpointing().plan();
    EXPECT_TRUE(plan.feasible) << plan.describe();
    EXPECT_LE(plan.kept_bytes, budget) << plan.describe();
    EXPECT_LE(peak, full + budget) << plan.describe();
    EXPECT_LT(peak, none) << plan.describe();
  }
}

TEST(CheckpointModels, FusedLossEqualsTheLogitsPath) {
  manual_seed(13);
  nn::GPT model(small_gpt());
  model.eval();  // no dropout: both paths see the same activations
  const Tensor idx = random_tokens({2, 16}, 97, 4), targets = random_tokens({2, 16}, 97, 5);
  const Tensor fused = model.loss(idx, targets);
  fused.backward();
  std::vector<Tensor> fused_grads;
  for (const Tensor& p : model.parameters()) fused_grads.push_back(p.grad().clone());
  model.zero_grad();
  const Tensor logits = model.forward(idx);
  const Tensor plain = ops::cross_entropy(logits.reshape({32, 97}), targets.reshape({32}));
  plain.backward();
  EXPECT_NEAR(fused.item<float>(), plain.item<float>(), 1e-5 * std::abs(plain.item<float>()));
  const std::vector<Tensor> params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor a = fused_grads[i].contiguous(), b = params[i].grad().contiguous();
    float max_b = 0, max_diff = 0;
    for (std::int64_t k = 0; k < a.numel(); ++k) {
      max_b = std::max(max_b, std::abs(b.data<float>()[k]));
      max_diff = std::max(max_diff, std::abs(a.data<float>()[k] - b.data<float>()[k]));
    }
    EXPECT_LE(max_diff, 1e-5f * std::max(max_b, 1e-3f)) << "parameter " << i;
  }
}

// The knapsack against every assignment of modes, on random profiles.
TEST(CheckpointPlan, BudgetPlanIsOptimalAgainstBruteForce) {
  std::mt19937 gen(17);
  std::uniform_int_distribution<std::size_t> bytes(1000, 100000);
  std::uniform_real_distribution<double> flops(1e5, 1e7);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<ckpt::RegionProfile> profiles(6);
    for (auto& p : profiles) {
      p.input_bytes = bytes(gen) / 10;
      p.expensive_bytes = bytes(gen);
      p.cheap_saved_bytes = bytes(gen);
      p.saved_bytes = p.expensive_bytes / 2 + p.cheap_saved_bytes;
      p.expensive_flops = flops(gen);
    }
    const std::size_t budget = bytes(gen) * 3;
    double best = std::numeric_limits<double>::infinity();
    for (int code = 0; code < 729; ++code) {
      std::size_t kept = 0;
      double cost = 0;
      for (int r = 0, k = code; r < 6; ++r, k /= 3) {
        const ckpt::RegionCost rc = ckpt::region_cost(profiles[r], static_cast<ckpt::RegionMode>(k % 3));
        kept += rc.kept_bytes;
        cost += rc.recompute;
      }
      if (kept <= budget) best = std::min(best, cost);
    }
    const ckpt::Plan plan = ckpt::plan_budget(profiles, budget);
    if (best == std::numeric_limits<double>::infinity()) {
      EXPECT_FALSE(plan.feasible);
      continue;
    }
    ASSERT_TRUE(plan.feasible);
    EXPECT_LE(plan.kept_bytes, budget);
    // Sizes round up to 1/4096 of the budget, so the plan may miss the optimum by what that rounding excludes;
    // with these sizes it finds it.
    EXPECT_NEAR(plan.recompute, best, 1e-9 * best + 1e-9) << "trial " << trial;
  }
}

TEST(CheckpointPlan, PolicyStringsRoundTripAndBadOnesAreRefused) {
  for (const char* text : {"none", "full", "every:3", "selective", "selective:matmul,linear", "budget:64MiB",
                           "budget:1000", "selective:scaled_dot_product_attention,linear@mlp.fc",
                           "selective:@attn.q,matmul@attn.k,linear"}) {
    EXPECT_EQ(Policy::parse(text).to_string(), text);
  }
  EXPECT_EQ(Policy::parse("selective:linear@mlp.fc").keep_ops, std::vector<std::string>{"linear@mlp.fc"});
  for (const char* bad_entry : {"linear@", "@", "a@b@c"}) {
    const std::string text = std::string("selective:sdpa,") + bad_entry;
    try {
      Policy::parse(text);
      ADD_FAILURE() << "accepted " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad_entry + "'"), std::string::npos) << e.what();
    }
    EXPECT_THROW(Policy::selective({bad_entry}), Error) << bad_entry;
  }
  EXPECT_EQ(Policy::parse("budget:2KiB").budget_bytes, 2048u);
  for (const char* bad : {"", "fulll", "every:0", "every:x", "budget:", "budget:-5", "selective:", "selective:a,,b",
                          "none:1"}) {
    EXPECT_THROW(Policy::parse(bad), Error) << bad;
  }
}

}  // namespace
}  // namespace memtrain

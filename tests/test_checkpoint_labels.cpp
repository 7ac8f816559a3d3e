// Op labels (ckpt::OpLabel) and keep-list entries that use them: scoping, matching, what a labelled selective
// region keeps, the labels the GPT and LLaMA modules set, and labelled policies training bit-identically.
#include "memtrain/autograd/engine.h"
#include "memtrain/autograd/grad_mode.h"
#include "memtrain/autograd/node.h"
#include "memtrain/ckpt/checkpoint.h"
#include "memtrain/ckpt/op_label.h"
#include "memtrain/ckpt/policy.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/nn/causal_self_attention.h"
#include "memtrain/nn/llama.h"
#include "memtrain/nn/llama_attention.h"
#include "memtrain/nn/mlp.h"
#include "memtrain/nn/swiglu.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/linalg.h"
#include "memtrain/ops/reduce.h"
#include "memtrain/optim/adamw.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

namespace memtrain {
namespace {

using ckpt::current_op_label;
using ckpt::OpLabel;

ckpt::RegionOptions keeping(std::vector<std::string> keep_ops) {
  ckpt::RegionOptions options;
  options.keep_ops = std::move(keep_ops);
  return options;
}

TEST(CheckpointLabels, LabelsNestByReplacingAndRestore) {
  EXPECT_EQ(current_op_label(), "");
  {
    const OpLabel outer("attn.qkv");
    EXPECT_EQ(current_op_label(), "attn.qkv");
    {
      const OpLabel inner("mlp.fc");
      EXPECT_EQ(current_op_label(), "mlp.fc");  // replaced, not "attn.qkv.mlp.fc"
      {
        const OpLabel none("");
        EXPECT_EQ(current_op_label(), "");
      }
      EXPECT_EQ(current_op_label(), "mlp.fc");
    }
    EXPECT_EQ(current_op_label(), "attn.qkv");
    // Another thread has labels of its own.
    std::string seen = "unset";
    std::thread([&] { seen = std::string(current_op_label()); }).join();
    EXPECT_EQ(seen, "");
  }
  EXPECT_EQ(current_op_label(), "");
}

TEST(CheckpointLabels, ExceptionUnwindingRestoresTheLabel) {
  const OpLabel outer("outer");
  try {
    const OpLabel inner("inner");
    throw std::runtime_error("boom");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(current_op_label(), "outer");
  EXPECT_THROW(ckpt::labelled("inner", []() -> int { throw std::runtime_error("boom"); }), std::runtime_error);
  EXPECT_EQ(current_op_label(), "outer");
  EXPECT_EQ(ckpt::labelled("inner", [] { return std::string(current_op_label()); }), "inner");
  EXPECT_EQ(current_op_label(), "outer");
}

TEST(CheckpointLabels, KeepEntriesMatchOpsAndLabels) {
  using ckpt::keep_entry_matches;
  EXPECT_TRUE(keep_entry_matches("linear", "linear", ""));
  EXPECT_TRUE(keep_entry_matches("linear", "linear", "mlp.fc"));  // a plain name ignores labels
  EXPECT_FALSE(keep_entry_matches("linear", "matmul", "mlp.fc"));
  EXPECT_TRUE(keep_entry_matches("linear@mlp.fc", "linear", "mlp.fc"));
  EXPECT_FALSE(keep_entry_matches("linear@mlp.fc", "linear", "mlp.proj"));
  EXPECT_FALSE(keep_entry_matches("linear@mlp.fc", "linear", ""));
  EXPECT_FALSE(keep_entry_matches("linear@mlp.fc", "matmul", "mlp.fc"));
  EXPECT_FALSE(keep_entry_matches("linear@mlp", "linear", "mlp.fc"));  // labels match whole, not by prefix
  EXPECT_TRUE(keep_entry_matches("@mlp.fc", "linear", "mlp.fc"));
  EXPECT_TRUE(keep_entry_matches("@mlp.fc", "matmul", "mlp.fc"));
  EXPECT_FALSE(keep_entry_matches("@mlp.fc", "matmul", ""));
}

TEST(CheckpointLabels, MalformedEntriesThrowNamingThem) {
  for (const char* bad : {"linear@", "@", "a@b@c", "@@x"}) {
    try {
      ckpt::check_keep_entry(bad, "where");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(ckpt::check_keep_entry("", "where"), Error);
  for (const char* good : {"linear", "linear@mlp.fc", "@attn.q"}) EXPECT_NO_THROW(ckpt::check_keep_entry(good, "w"));
  // A region refuses them too, before running anything.
  const Tensor x = randn({2, 2}).set_requires_grad();
  int calls = 0;
  const ckpt::RegionFn fn = [&](const std::vector<Tensor>& in) {
    ++calls;
    return std::vector<Tensor>{ops::tanh(in[0])};
  };
  EXPECT_THROW(ckpt::checkpoint(fn, {x}, keeping({"linear@"})), Error);
  EXPECT_THROW(ckpt::checkpoint(fn, {x}, ckpt::RegionOptions{{}, {"a@b@c"}}), Error);
  EXPECT_EQ(calls, 0);
}

// Two expensive ops of one kind under two labels: only the one the entry names is handed back to the re-run.
TEST(CheckpointLabels, ReRunReplaysOnlyTheLabelledOp) {
  struct Case {
    std::vector<std::string> keep;
    int computed_a, computed_b;  // forward + re-run computations of each op
  };
  for (const Case& c : {Case{{"costly@a"}, 1, 2}, Case{{"costly@b"}, 2, 1}, Case{{"costly"}, 1, 1},
                        Case{{"@b"}, 2, 1}, Case{{"other@a"}, 2, 2}}) {
    int computed_a = 0, computed_b = 0;
    const Tensor x = randn({4, 4}).set_requires_grad();
    // An op built like matmul: compute (or replay) without a graph, then record its own node.
    const auto costly = [](const Tensor& in, int& counter) {
      const Tensor h = ckpt::detail::compute_or_replay("costly", 1.0, [&] {
        ++counter;
        autograd::NoGradGuard no_grad;
        return std::vector<Tensor>{ops::mul(in, 3.0)};
      })[0];
      autograd::record("costly", {in}, {h},
                       [](const std::vector<Tensor>& g) { return std::vector<Tensor>{ops::mul(g[0], 3.0)}; });
      return h;
    };
    const auto fn = [&](const Tensor& in) {
      const Tensor a = ckpt::labelled("a", [&] { return costly(in, computed_a); });
      const Tensor b = ckpt::labelled("b", [&] { return costly(ops::mul(a, a), computed_b); });  // mul saves a
      return ops::mul(b, b);                                                                    // saves b
    };
    ops::sum(ckpt::checkpoint(fn, x, keeping(c.keep))).backward();
    EXPECT_EQ(computed_a, c.computed_a) << c.keep[0];
    EXPECT_EQ(computed_b, c.computed_b) << c.keep[0];
  }
}

// y1 = linear@a(x) [N, 3C], saved by mul; y1*y1 [N, 3C], saved by linear b; y2 = linear@b(y1*y1) [N, 5C], saved
// by mul. What a region keeps besides its input and parameters is exactly the outputs its keep list covers.
TEST(CheckpointLabels, LabelledEntryKeepsOnlyThatOpsOutput) {
  constexpr std::int64_t N = 16, C = 8;
  manual_seed(12);
  const Tensor w1 = randn({3 * C, C}).set_requires_grad(), b1 = randn({3 * C}).set_requires_grad();
  const Tensor w2 = randn({5 * C, 3 * C}).set_requires_grad(), b2 = randn({5 * C}).set_requires_grad();
  const Tensor x = randn({N, C}).set_requires_grad();
  const auto fn = [&](const Tensor& in) {
    const Tensor y1 = ckpt::labelled("a", [&] { return ops::linear(in, w1, b1); });
    const Tensor y2 = ckpt::labelled("b", [&] { return ops::linear(ops::mul(y1, y1), w2, b2); });
    return ops::mul(y2, y2);
  };
  const std::size_t a_bytes = N * 3 * C * sizeof(float), b_bytes = N * 5 * C * sizeof(float);
  Allocator& alloc = Allocator::get(Device::cpu());
  // Live bytes while the graph of one forward is alive: the output plus whatever the region kept.
  auto run = [&](const std::vector<std::string>& keep, ckpt::RegionProfile& profile) {
    const std::size_t before = alloc.stats().live_bytes;
    const Tensor y = ckpt::checkpoint(fn, x, keeping(keep), &profile);
    const std::size_t live = alloc.stats().live_bytes - before;
    ops::sum(y).backward();
    return live;
  };
  ckpt::RegionProfile full, only_a, only_b, both, by_label;
  const std::size_t live_full = run({}, full);
  const std::size_t live_a = run({"linear@a"}, only_a);
  const std::size_t live_b = run({"linear@b"}, only_b);
  const std::size_t live_both = run({"linear"}, both);
  run({"@a"}, by_label);
  EXPECT_EQ(full.saved_bytes, full.dropped_bytes);
  EXPECT_EQ(only_a.saved_bytes - only_a.dropped_bytes, a_bytes);
  EXPECT_EQ(only_b.saved_bytes - only_b.dropped_bytes, b_bytes);
  EXPECT_EQ(both.saved_bytes - both.dropped_bytes, a_bytes + b_bytes);
  EXPECT_EQ(by_label.saved_bytes - by_label.dropped_bytes, a_bytes);
  // The profile's expensive ops are the keep list's: a labelled entry counts one linear.
  EXPECT_EQ(only_a.expensive_bytes, a_bytes);
  EXPECT_DOUBLE_EQ(only_a.expensive_flops, 2.0 * N * C * 3 * C);
  EXPECT_DOUBLE_EQ(both.expensive_flops, 2.0 * N * C * 3 * C + 2.0 * N * 3 * C * 5 * C);
  // The allocator sees the same: the kept outputs are what stays alive beyond full's.
  EXPECT_EQ(live_a - live_full, a_bytes);
  EXPECT_EQ(live_b - live_full, b_bytes);
  EXPECT_EQ(live_both - live_full, a_bytes + b_bytes);
}

// Every label the GPT and LLaMA modules set reaches the op it names: profiling one label at a time counts the
// FLOPs of exactly that projection (2 * rows * in * out).
TEST(CheckpointLabels, ModulesLabelTheirProjections) {
  constexpr std::int64_t B = 2, T = 8, C = 16, I = 24;
  constexpr double rows = B * T;
  manual_seed(4);
  const nn::CausalSelfAttention gpt_attn(C, 2, 2);
  const nn::MLP gpt_mlp(C, 2);
  const nn::LlamaAttention llama_attn(C, 2, std::make_shared<nn::RotaryEmbedding>(C / 2, T));
  const nn::SwiGLU swiglu(C, I);
  const Tensor x = randn({B, T, C}).set_requires_grad();
  struct Case {
    std::function<Tensor(const Tensor&)> fn;
    std::string entry;
    double flops;
  };
  const auto attn = [&](const Tensor& in) { return gpt_attn.forward(in); };
  const auto mlp = [&](const Tensor& in) { return gpt_mlp.forward(in); };
  const auto lattn = [&](const Tensor& in) { return llama_attn.forward(in); };
  const auto lmlp = [&](const Tensor& in) { return swiglu.forward(in); };
  const Case cases[] = {
      {attn, "linear@attn.qkv", 2 * rows * C * 3 * C}, {attn, "linear@attn.proj", 2 * rows * C * C},
      {mlp, "linear@mlp.fc", 2 * rows * C * 4 * C},    {mlp, "linear@mlp.proj", 2 * rows * 4 * C * C},
      {lattn, "@attn.q", 2 * rows * C * C},            {lattn, "@attn.k", 2 * rows * C * C},
      {lattn, "@attn.v", 2 * rows * C * C},            {lattn, "@attn.o", 2 * rows * C * C},
      {lmlp, "@mlp.gate", 2 * rows * C * I},           {lmlp, "@mlp.up", 2 * rows * C * I},
      {lmlp, "@mlp.down", 2 * rows * I * C},           {attn, "linear", 2 * rows * C * 4 * C},
  };
  for (const Case& c : cases) {
    ckpt::RegionProfile profile;
    ops::sum(ckpt::checkpoint(c.fn, x, ckpt::RegionOptions{{}, {c.entry}}, &profile)).backward();
    EXPECT_DOUBLE_EQ(profile.expensive_flops, c.flops) << c.entry;
  }
  // Keeping GPT's qkv projection keeps its [B, T, 3C] output (attention saves q, k, v: views of it); the
  // output projection feeds dropout and the caller's residual add, which save nothing of it, so it is let go.
  ckpt::RegionProfile qkv, proj;
  ops::sum(ckpt::checkpoint(attn, x, keeping({"linear@attn.qkv"}), &qkv)).backward();
  ops::sum(ckpt::checkpoint(attn, x, keeping({"linear@attn.proj"}), &proj)).backward();
  EXPECT_EQ(qkv.saved_bytes - qkv.dropped_bytes, static_cast<std::size_t>(B * T * 3 * C) * sizeof(float));
  EXPECT_EQ(proj.saved_bytes, proj.dropped_bytes);
}

Tensor random_tokens(const Shape& shape, std::int64_t vocab, std::uint32_t seed) {
  std::mt19937 gen(seed);
  Tensor t = Tensor::empty(shape, DType::i64);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<std::int64_t>()[i] = static_cast<std::int64_t>(gen() % vocab);
  return t;
}

// The LLaMA labels under a policy: three AdamW steps give losses, gradients and parameters equal bit for bit
// to the run without checkpointing.
TEST(CheckpointLabels, LlamaLabelledPolicyTrainsBitIdentically) {
  const auto run = [](const ckpt::Policy& policy) {
    manual_seed(9);
    nn::LlamaConfig c;
    c.vocab_size = 61;
    c.block_size = 16;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 32;
    c.intermediate_size = 48;
    nn::Llama model(c);
    model.set_checkpointing(policy);
    optim::AdamW opt({optim::ParamGroup{.params = model.parameters(), .lr = 1e-2}});
    const Tensor idx = random_tokens({2, 16}, 61, 3), targets = random_tokens({2, 16}, 61, 4);
    std::vector<Tensor> out;
    for (int s = 0; s < 3; ++s) {
      opt.zero_grad();
      const Tensor loss = model.loss(idx, targets);
      loss.backward();
      out.push_back(loss.detach().clone());
      opt.step();
    }
    for (const Tensor& p : model.parameters()) out.push_back(p.grad().clone());
    for (const Tensor& p : model.parameters()) out.push_back(p.detach().clone());
    return out;
  };
  const std::vector<Tensor> reference = run(ckpt::Policy::none());
  const std::vector<Tensor> labelled =
      run(ckpt::Policy::parse("selective:@attn.q,@attn.k,@attn.v,scaled_dot_product_attention,@mlp.gate,@mlp.up"));
  ASSERT_EQ(labelled.size(), reference.size());
  for (std::size_t i = 0; i < reference.size(); ++i) {
    const Tensor a = labelled[i].contiguous(), b = reference[i].contiguous();
    ASSERT_EQ(a.shape(), b.shape()) << i;
    EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.numel() * dtype_size(a.dtype())), 0) << "tensor " << i;
  }
}

}  // namespace
}  // namespace memtrain

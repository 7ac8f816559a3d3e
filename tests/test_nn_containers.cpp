// nn::Sequential, nn::ModuleList and what a custom model gets from nn::Module: checkpointing of the blocks it
// declares (the walk of Module::set_checkpointing), parameters accounted as parameters however they were
// made, and save / load through safetensors.
#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/io/safetensors.h"
#include "memtrain/nn/containers.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/nn/layer_norm.h"
#include "memtrain/nn/linear.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/reduce.h"
#include "error_text.h"
#include "temp_dir.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace memtrain {
namespace {

using ckpt::Policy;
using test_support::TempDir;

using test_support::error_of;

void expect_contains(const std::string& text, const std::vector<std::string>& parts) {
  for (const auto& p : parts) EXPECT_NE(text.find(p), std::string::npos) << "'" << p << "' not in: " << text;
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor x = a.detach().contiguous(), y = b.detach().contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

Tensor relu_step(const Tensor& x) { return ops::relu(x); }

// A residual MLP block written as a user would: not a UnaryModule, a const forward.
class Block : public nn::Module {
 public:
  explicit Block(std::int64_t c) {
    fc1_ = register_module("fc1", std::make_shared<nn::Linear>(c, 4 * c));
    fc2_ = register_module("fc2", std::make_shared<nn::Linear>(4 * c, c));
  }
  Tensor forward(const Tensor& x) const { return x + fc2_->forward(ops::gelu(fc1_->forward(x))); }

 private:
  std::shared_ptr<nn::Linear> fc1_, fc2_;
};

// Two blocks in a Sequential (the declared checkpointable blocks) and a regression head.
class TwoBlockNet : public nn::Module {
 public:
  explicit TwoBlockNet(std::int64_t c) {
    blocks_ = register_module("blocks", std::make_shared<nn::Sequential>(std::make_shared<Block>(c),
                                                                          std::make_shared<Block>(c)));
    head_ = register_module("head", std::make_shared<nn::Linear>(c, 1));
  }
  Tensor loss(const Tensor& x, const Tensor& y) const {
    const Tensor d = head_->forward(blocks_->forward(x)) - y;
    return ops::mean(d * d);
  }
  const nn::Sequential& blocks() const { return *blocks_; }

 private:
  std::shared_ptr<nn::Sequential> blocks_;
  std::shared_ptr<nn::Linear> head_;
};

struct StepResult {
  std::size_t activation_peak = 0;
  std::vector<Tensor> grads;
};

StepResult train_step(const Policy& policy) {
  manual_seed(7);
  TwoBlockNet net(32);
  net.set_checkpointing(policy);
  const Tensor x = randn({64, 32}), y = randn({64, 1});
  if (policy.kind == Policy::Kind::budget) {  // the first step profiles and plans; measure the second
    CategoryGuard category(MemoryCategory::activations);
    net.loss(x, y).backward();
    net.zero_grad();
  }
  Allocator& a = Allocator::get(Device::cpu());
  a.reset_peak();
  {
    CategoryGuard category(MemoryCategory::activations);
    net.loss(x, y).backward();
  }
  StepResult r;
  r.activation_peak = a.stats()[MemoryCategory::activations].peak_bytes;
  for (const Tensor& p : net.parameters()) r.grads.push_back(p.grad().clone());
  return r;
}

TEST(NnContainers, CustomModelCheckpointsItsSequentialBlocks) {
  const StepResult none = train_step(Policy::none());
  const StepResult full = train_step(Policy::full());
  EXPECT_LT(full.activation_peak, none.activation_peak);
  for (const Policy& p : {Policy::full(), Policy::every(2), Policy::selective(), Policy::budget(1)}) {
    const StepResult r = p == Policy::full() ? full : train_step(p);
    ASSERT_EQ(r.grads.size(), none.grads.size()) << p.to_string();
    for (std::size_t i = 0; i < r.grads.size(); ++i)
      EXPECT_TRUE(bit_equal(r.grads[i], none.grads[i])) << p.to_string() << ": gradient " << i;
  }
}

TEST(NnContainers, SequentialTakesThePolicyAndDescribesIt) {
  TwoBlockNet net(8);
  net.set_checkpointing(Policy::every(2));
  EXPECT_EQ(net.blocks().checkpointing().policy(), Policy::every(2));
  expect_contains(net.blocks().describe(), {"(0) memtrain::", "Block\n(1) ", "every:2"});
  net.set_checkpointing(Policy::none());  // resets
  EXPECT_EQ(net.blocks().checkpointing().policy(), Policy::none());
}

class NoBlocks : public nn::Module {
 public:
  NoBlocks() { register_module("fc", std::make_shared<nn::Linear>(4, 4)); }
};

TEST(NnContainers, ModelWithoutBlocksRefusesCheckpointingButNotNone) {
  NoBlocks net;
  expect_contains(error_of([&] { net.set_checkpointing(Policy::full()); }),
                  {"Module::set_checkpointing", "'full'", "declares no checkpointable blocks", "nn::Sequential",
                   "apply_checkpointing"});
  EXPECT_EQ(error_of([&] { net.set_checkpointing(Policy::none()); }), "(no error)");
}

// A ModuleList holds blocks without running them, so it does not take a policy; Sequentials inside it do.
class ListOf : public nn::Module {
 public:
  explicit ListOf(bool sequentials) {
    list_ = register_module("layers", std::make_shared<nn::ModuleList>());
    for (int i = 0; i < 2; ++i) {
      if (sequentials) list_->append(std::make_shared<nn::Sequential>(std::make_shared<Block>(4)));
      else list_->append(std::make_shared<Block>(4));
    }
  }
  std::shared_ptr<nn::ModuleList> list_;
};

TEST(NnContainers, TheWalkFindsBlocksInsideSubmodules) {
  ListOf blocks_only(false);
  expect_contains(error_of([&] { blocks_only.set_checkpointing(Policy::selective()); }),
                  {"'selective'", "declares no checkpointable blocks"});
  ListOf sequentials(true);
  sequentials.set_checkpointing(Policy::full());
  for (std::size_t i = 0; i < 2; ++i)
    EXPECT_EQ(sequentials.list_->get<nn::Sequential>(i)->checkpointing().policy(), Policy::full());

  // A shipped model inside a custom one takes it as well (it used to be refused: only the top was asked).
  class Wrapper : public nn::Module {
   public:
    Wrapper() {
      nn::GPTConfig c;
      c.vocab_size = 11;
      c.block_size = 4;
      c.n_layer = 2;
      c.n_head = 1;
      c.n_embd = 8;
      gpt = register_module("gpt", std::make_shared<nn::GPT>(c));
    }
    std::shared_ptr<nn::GPT> gpt;
  } wrapper;
  wrapper.set_checkpointing(Policy::every(2));
  EXPECT_EQ(wrapper.gpt->checkpointing().policy(), Policy::every(2));
}

TEST(NnContainers, SequentialNamesAndForward) {
  manual_seed(3);
  auto l1 = std::make_shared<nn::Linear>(3, 5);
  auto l2 = std::make_shared<nn::Linear>(5, 2);
  nn::Sequential seq(l1, relu_step, l2);
  std::vector<std::string> names;
  for (const auto& [n, t] : seq.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  ASSERT_EQ(seq.size(), 3u);

  const Tensor x = randn({4, 3});
  EXPECT_TRUE(bit_equal(seq.forward(x), l2->forward(ops::relu(l1->forward(x)))));
  EXPECT_EQ(seq.at(0), l1);
  EXPECT_EQ(seq.get<nn::Linear>(2), l2);
  expect_contains(error_of([&] { (void)seq.at(3); }), {"Sequential::at", "index 3 is out of range for 3"});
  expect_contains(error_of([&] { (void)seq.get<nn::LayerNorm>(0); }),
                  {"Sequential::get", "module 0 is a memtrain::nn::Linear, not a memtrain::nn::LayerNorm"});

  // A small MLP as one Sequential, appended step by step; a named parameter-free step.
  nn::Sequential mlp;
  mlp.append(std::make_shared<nn::Linear>(3, 8));
  mlp.append([](const Tensor& t) { return ops::gelu(t); }, "gelu");
  mlp.append(std::make_shared<nn::LayerNorm>(8));
  EXPECT_EQ(mlp.forward(x).shape(), (Shape{4, 8}));
  expect_contains(mlp.describe(), {"(0) memtrain::nn::Linear", "(1) gelu", "(2) memtrain::nn::LayerNorm"});
  EXPECT_EQ(mlp.named_parameters().front().first, "0.weight");
}

TEST(NnContainers, ModuleListIndexingAndTypedAccess) {
  nn::ModuleList list(std::make_shared<nn::Linear>(2, 3), std::make_shared<nn::LayerNorm>(3));
  ASSERT_EQ(list.size(), 2u);
  std::size_t n = 0;
  for (const auto& m : list)
    if (m != nullptr) ++n;
  EXPECT_EQ(n, 2u);
  std::vector<std::string> names;
  for (const auto& [name, t] : list.named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias"}));
  EXPECT_EQ(list.get<nn::Linear>(0)->weight().shape(), (Shape{3, 2}));
  expect_contains(error_of([&] { (void)list.get<nn::Linear>(1); }),
                  {"ModuleList::get", "module 1 is a memtrain::nn::LayerNorm, not a memtrain::nn::Linear"});
  expect_contains(error_of([&] { (void)list[2]; }), {"ModuleList::at", "index 2 is out of range for 2"});
}

// Parameters made the plain way (zeros, randn) and registered: the bytes move from "other" to "parameters",
// and go back out of "parameters" when the module is freed.
class PlainParams : public nn::Module {
 public:
  PlainParams() {
    register_parameter("w", zeros({16, 16}));
    register_parameter("b", randn({16}));
  }
};

TEST(NnContainers, RegisteredParametersAreAccountedAsParameters) {
  const MemoryStats before = memory_stats();
  {
    PlainParams m;
    const MemoryStats after = memory_stats();
    const auto& p0 = before[MemoryCategory::parameters];
    const auto& p1 = after[MemoryCategory::parameters];
    EXPECT_EQ(p1.live_bytes - p0.live_bytes, (16 * 16 + 16) * sizeof(float));
    EXPECT_EQ(p1.live_blocks - p0.live_blocks, 2u);
    EXPECT_GE(p1.peak_bytes, p1.live_bytes);
    EXPECT_EQ(after[MemoryCategory::other].live_bytes, before[MemoryCategory::other].live_bytes);
    EXPECT_EQ(after.live_bytes - before.live_bytes, (16 * 16 + 16) * sizeof(float));
  }
  const MemoryStats freed = memory_stats();
  EXPECT_EQ(freed[MemoryCategory::parameters].live_bytes, before[MemoryCategory::parameters].live_bytes);
  EXPECT_EQ(freed[MemoryCategory::other].live_bytes, before[MemoryCategory::other].live_bytes);
}

// TwoBlockNet with one more parameter, to load a file that lacks it.
class TwoBlockNetPlus : public TwoBlockNet {
 public:
  TwoBlockNetPlus() : TwoBlockNet(8) { register_parameter("extra", zeros({2})); }
};

TEST(NnContainers, SaveAndLoadRoundTripBitExact) {
  TempDir dir;
  const std::string path = dir.file("net.safetensors");
  manual_seed(1);
  TwoBlockNet a(8);
  a.save(path);
  EXPECT_EQ(io::load_safetensors_metadata(path).at("format"), "pt");
  manual_seed(2);
  TwoBlockNet b(8);
  EXPECT_FALSE(bit_equal(b.state_dict().at("blocks.0.fc1.weight"), a.state_dict().at("blocks.0.fc1.weight")));
  const Tensor before_load = b.state_dict().at("head.weight");
  b.load(path);
  EXPECT_TRUE(before_load.shares_storage_with(b.state_dict().at("head.weight")));  // loaded in place
  const nn::StateDict sa = a.state_dict(), sb = b.state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (const auto& [name, t] : sa) EXPECT_TRUE(bit_equal(t, sb.at(name))) << name;

  TwoBlockNetPlus plus;
  expect_contains(error_of([&] { plus.load(path); }), {"Module::load", path, "missing keys: extra"});
  plus.load(path, /*strict=*/false);
  EXPECT_TRUE(bit_equal(plus.state_dict().at("head.weight"), sa.at("head.weight")));

  TwoBlockNet wider(16);
  expect_contains(error_of([&] { wider.load(path); }), {"Module::load", path, "shape mismatch",
                                                        "blocks.0.fc1.weight (checkpoint [32, 8] vs model [64, 16])"});
}

TEST(NnContainers, SaveSafetensorsTakesAStateDict) {
  TempDir dir;
  const std::string path = dir.file("sd.safetensors");
  manual_seed(4);
  TwoBlockNet net(4);
  io::save_safetensors(path, net.state_dict());
  const std::map<std::string, Tensor> loaded = io::load_safetensors(path);
  const nn::StateDict sd = net.state_dict();
  ASSERT_EQ(loaded.size(), sd.size());
  for (const auto& [name, t] : sd) EXPECT_TRUE(bit_equal(loaded.at(name), t)) << name;
}

}  // namespace
}  // namespace memtrain

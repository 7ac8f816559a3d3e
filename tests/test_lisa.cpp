// LISA (train/lisa.h): the seeded draw of active blocks (deterministic, uniform over blocks), and the Trainer
// under it: only the active blocks and the always-trained parameters move, a block leaving the active set has
// its optimizer state freed (the state stays flat across switches), and a checkpoint resumes bit for bit.
#include "memtrain/amp/precision.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/train/trainer.h"
#include "train/lisa.h"

#include "error_text.h"
#include "temp_dir.h"
#include "tiny_lm.h"
#include "token_dataset.h"
#include "trainer_fixtures.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace mt = memtrain;
using mt::DType;
using mt::Tensor;
using mt::train::TrainerConfig;

namespace {

std::shared_ptr<mt::nn::GPT> gpt_with_blocks(std::int64_t n_layer) {
  mt::nn::GPTConfig g;
  g.vocab_size = mt::test_support::kTinyVocab;
  g.block_size = mt::test_support::kTinyWindow;
  g.n_layer = n_layer;
  g.n_head = 2;
  g.n_embd = 32;
  return std::make_shared<mt::nn::GPT>(g);
}

std::map<std::string, std::vector<float>> snapshot(const mt::nn::Module& m) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, p] : m.named_parameters()) {
    const Tensor c = p.detach().to(DType::f32).contiguous();
    out[name] = {c.data<float>(), c.data<float>() + c.numel()};
  }
  return out;
}

// "h.3.mlp.c_fc.weight" -> 3; -1 outside the blocks.
std::int64_t block_index(const std::string& name) {
  if (name.rfind("h.", 0) != 0) return -1;
  return std::stoll(name.substr(2, name.find('.', 2) - 2));
}

TEST(Lisa, DrawsAreSeededAndUniformOverTheBlocks) {
  auto gpt = gpt_with_blocks(4);
  const mt::train::detail::Lisa lisa(*gpt, 2, 10, 77, DType::f32), same(*gpt, 2, 10, 77, DType::f32),
      other(*gpt, 2, 10, 78, DType::f32);
  EXPECT_EQ(lisa.block_names(), (std::vector<std::string>{"h.0", "h.1", "h.2", "h.3"}));
  std::map<std::int64_t, int> per_block;
  std::map<std::vector<std::int64_t>, int> per_pair;
  int differs = 0;
  constexpr int kPeriods = 3000;
  for (int k = 0; k < kPeriods; ++k) {
    const std::vector<std::int64_t> d = lisa.draw(k);
    ASSERT_EQ(d.size(), 2u);
    EXPECT_LT(d[0], d[1]);  // distinct, ascending
    EXPECT_EQ(d, same.draw(k));
    differs += d != other.draw(k);
    for (std::int64_t b : d) ++per_block[b];
    ++per_pair[d];
  }
  EXPECT_GT(differs, kPeriods / 2);  // another seed, other draws
  // Each block in half of the draws, each of the 6 pairs in a sixth (binomial sd ~ 27 and ~ 20).
  for (const auto& [b, n] : per_block) EXPECT_NEAR(n, kPeriods / 2, 150) << "block " << b;
  ASSERT_EQ(per_pair.size(), 6u);
  for (const auto& [pair, n] : per_pair) EXPECT_NEAR(n, kPeriods / 6, 120);
}

TEST(Lisa, RefusesWhatItCannotSample) {
  auto gpt = gpt_with_blocks(2);
  EXPECT_NE(mt::test_support::error_of([&] { mt::train::detail::Lisa(*gpt, 3, 10, 1, DType::f32); }).find("[1, 2]"),
            std::string::npos);
  mt::nn::Linear flat(4, 4);
  EXPECT_NE(
      mt::test_support::error_of([&] { mt::train::detail::Lisa(flat, 1, 10, 1, DType::f32); }).find("numbered blocks"),
      std::string::npos);
  TrainerConfig c;
  c.lisa_layers = 1;
  c.lora.rank = 4;
  EXPECT_NE(mt::test_support::error_of([&] { c.validate(); }).find("lisa_layers"), std::string::npos);
  c.lora.rank = 0;
  c.galore_rank = 2;
  EXPECT_NE(mt::test_support::error_of([&] { c.validate(); }).find("GaLore"), std::string::npos);
}

struct LisaRun {
  std::shared_ptr<mt::nn::GPT> gpt;
  std::unique_ptr<mt::train::Trainer> trainer;
};

TrainerConfig lisa_config() {
  TrainerConfig c = mt::test_support::short_run_config();
  c.grad_clip = 1.0;
  c.lisa_layers = 1;
  c.lisa_interval = 2;
  c.optimizer = mt::optim::Spec::adamw({.lr = 1e-2, .weight_decay = 0.1});
  return c;
}

LisaRun make_run(const TrainerConfig& c) {
  mt::manual_seed(c.seed);
  LisaRun run;
  run.gpt = gpt_with_blocks(4);
  auto data = std::make_shared<mt::test_support::TokenDataset>(32, mt::test_support::kTinyWindow,
                                                               mt::test_support::kTinyVocab);
  run.trainer = std::make_unique<mt::train::Trainer>(c, run.gpt, mt::test_support::gpt_loss(run.gpt), data);
  return run;
}

TEST(LisaTraining, OnlyTheActiveBlocksMoveAndTheirStateIsAllThatIsKept) {
  LisaRun run = make_run(lisa_config());
  std::size_t always = 0, block = 0;
  for (const auto& [name, p] : run.gpt->named_parameters()) {
    if (block_index(name) < 0) always += static_cast<std::size_t>(p.numel());
    else if (block_index(name) == 0) block += static_cast<std::size_t>(p.numel());
  }
  std::set<std::vector<std::int64_t>> seen;
  std::int64_t switches = 0;
  std::vector<std::int64_t> last;
  for (int step = 0; step < 12; ++step) {
    const auto before = snapshot(*run.gpt);
    const mt::train::StepMetrics m = run.trainer->train_step();
    ASSERT_EQ(m.lisa_blocks.size(), 1u);
    const std::int64_t active = m.lisa_blocks.front();
    if (!last.empty() && last != m.lisa_blocks) ++switches;
    last = m.lisa_blocks;
    seen.insert(m.lisa_blocks);
    const auto after = snapshot(*run.gpt);
    for (const auto& [name, v] : after) {
      const std::int64_t b = block_index(name);
      const bool trains = b < 0 || b == active;
      if (!trains) EXPECT_EQ(v, before.at(name)) << "step " << step << ": " << name << " moved";
    }
    // AdamW's m and v, in f32, for the always-trained parameters and one block: the same after every switch.
    EXPECT_EQ(run.trainer->optimizer().state_bytes(), 2 * 4 * (always + block)) << "step " << step;
    EXPECT_EQ(m.to_json().at("lisa_blocks"), nlohmann::json(m.lisa_blocks));
  }
  EXPECT_GE(switches, 2);
  EXPECT_GE(seen.size(), 2u);
}

TEST(LisaTraining, UnderBf16FrozenBlocksAreStoredInBf16AndActiveOnesInF32) {
  TrainerConfig c = lisa_config();
  c.precision = mt::amp::Precision::bf16;
  mt::Allocator& cpu = mt::Allocator::get(mt::Device::cpu());
  const std::size_t before = cpu.stats()[mt::MemoryCategory::parameters].live_bytes;
  LisaRun run = make_run(c);
  std::size_t always = 0, block = 0;
  for (const auto& [name, p] : run.gpt->named_parameters()) {
    if (block_index(name) < 0) always += static_cast<std::size_t>(p.numel());
    else if (block_index(name) == 0) block += static_cast<std::size_t>(p.numel());
  }
  for (int step = 0; step < 6; ++step) {
    const mt::train::StepMetrics m = run.trainer->train_step();
    const std::int64_t active = m.lisa_blocks.front();
    for (const auto& [name, p] : run.gpt->named_parameters()) {
      const std::int64_t b = block_index(name);
      EXPECT_EQ(p.dtype(), b < 0 || b == active ? DType::f32 : DType::bf16) << "step " << step << ": " << name;
    }
    // f32 for the always-trained parameters and the active block, bf16 for the other 3 blocks.
    EXPECT_EQ(cpu.stats()[mt::MemoryCategory::parameters].live_bytes - before, 4 * (always + block) + 2 * 3 * block)
        << "step " << step;
    EXPECT_TRUE(std::isfinite(m.loss));
  }
}

TEST(LisaTraining, ResumesBitForBitAcrossASwitch) {
  for (const auto precision : {mt::amp::Precision::fp32, mt::amp::Precision::bf16}) {
    SCOPED_TRACE(mt::amp::precision_name(precision));
    mt::test_support::TempDir dir;
    TrainerConfig c = lisa_config();
    c.precision = precision;
    LisaRun straight = make_run(c);
    for (int i = 0; i < 7; ++i) straight.trainer->train_step();

    LisaRun first = make_run(c);
    for (int i = 0; i < 3; ++i) first.trainer->train_step();  // mid-period: the checkpoint holds the block's state
    first.trainer->save_checkpoint(dir.file("ckpt.safetensors"));
    LisaRun resumed = make_run(c);
    resumed.trainer->load_checkpoint(dir.file("ckpt.safetensors"));
    for (int i = 0; i < 4; ++i) resumed.trainer->train_step();
    EXPECT_EQ(snapshot(*resumed.gpt), snapshot(*straight.gpt));
  }
}

}  // namespace

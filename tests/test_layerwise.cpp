// Layer-wise updates (TrainerConfig.layerwise_update): parameters equal the ordinary step's, the gradient
// peak falls to about one layer's, GaLore accumulates micro-batches in the projected space (== ordinary GaLore
// with the same grad_accum between refreshes), the per-parameter clipping rule keeps the applied global norm
// <= grad_clip (float64 check), and what cannot work is refused with the reason.
#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/optim/galore.h"
#include "memtrain/train/train.h"

#include "temp_dir.h"
#include "token_dataset.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>

namespace mt = memtrain;
using mt::Tensor;
using mt::train::Trainer;
using mt::train::TrainerConfig;

namespace {

using mt::test_support::TokenDataset;

mt::nn::GPTConfig gpt_config(std::int64_t n_layer, std::int64_t n_embd) {
  mt::nn::GPTConfig c;
  c.vocab_size = 32;
  c.block_size = 8;
  c.n_layer = n_layer;
  c.n_head = 2;
  c.n_embd = n_embd;
  c.dropout = 0.0;
  return c;
}

std::shared_ptr<mt::nn::GPT> make_gpt(std::int64_t n_layer = 2, std::int64_t n_embd = 16) {
  mt::manual_seed(7);
  return std::make_shared<mt::nn::GPT>(gpt_config(n_layer, n_embd));
}

mt::train::LossFn gpt_loss(const std::shared_ptr<mt::nn::GPT>& gpt) {
  return [gpt](const mt::data::Batch& b) { return gpt->loss(b.inputs, b.targets); };
}

TrainerConfig base_config() {
  TrainerConfig c;
  c.data.prefetch = 1;
  c.data.shuffle = false;
  c.schedule.decay = mt::train::LrDecay::constant;
  c.grad_clip = 0.0;
  c.micro_batch = 2;
  c.max_steps = 8;
  c.eval_interval = 0;
  c.log_interval = 1000;
  c.optimizer = mt::optim::Spec::adamw({.lr = 1e-2, .weight_decay = 0.1});
  return c;
}

std::vector<float> values(const Tensor& t) {
  Tensor c = t.detach().contiguous();
  return std::vector<float>(c.data<float>(), c.data<float>() + c.numel());
}

std::vector<std::vector<float>> all_values(mt::nn::Module& m) {
  std::vector<std::vector<float>> out;
  for (const auto& [name, p] : m.named_parameters()) out.push_back(values(p));
  return out;
}

double max_gap(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double gap = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t j = 0; j < a[i].size(); ++j)
      gap = std::max(gap, static_cast<double>(std::abs(a[i][j] - b[i][j])));
  return gap;
}

// Parameters after `steps` steps of a fresh GPT under config c.
std::vector<std::vector<float>> train(const TrainerConfig& c, std::int64_t steps, std::vector<double>* norms = nullptr,
                                      std::int64_t n_layer = 2) {
  auto gpt = make_gpt(n_layer);
  Trainer t(c, gpt, gpt_loss(gpt), std::make_shared<TokenDataset>(40, 8, 32));
  for (std::int64_t s = 0; s < steps; ++s) {
    const auto m = t.train_step();
    if (norms) norms->push_back(m.grad_norm);
  }
  return all_values(*gpt);
}


// ---- layer-wise == ordinary ------------------------------------------------------------------------------

// Each parameter's update reads only its own gradient and state, and the hook sees the gradient the ordinary
// step would (backward is unchanged; a parameter's hook runs after every node that reads it), so the
// parameters are bit-identical, with accumulation too (.grad accumulates as usual). With the canonical
// reduction the hook first folds its parameter's micro-batch tree (GradientTree::complete), as the ordinary
// step's finish() would fold it after the backward.
TEST(LayerwiseTrainer, SameParametersAsOrdinaryStepBitForBit) {
  std::vector<mt::optim::Spec> specs = {mt::optim::Spec::adamw({.lr = 1e-2, .weight_decay = 0.1}),
                                        mt::optim::Spec::adamw8bit({.lr = 1e-2, .weight_decay = 0.1})};
  specs[1].min_8bit_size = 256;  // the 48 x 16 and 64 x 16 weights get 8-bit state
  for (const auto& spec : specs) {
    for (const auto [accum, canonical] : {std::pair<std::int64_t, bool>{1, false}, {2, false}, {2, true}, {4, true}}) {
      SCOPED_TRACE(fmt::format("{} grad_accum {} canonical {}", mt::optim::kind_name(spec.kind), accum, canonical));
      TrainerConfig c = base_config();
      c.optimizer = spec;
      c.grad_accum = accum;
      c.canonical_reduction = canonical;
      std::vector<double> norms_plain, norms_lw;
      const auto plain = train(c, 4, &norms_plain);
      c.layerwise_update = true;
      const auto lw = train(c, 4, &norms_lw);
      EXPECT_EQ(plain, lw);
      // The norm is summed per parameter instead of over all squares at once: float64 rounding only.
      for (std::size_t s = 0; s < norms_plain.size(); ++s) EXPECT_NEAR(norms_lw[s], norms_plain[s], 1e-9 * norms_plain[s]);
    }
  }
}

// GaLore with one micro-batch: the hook projects the same G on the same basis (refreshed at step 0 and 2).
TEST(LayerwiseTrainer, GaLoreWithoutAccumulationIsBitIdentical) {
  TrainerConfig c = base_config();
  c.galore_rank = 4;
  c.galore_update_gap = 2;
  const auto plain = train(c, 4);
  c.layerwise_update = true;
  EXPECT_EQ(train(c, 4), plain);
}

// The hooks act only inside train_step's backward: a backward of the user's, while the Trainer lives or
// after it is gone, leaves the weights alone and the gradients in .grad.
TEST(LayerwiseTrainer, HooksActOnlyInsideTrainStep) {
  TrainerConfig c = base_config();
  c.layerwise_update = true;
  auto gpt = make_gpt();
  auto ds = std::make_shared<TokenDataset>(40, 8, 32);
  auto backward_outside = [&] {
    const auto before = all_values(*gpt);
    const mt::data::Batch b = ds->collate({0, 1});
    gpt->loss(b.inputs, b.targets).backward();
    EXPECT_EQ(all_values(*gpt), before);
    for (const auto& [name, p] : gpt->named_parameters()) EXPECT_TRUE(p.grad().defined()) << name;
    for (auto& [name, p] : gpt->named_parameters()) p.set_grad(Tensor());
  };
  {
    Trainer t(c, gpt, gpt_loss(gpt), ds);
    t.train_step();
    backward_outside();
  }
  backward_outside();
}

// ---- gradient memory -------------------------------------------------------------------------------------

std::size_t gradient_peak_of_a_step(const TrainerConfig& c, std::size_t* param_bytes, std::size_t* largest) {
  auto gpt = make_gpt(4, 64);
  Trainer t(c, gpt, gpt_loss(gpt), std::make_shared<TokenDataset>(40, 8, 32));
  t.train_step();  // the optimizer state exists from here on
  *param_bytes = 0;
  *largest = 0;
  for (const auto& [name, p] : gpt->named_parameters()) {
    *param_bytes += p.nbytes();
    *largest = std::max(*largest, p.nbytes());
  }
  auto& allocator = mt::Allocator::get(mt::Device::cpu());
  allocator.reset_peak();
  t.train_step();
  return allocator.stats()[mt::MemoryCategory::gradients].peak_bytes;
}

// 4 blocks of n_embd 64: the ordinary step holds every gradient at once (>= the parameters' bytes); layer-wise
// holds about one block's (12 * 64^2 floats) plus the tied embedding's, which collects gradients from the
// head at the start of backward and from the lookup at its end, and backward's activation gradients.
TEST(LayerwiseMemory, GradientPeakFallsToAboutOneLayer) {
  TrainerConfig c = base_config();
  std::size_t param_bytes = 0, largest = 0;
  const std::size_t ordinary = gradient_peak_of_a_step(c, &param_bytes, &largest);
  c.layerwise_update = true;
  const std::size_t layerwise = gradient_peak_of_a_step(c, &param_bytes, &largest);
  const std::size_t block_bytes = 12 * 64 * 64 * 4;
  std::printf("gradient peak: ordinary %zu B, layer-wise %zu B (parameters %zu B, one block %zu B, largest %zu B)\n",
              ordinary, layerwise, param_bytes, block_bytes, largest);
  EXPECT_GE(ordinary, param_bytes);
  EXPECT_LT(static_cast<double>(layerwise), 0.5 * static_cast<double>(ordinary));
  EXPECT_LE(layerwise, block_bytes);
}

// ---- GaLore with accumulation ---------------------------------------------------------------------------

TrainerConfig galore_config(std::int64_t accum) {
  TrainerConfig c = base_config();
  c.galore_rank = 4;
  c.galore_update_gap = 100;  // one refresh, at step 0
  c.galore_svd = mt::optim::GaLoreSvd::exact;
  c.grad_accum = accum;
  c.optimizer = mt::optim::Spec::adamw({.lr = 1e-2, .weight_decay = 0.1, .eps = 1e-6});
  return c;
}

// The GaLore API itself: micro-batch gradients accumulated in the projected space equal P^T (sum G) in
// float64, step 0's refresh happens once per step, and the accumulator is r x max(m, n) floats.
TEST(LayerwiseGaLore, AccumulatorHoldsTheProjectedSumAndRefreshesOnce) {
  mt::manual_seed(5);
  Tensor w = mt::randn({12, 20}).set_requires_grad(true);  // left side: R is (r, 20)
  mt::optim::GaLoreGroups groups;
  groups.projected.push_back({.params = {w}, .lr = 1e-2});
  mt::optim::GaLoreSpec gs;
  gs.rank = 3;
  gs.update_gap = 1;  // every step refreshes: the later micro-batches must not refresh again
  gs.svd = mt::optim::GaLoreSvd::exact;
  mt::optim::GaLore galore(mt::optim::Spec::sgd({.lr = 1e-2}), gs, std::move(groups));
  std::vector<Tensor> gs_in = {mt::randn({12, 20}), mt::randn({12, 20}), mt::randn({12, 20})};
  galore.accumulate(w, gs_in[0]);
  EXPECT_EQ(galore.projector(w)->refresh_count(), 1);
  EXPECT_EQ(galore.accumulator_bytes(), 3u * 20u * 4u);
  galore.accumulate(w, gs_in[1]);
  const Tensor R = galore.projected_gradient(w, gs_in[2]);
  EXPECT_EQ(galore.projector(w)->refresh_count(), 1);
  EXPECT_EQ(galore.accumulator_bytes(), 0u);
  ASSERT_EQ(R.shape(), (mt::Shape{3, 20}));
  // P was refreshed from gs_in[0]: R = P^T (G0 + G1 + G2), in float64 from the stored basis.
  const auto P = values(galore.projector(w)->left_matrix());
  std::vector<std::vector<float>> G;
  for (const auto& g : gs_in) G.push_back(values(g));
  const auto r = values(R);
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 20; ++j) {
      double ref = 0.0;
      for (int k = 0; k < 12; ++k) ref += static_cast<double>(P[k * 3 + i]) * (G[0][k * 20 + j] + double(G[1][k * 20 + j]) + G[2][k * 20 + j]);
      EXPECT_NEAR(r[i * 20 + j], ref, 1e-5 * (1.0 + std::abs(ref)));
    }
  }
  // A non-finite micro-batch gradient skips the step (and never reaches a refresh).
  Tensor bad = mt::randn({12, 20});
  bad.data<float>()[7] = NAN;
  galore.accumulate(w, bad);
  EXPECT_TRUE(galore.has_accumulated(w));
  EXPECT_FALSE(galore.projected_gradient(w, gs_in[0]).defined());
  EXPECT_FALSE(galore.has_accumulated(w));
  EXPECT_EQ(galore.projector(w)->refresh_count(), 1);
}

// Layer-wise GaLore with grad_accum 3 == ordinary GaLore with grad_accum 3 after the refresh at step 0: both
// continue from one checkpoint written after step 0 (whose basis the ordinary run took from the summed
// gradient) over 4 steps without a refresh. Projected weights sum P^T G_i instead of projecting sum G_i:
// fp32 rounding (~1e-7 relative in R), which then reaches every weight through the forward; AdamW
// normalises R (eps 1e-6 keeps tiny components from amplifying it), so the weights agree to a few ulps:
// 2e-6 (measured 6e-8).
TEST(LayerwiseGaLore, AccumulationEqualsOrdinaryGaLoreBetweenRefreshes) {
  mt::test_support::TempDir dir;
  TrainerConfig c = galore_config(3);
  c.checkpoint_dir = dir.path();
  auto a = make_gpt();
  Trainer ordinary(c, a, gpt_loss(a), std::make_shared<TokenDataset>(40, 8, 32));
  ordinary.train_step();
  const std::string path = ordinary.save_checkpoint();
  const auto after_first = all_values(*a);

  c.layerwise_update = true;
  auto b = make_gpt();
  auto* galore_b = static_cast<mt::optim::GaLore*>(nullptr);
  std::vector<std::size_t> accumulator_bytes, gradient_live;
  auto spy = gpt_loss(b);
  mt::train::LossFn loss = [&](const mt::data::Batch& batch) {
    // Called at each micro-batch's forward: what the earlier micro-batches left is alive now.
    accumulator_bytes.push_back(galore_b->accumulator_bytes());
    gradient_live.push_back(mt::Allocator::get(mt::Device::cpu()).stats()[mt::MemoryCategory::gradients].live_bytes);
    return spy(batch);
  };
  Trainer layerwise(c, b, loss, std::make_shared<TokenDataset>(40, 8, 32));
  galore_b = &dynamic_cast<mt::optim::GaLore&>(layerwise.optimizer());
  layerwise.load_checkpoint(path);
  for (int s = 0; s < 4; ++s) {
    const double la = ordinary.train_step().loss;
    const double lb = layerwise.train_step().loss;
    if (s == 0) {
      EXPECT_EQ(lb, la);  // the same weights after loading
    } else {
      EXPECT_NEAR(lb, la, 1e-5 * std::abs(la)) << "step " << s + 2;
    }
  }
  const auto pa = all_values(*a);
  const auto pb = all_values(*b);
  EXPECT_GT(max_gap(pa, after_first), 1e-3);  // the runs moved
  EXPECT_LE(max_gap(pa, pb), 2e-6);
  std::printf("layer-wise vs ordinary GaLore (grad_accum 3, 4 steps): max |dW| = %.3g\n", max_gap(pa, pb));
  // Accumulators: r x max(m, n) floats per projected weight (c_attn 48 x 16, attn c_proj 16 x 16, c_fc 64 x 16,
  // mlp c_proj 16 x 64, in each of the 2 blocks), alive at micro-batches 2 and 3, and gradient memory: with
  // the plain parameters' accumulating .grad they are all the gradient bytes alive between backwards.
  const std::size_t want = 2 * 4 * 4 * (48 + 16 + 64 + 64);
  std::size_t plain_bytes = 0;
  for (const auto& [name, p] : b->named_parameters())
    if (!galore_b->is_projected(p)) plain_bytes += p.nbytes();
  ASSERT_EQ(accumulator_bytes.size(), 12u);
  for (std::size_t i = 0; i < accumulator_bytes.size(); ++i) {
    EXPECT_EQ(accumulator_bytes[i], i % 3 == 0 ? 0u : want) << "micro-batch " << i;
    if (i % 3 != 0) {
      EXPECT_EQ(gradient_live[i], want + plain_bytes) << "micro-batch " << i;
    }
  }
}

// ---- clipping --------------------------------------------------------------------------------------------

// SGD with lr 1 and no momentum moves each weight by exactly the gradient it applied (GaLore: by
// scale * P R, so |dW| / scale = |R|), so the applied gradients are read back from the weights in float64.
double applied_norm(const std::vector<std::vector<float>>& before, const std::vector<std::vector<float>>& after,
                    const std::vector<double>& divide) {
  double total = 0.0;
  for (std::size_t i = 0; i < before.size(); ++i) {
    double sq = 0.0;
    for (std::size_t j = 0; j < before[i].size(); ++j) {
      const double d = static_cast<double>(after[i][j]) - before[i][j];
      sq += d * d;
    }
    total += sq / (divide[i] * divide[i]);
  }
  return std::sqrt(total);
}

TEST(LayerwiseClip, AppliedGlobalNormStaysBelowTheThreshold) {
  for (const std::int64_t rank : {0, 4}) {
    SCOPED_TRACE(rank == 0 ? "plain" : "galore");
    TrainerConfig c = base_config();
    c.optimizer = mt::optim::Spec::sgd({.lr = 1.0});
    c.galore_rank = rank;
    c.galore_scale = 0.25;
    c.grad_accum = 2;
    c.layerwise_update = true;
    std::vector<double> unclipped;
    const auto free_run = train(c, 1, &unclipped);
    const auto start = all_values(*make_gpt());
    c.grad_clip = 1e-3 * unclipped[0];
    auto gpt = make_gpt();
    Trainer t(c, gpt, gpt_loss(gpt), std::make_shared<TokenDataset>(40, 8, 32));
    const double reported = t.train_step().grad_norm;
    EXPECT_NEAR(reported, unclipped[0], 1e-9 * unclipped[0]);  // the norm before clipping
    std::vector<double> divide;
    for (const auto& [name, p] : gpt->named_parameters())
      divide.push_back(rank > 0 && dynamic_cast<mt::optim::GaLore&>(t.optimizer()).is_projected(p) ? 0.25 : 1.0);
    const double applied = applied_norm(start, all_values(*gpt), divide);
    // Every parameter is over its share here, so each lands at c_p / (1 + 1e-6 / norm_p) and the sum at the
    // threshold; the tolerance covers fp32 rounding of the weights' differences (|W| ~ 1, |dW| ~ 1e-4).
    EXPECT_LE(applied, c.grad_clip * (1.0 + 1e-3));
    EXPECT_GT(applied, c.grad_clip * 0.9);
    const double unclipped_applied = applied_norm(start, free_run, divide);
    EXPECT_NEAR(unclipped_applied, unclipped[0], 1e-3 * unclipped[0]);  // the reading back works

    // A huge threshold changes nothing, bit for bit.
    c.grad_clip = 1e6;
    EXPECT_EQ(train(c, 2), [&] {
      TrainerConfig off = c;
      off.grad_clip = 0.0;
      return train(off, 2);
    }());
  }
}

// ---- config ----------------------------------------------------------------------------------------------

TEST(LayerwiseConfig, RoundTripsAndRefusesWhatCannotWork) {
  TrainerConfig c;
  c.layerwise_update = true;
  EXPECT_TRUE(TrainerConfig::from_json(c.to_json()).layerwise_update);
  EXPECT_FALSE(TrainerConfig::from_json(TrainerConfig{}.to_json()).layerwise_update);
  nlohmann::json j = c.to_json();
  j["layerwise_update"] = 1;
  try {
    TrainerConfig::from_json(j);
    ADD_FAILURE() << "a number for layerwise_update was accepted";
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("layerwise_update"), std::string::npos) << e.what();
  }
  c.grad_accum = 4;
  c.grad_clip = 1.0;
  c.galore_rank = 8;
  EXPECT_NO_THROW(c.validate());  // accumulation and clipping both work layer-wise
  c.galore_rank = 0;
  c.canonical_reduction = true;  // the hooks fold the tree (with GaLore refused: test_trainer.cpp)
  EXPECT_NO_THROW(c.validate());
  c.precision = mt::amp::Precision::fp16;
  try {
    c.validate();
    ADD_FAILURE() << "layerwise_update with fp16 was accepted";
  } catch (const mt::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("layerwise_update with precision 'fp16' cannot work"), std::string::npos) << what;
    EXPECT_NE(what.find("loss scaler"), std::string::npos) << what;
  }
}

}  // namespace

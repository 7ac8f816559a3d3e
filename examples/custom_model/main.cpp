// A model memtrain does not ship, trained with every memory technique through the Trainer: what a user's own
// program looks like (docs/cpp_guide.md walks through it). The model is a two-block attention regressor over
// sequences of feature vectors; the data are generated. Built in this tree as memtrain_custom_model, and by
// the install check as an outside project against the installed package (CMakeLists.txt here).
//
//   memtrain_custom_model [--steps N] [--checkpointing POLICY] [--precision fp32|bf16|fp16]
//                         [--galore-rank R] [--galore-targets GLOB,GLOB] [--no-layerwise] [--grad-accum K]
//                         [--out-dir DIR] [--print-params]
//
// Defaults: 8-bit GaLore (rank 8) on the blocks' mixer and feed-forward weights, full activation
// checkpointing of the blocks, bf16 autocast, gradient accumulation 2, layer-wise updates. At the end: the
// memory report, DIR/summary.json, and "custom_model: val loss A -> B".
#include <memtrain/memtrain.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

using namespace memtrain;

namespace {

// Multi-head self-attention over the sequence, with its own parameter names: "w_in" (q, k, v) and "w_out".
class Mixer : public nn::Module {
 public:
  Mixer(std::int64_t width, std::int64_t heads) : width_(width), heads_(heads) {
    w_in_ = register_module("w_in", std::make_shared<nn::Linear>(width, 3 * width));
    w_out_ = register_module("w_out", std::make_shared<nn::Linear>(width, width));
  }
  Tensor forward(const Tensor& x) const {  // x [B, T, C] -> [B, T, C]
    const std::int64_t B = x.size(0), T = x.size(1), C = width_, H = heads_, D = C / H;
    const std::vector<Tensor> qkv = ops::split(w_in_->forward(x), {C, C, C}, -1);
    auto heads = [&](const Tensor& t) { return t.reshape({B, T, H, D}).transpose(1, 2); };
    const Tensor y = ops::scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), true);
    return w_out_->forward(y.transpose(1, 2).reshape({B, T, C}));
  }

 private:
  std::int64_t width_, heads_;
  std::shared_ptr<nn::Linear> w_in_, w_out_;
};

// One block: x + mixer(norm(x)), then + ffn(norm(.)); the feed-forward is a Sequential of its own.
class Block : public nn::Module {
 public:
  Block(std::int64_t width, std::int64_t heads) {
    norm1_ = register_module("norm1", std::make_shared<nn::LayerNorm>(width));
    mixer_ = register_module("mixer", std::make_shared<Mixer>(width, heads));
    norm2_ = register_module("norm2", std::make_shared<nn::LayerNorm>(width));
    ffn_ = register_module("ffn", std::make_shared<nn::Sequential>(
                                      std::make_shared<nn::Linear>(width, 4 * width),
                                      [](const Tensor& h) { return ops::gelu(h); },
                                      std::make_shared<nn::Linear>(4 * width, width)));
  }
  Tensor forward(const Tensor& x) const {
    const Tensor h = ops::add(x, mixer_->forward(norm1_->forward(x)));
    return ops::add(h, ffn_->forward(norm2_->forward(h)));
  }

 private:
  std::shared_ptr<nn::LayerNorm> norm1_, norm2_;
  std::shared_ptr<Mixer> mixer_;
  std::shared_ptr<nn::Sequential> ffn_;
};

// x [B, T, F] -> one value per sequence [B, 1]. The blocks sit in an nn::Sequential: that is what makes
// them checkpointable blocks for TrainerConfig::activation_checkpointing.
class SequenceRegressor : public nn::Module {
 public:
  SequenceRegressor(std::int64_t features, std::int64_t seq_len, std::int64_t width, std::int64_t heads,
                    std::int64_t blocks) {
    embed_ = register_module("embed", std::make_shared<nn::Linear>(features, width));
    // Made with zeros() and registered: registration accounts it under "parameters".
    pos_ = register_parameter("pos", zeros({seq_len, width}));
    blocks_ = register_module("blocks", std::make_shared<nn::Sequential>());
    for (std::int64_t i = 0; i < blocks; ++i) blocks_->append(std::make_shared<Block>(width, heads));
    norm_ = register_module("norm", std::make_shared<nn::LayerNorm>(width));
    readout_ = register_module("readout", std::make_shared<nn::Linear>(width, 1));
  }
  Tensor forward(const Tensor& x) const {
    // Under bf16 autocast embed's output is bf16 and pos is f32: the add runs in bf16 (autocast.h).
    Tensor h = ops::add(embed_->forward(x), pos_);
    h = norm_->forward(blocks_->forward(h));
    return readout_->forward(ops::mean(h, {1}));
  }

 private:
  std::shared_ptr<nn::Linear> embed_, readout_;
  Tensor pos_;
  std::shared_ptr<nn::Sequential> blocks_;
  std::shared_ptr<nn::LayerNorm> norm_;
};

// y = mean_t tanh(x_t . a) * (x_{t-1} . b): a target that needs each position and its predecessor.
struct Split {
  Tensor x, y;
};
Split make_data(std::int64_t n, std::int64_t seq_len, std::int64_t features, const std::vector<float>& a,
                const std::vector<float>& b) {
  Tensor x = randn({n, seq_len, features});
  std::vector<float> y(static_cast<std::size_t>(n));
  const float* px = x.data<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    double sum = 0;
    for (std::int64_t t = 1; t < seq_len; ++t) {
      double xa = 0, xb = 0;
      for (std::int64_t f = 0; f < features; ++f) {
        xa += px[(i * seq_len + t) * features + f] * a[static_cast<std::size_t>(f)];
        xb += px[(i * seq_len + t - 1) * features + f] * b[static_cast<std::size_t>(f)];
      }
      sum += std::tanh(xa) * xb;
    }
    y[static_cast<std::size_t>(i)] = static_cast<float>(sum / static_cast<double>(seq_len - 1));
  }
  return {x, tensor(y, {n, 1})};
}

struct Options {
  std::int64_t steps = 60, grad_accum = 2, galore_rank = 8;
  std::string checkpointing = "full", precision = "bf16", out_dir = "custom_model_run";
  std::string galore_targets = "blocks.*.mixer.*.weight,blocks.*.ffn.*.weight";
  bool layerwise = true, print_params = false;
};

[[noreturn]] void usage(const char* argv0, int code) {
  std::fprintf(stderr,
               "usage: %s [--steps N] [--checkpointing POLICY] [--precision fp32|bf16|fp16] [--galore-rank R]\n"
               "          [--galore-targets GLOB,GLOB] [--no-layerwise] [--grad-accum K] [--out-dir DIR] "
               "[--print-params]\n",
               argv0);
  std::exit(code);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(argv[0], 2);
      return argv[++i];
    };
    if (a == "--steps") o.steps = std::stoll(value());
    else if (a == "--checkpointing") o.checkpointing = value();
    else if (a == "--precision") o.precision = value();
    else if (a == "--galore-rank") o.galore_rank = std::stoll(value());
    else if (a == "--galore-targets") o.galore_targets = value();
    else if (a == "--no-layerwise") o.layerwise = false;
    else if (a == "--grad-accum") o.grad_accum = std::stoll(value());
    else if (a == "--out-dir") o.out_dir = value();
    else if (a == "--print-params") o.print_params = true;
    else usage(argv[0], a == "--help" ? 0 : 2);
  }
  return o;
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');)
    if (!part.empty()) parts.push_back(part);
  return parts;
}

int run(const Options& o) {
  constexpr std::int64_t kFeatures = 8, kSeqLen = 16, kWidth = 64, kHeads = 4, kBlocks = 2;
  manual_seed(7);
  std::vector<float> a(kFeatures), b(kFeatures);
  for (std::int64_t f = 0; f < kFeatures; ++f) {
    a[static_cast<std::size_t>(f)] = static_cast<float>(std::sin(1.0 + static_cast<double>(f)));
    b[static_cast<std::size_t>(f)] = static_cast<float>(std::cos(2.0 * static_cast<double>(f)) / 2);
  }
  Split train_split, val_split;
  {
    CategoryGuard data(MemoryCategory::data);
    train_split = make_data(2048, kSeqLen, kFeatures, a, b);
    val_split = make_data(256, kSeqLen, kFeatures, a, b);
  }
  auto train = std::make_shared<data::TensorDataset>(train_split.x, train_split.y);
  auto val = std::make_shared<data::TensorDataset>(val_split.x, val_split.y);

  auto model = std::make_shared<SequenceRegressor>(kFeatures, kSeqLen, kWidth, kHeads, kBlocks);
  if (o.print_params)
    for (const auto& [name, p] : model->named_parameters()) std::printf("param %s %s\n", name.c_str(), shape_str(p.shape()).c_str());

  train::TrainerConfig c;
  c.optimizer = optim::Spec::adamw8bit({.lr = 2e-3, .weight_decay = 0.01});
  c.galore_rank = o.galore_rank;
  c.galore_targets = split_commas(o.galore_targets);
  c.galore_update_gap = 50;
  c.galore_scale = 1.0;
  c.activation_checkpointing = ckpt::Policy::parse(o.checkpointing);
  c.precision = amp::parse_precision(o.precision);
  c.layerwise_update = o.layerwise;
  c.micro_batch = 32;
  c.grad_accum = o.grad_accum;
  c.max_steps = o.steps;
  c.schedule.warmup_steps = std::min<std::int64_t>(10, o.steps - 1);
  c.eval_interval = 0;
  c.eval_batches = 8;
  c.log_interval = 20;
  c.summary_path = o.out_dir + "/summary.json";
  std::filesystem::create_directories(o.out_dir);

  train::Trainer trainer(c, model,
                         [&](const data::Batch& batch) {
                           // The head's output is cast up: the loss of a regression is taken in f32.
                           return ops::mse_loss(model->forward(batch.inputs).to(DType::f32), batch.targets);
                         },
                         train, val);
  const double before = trainer.evaluate();
  const train::RunSummary summary = trainer.fit();
  std::printf("custom_model: val loss %.4f -> %.4f\n", before, summary.final_val_loss.value_or(NAN));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "custom_model: %s\n", e.what());
    return 1;
  }
}

// Trains a small CNN (two conv-BN-ReLU-pool stages, two linear layers) on Fashion-MNIST and reports the
// test accuracy and the time it took; <out-dir>/summary.json has test_accuracy, test_loss and images_per_second
// beside the run summary. Data: Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist).
//
//   memtrain_train_fashion_mnist --help
#include <memtrain/memtrain.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

using namespace memtrain;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  CLI::App app{"Train a small CNN on Fashion-MNIST with memtrain"};
  std::string data_dir = "/usr/share/datasets/fashion-mnist", optimizer = "adamw", out_dir = "runs/fashion_mnist";
  std::string checkpoint = "none";
  std::int64_t epochs = 2, batch = 64;
  double lr = 2e-3;
  std::uint64_t seed = 1;
  bool plan_only = false;
  std::string summary_json;
  app.add_option("--data", data_dir, "directory with the four IDX files (.gz or raw)")->capture_default_str();
  app.add_option("--epochs", epochs, "passes over the 60k training images")->capture_default_str();
  app.add_option("--batch", batch, "images per step")->capture_default_str();
  app.add_option("--lr", lr, "peak learning rate")->capture_default_str();
  app.add_option("--optimizer", optimizer, "adamw, adamw8bit, lion, lion8bit, sgd, adafactor")->capture_default_str();
  app.add_option("--out-dir", out_dir, "metrics and summary")->capture_default_str();
  app.add_option("--checkpoint", checkpoint, "activation checkpointing of the two conv stages: none, full, every:K, "
                 "selective[:op1,op2], budget:SIZE")->capture_default_str();
  app.add_option("--seed", seed, "seed for init, data order and dropout")->capture_default_str();
  app.add_flag("--plan-only", plan_only,
               "predict the run's memory on the meta device and stop (no data read, nothing trained); "
               "--summary-json gets it under \"predicted\"");
  app.add_option("--summary-json", summary_json, "run summary path (default <out-dir>/summary.json)");
  CLI11_PARSE(app, argc, argv);

  try {
    // A plan reads no data: blank images stand in for Fashion-MNIST's.
    const data::ImageSplits splits = data::fashion_mnist_splits(data_dir, plan_only);
    const std::shared_ptr<const data::Dataset>& train_set = splits.train;
    const std::shared_ptr<const data::Dataset>& test_set = splits.test;
    if (!plan_only) fmt::print("data: {}\n      {}\n", train_set->describe(), test_set->describe());

    train::TrainerConfig config;
    config.model.preset = "cnn";
    config.optimizer = optim::spec_from_name(optimizer, lr, 1e-4);
    config.micro_batch = batch;
    config.max_steps = epochs * (train_set->size() / batch);
    config.schedule = {.warmup_steps = 50, .min_lr_ratio = 0.05, .decay = train::LrDecay::cosine};
    config.grad_clip = 0.0;
    config.eval_interval = 0;
    config.eval_batches = 20;
    config.log_interval = 50;
    config.seed = seed;
    config.activation_checkpointing = ckpt::Policy::parse(checkpoint);
    if (!plan_only) fs::create_directories(out_dir);
    config.metrics_path = (fs::path(out_dir) / "metrics.jsonl").string();
    config.summary_path = summary_json.empty() ? (fs::path(out_dir) / "summary.json").string() : summary_json;

    if (plan_only) {
      train::RunInputs inputs;
      inputs.make_model = [seed] {
        manual_seed(seed);
        return std::static_pointer_cast<nn::Module>(std::make_shared<nn::CNN>(nn::CNNConfig{}));
      };
      inputs.make_loss = [](const std::shared_ptr<nn::Module>& m) -> train::LossFn {
        auto cnn = std::static_pointer_cast<nn::CNN>(m);
        return [cnn](const data::Batch& b) { return ops::cross_entropy(cnn->forward(b.inputs), b.targets); };
      };
      inputs.train = train_set;
      inputs.val = test_set;
      inputs.resident_data_bytes = splits.loaded_bytes;
      const train::MemoryPrediction p = train::predict_memory(config, inputs);
      fmt::print("plan: CNN, {} images per step, optimizer {}, checkpointing {}\n{}", batch,
                 config.optimizer.to_string(), config.activation_checkpointing.to_string(), p.report());
      if (!summary_json.empty()) train::write_prediction(p, config, summary_json);
      return 0;
    }

    manual_seed(seed);
    auto model = std::make_shared<nn::CNN>(nn::CNNConfig{});
    fmt::print("model: CNN with {} parameters, optimizer {}, {} steps of {} images\n", model->num_parameters(),
               config.optimizer.to_string(), config.max_steps, batch);
    auto loss_fn = [model](const data::Batch& b) { return ops::cross_entropy(model->forward(b.inputs), b.targets); };
    train::Trainer trainer(config, model, loss_fn, train_set, test_set);
    trainer.memory_notes = [model] { return model->checkpointing().describe(2); };

    const auto start = std::chrono::steady_clock::now();
    const train::RunSummary summary = trainer.fit();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const train::ClassifierResult result = train::evaluate_classifier(
        *model, [&model](const Tensor& x) { return model->forward(x); }, *test_set, 500);
    train::write_classifier_summary(summary, result, config.summary_path);
    fmt::print("\ntest accuracy {:.2f}% (loss {:.4f}) after {} epochs in {:.0f} s ({:.0f} images/s), final train "
               "loss {:.4f}\n",
               100.0 * result.accuracy, result.loss, epochs, seconds, summary.samples_per_second,
               summary.final_train_loss);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_fashion_mnist: %s\n", e.what());
    return 1;
  }
  return 0;
}

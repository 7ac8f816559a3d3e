// Trains a two-layer MLP classifier on a generated data set (Gaussian blobs in 32 dimensions) and ends
// with the memory report: every byte by category. The default optimizer is 8-bit AdamW, whose state
// takes about a quarter of fp32 AdamW's bytes (compare with --optimizer adamw).
//
//   memtrain_train_mlp [--steps N] [--batch B] [--hidden H] [--lr LR] [--bf16]
//                      [--optimizer adamw8bit|adamw|lion|lion8bit|sgd|adafactor]
//
// Data loaders, models and the Trainer come with later issues.
#include <memtrain/memtrain.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace memtrain;

namespace {

struct Options {
  int steps = 300;
  int batch = 128;
  int hidden = 256;
  double lr = 3e-3;
  bool bf16 = false;
  std::string optimizer = "adamw8bit";
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--steps") o.steps = std::atoi(next());
    else if (a == "--batch") o.batch = std::atoi(next());
    else if (a == "--hidden") o.hidden = std::atoi(next());
    else if (a == "--lr") o.lr = std::atof(next());
    else if (a == "--bf16") o.bf16 = true;
    else if (a == "--optimizer") o.optimizer = next();
    else {
      std::fprintf(stderr,
                   "usage: %s [--steps N] [--batch B] [--hidden H] [--lr LR] [--bf16] "
                   "[--optimizer adamw8bit|adamw|lion|lion8bit|sgd|adafactor]\n",
                   argv[0]);
      std::exit(a == "--help" ? 0 : 2);
    }
  }
  return o;
}

optim::Spec make_spec(const Options& o) {
  if (o.optimizer == "adamw8bit") return optim::Spec::adamw8bit({.lr = o.lr, .weight_decay = 0.01});
  if (o.optimizer == "adamw") return optim::Spec::adamw({.lr = o.lr, .weight_decay = 0.01});
  if (o.optimizer == "lion") return optim::Spec::lion({.lr = o.lr / 10, .weight_decay = 0.1});
  if (o.optimizer == "lion8bit") return optim::Spec::lion8bit({.lr = o.lr / 10, .weight_decay = 0.1});
  if (o.optimizer == "sgd") return optim::Spec::sgd({.lr = o.lr * 10, .momentum = 0.9});
  if (o.optimizer == "adafactor") return optim::Spec::adafactor({.lr = o.lr});
  std::fprintf(stderr, "unknown optimizer '%s'\n", o.optimizer.c_str());
  std::exit(2);
}

constexpr int kFeatures = 32, kClasses = 10, kSamples = 8192;

// Class c is a Gaussian blob around a random center; labels are stored as i64.
struct DataSet {
  Tensor x, y;
};

DataSet make_data() {
  CategoryGuard g(MemoryCategory::data);
  Tensor centers = ops::mul(randn({kClasses, kFeatures}), 0.3);  // overlapping blobs: not trivially separable
  std::vector<std::int64_t> labels(kSamples);
  for (int i = 0; i < kSamples; ++i) labels[i] = i % kClasses;
  Tensor y = tensor(labels, {kSamples});
  Tensor x = randn({kSamples, kFeatures});
  const float* c = centers.data<float>();
  float* px = x.data<float>();
  for (int i = 0; i < kSamples; ++i)
    for (int f = 0; f < kFeatures; ++f) px[i * kFeatures + f] += c[labels[i] * kFeatures + f];
  return {x, y};
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  manual_seed(0);
  const DataSet data = make_data();

  std::vector<Tensor> params;
  {
    CategoryGuard g(MemoryCategory::parameters);
    const double s1 = 1.0 / std::sqrt(kFeatures), s2 = 1.0 / std::sqrt(opt.hidden);
    params = {ops::mul(randn({opt.hidden, kFeatures}), s1), zeros({opt.hidden}),
              ops::mul(randn({kClasses, opt.hidden}), s2), zeros({kClasses})};
    for (auto& p : params) p.set_requires_grad();
  }
  const optim::Spec spec = make_spec(opt);
  std::unique_ptr<optim::Optimizer> optimizer = spec.make(optim::decay_groups(
      {{"fc1.weight", params[0]}, {"fc1.bias", params[1]}, {"fc2.weight", params[2]}, {"fc2.bias", params[3]}},
      spec.lr, spec.weight_decay));
  const DType compute = opt.bf16 ? DType::bf16 : DType::f32;
  std::printf("memtrain MLP: %d -> %d -> %d, batch %d, %d steps, compute %s, optimizer %s\n", kFeatures, opt.hidden,
              kClasses, opt.batch, opt.steps, std::string(dtype_name(compute)).c_str(), spec.to_string().c_str());

  const int batches = kSamples / opt.batch;
  for (int step = 0; step < opt.steps; ++step) {
    const int b = step % batches;
    Tensor loss;
    {
      CategoryGuard g(MemoryCategory::activations);
      Tensor x = data.x.narrow(0, b * opt.batch, opt.batch).to(compute);
      Tensor y = data.y.narrow(0, b * opt.batch, opt.batch);
      Tensor h = ops::relu(ops::linear(x, params[0].to(compute), params[1].to(compute)));
      Tensor logits = ops::linear(h, params[2].to(compute), params[3].to(compute));
      loss = ops::cross_entropy(logits.to(DType::f32), y);
    }
    loss.backward();
    optimizer->step();
    optimizer->zero_grad();
    if (step % 50 == 0 || step == opt.steps - 1) std::printf("step %4d  loss %.4f\n", step, loss.item());
  }

  // Accuracy over the whole set.
  autograd::NoGradGuard no_grad;
  CategoryGuard g(MemoryCategory::activations);
  Tensor h = ops::relu(ops::linear(data.x, params[0], params[1]));
  Tensor pred = ops::argmax(ops::linear(h, params[2], params[3]), 1);
  std::int64_t correct = 0;
  for (int i = 0; i < kSamples; ++i) correct += pred.data<std::int64_t>()[i] == data.y.data<std::int64_t>()[i];
  std::printf("accuracy %.2f%% on %d samples\n\n", 100.0 * static_cast<double>(correct) / kSamples, kSamples);
  std::printf("optimizer state: %zu bytes for %lld parameters\n\n", optimizer->state_bytes(),
              static_cast<long long>(kFeatures * opt.hidden + opt.hidden + opt.hidden * kClasses + kClasses));
  std::printf("%s", memory_report().c_str());
  return 0;
}

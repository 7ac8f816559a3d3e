#include "memtrain/train/classifier_eval.h"

#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/error.h"
#include "memtrain/ops/nn.h"
#include "memtrain/ops/reduce.h"

#include <algorithm>

namespace memtrain::train {

ClassifierResult evaluate_classifier(nn::Module& model, const std::function<Tensor(const Tensor&)>& forward,
                                     const data::Dataset& test, std::int64_t batch) {
  MT_CHECK(test.size() > 0 && batch >= 1, "train::evaluate_classifier", "needs samples and batch >= 1, got {} and {}",
           test.size(), batch);
  model.eval();
  autograd::NoGradGuard no_grad;
  std::int64_t correct = 0;
  double loss_sum = 0.0;
  for (std::int64_t start = 0; start < test.size(); start += batch) {
    std::vector<std::int64_t> idx;
    for (std::int64_t i = start; i < std::min(test.size(), start + batch); ++i) idx.push_back(i);
    const data::Batch b = test.collate(idx);
    const Tensor logits = forward(b.inputs);
    loss_sum += ops::cross_entropy(logits, b.targets).item() * static_cast<double>(b.samples);
    const Tensor pred = ops::argmax(logits, 1).to(Device::cpu()).contiguous();
    const Tensor labels = b.targets.to(Device::cpu()).contiguous();
    for (std::int64_t i = 0; i < b.samples; ++i)
      correct += pred.data<std::int64_t>()[i] == labels.data<std::int64_t>()[i];
  }
  model.train();
  const auto n = static_cast<double>(test.size());
  return {static_cast<double>(correct) / n, loss_sum / n};
}

void write_classifier_summary(RunSummary summary, const ClassifierResult& result, const std::string& path) {
  summary.metrics["test_accuracy"] = result.accuracy;
  summary.metrics["test_loss"] = result.loss;
  summary.metrics["images_per_second"] = summary.samples_per_second;
  write_summary(summary, path);
}

}  // namespace memtrain::train

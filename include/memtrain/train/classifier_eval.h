// Test-set accuracy of an image classifier: every sample once, in eval mode and without a graph, batch by
// batch in index order. For the image examples (train_fashion_mnist, train_efficientnet), whose Trainer
// evaluates the loss only.
#pragma once

#include "memtrain/data/loader.h"
#include "memtrain/nn/module.h"
#include "memtrain/train/trainer.h"

#include <functional>

namespace memtrain::train {

struct ClassifierResult {
  double accuracy = 0.0;  // fraction of samples whose argmax logit is the label
  double loss = 0.0;      // mean cross entropy
};

// forward maps inputs [B, ...] to logits [B, classes]. The model is put in eval mode for the pass and back in
// training mode after. Throws for an empty dataset or a batch < 1.
ClassifierResult evaluate_classifier(nn::Module& model, const std::function<Tensor(const Tensor&)>& forward,
                                     const data::Dataset& test, std::int64_t batch);

// fit() writes its summary before a test pass: this writes it again (atomically, to `path`) with the pass's
// results beside it, as metrics test_accuracy, test_loss and images_per_second (samples_per_second).
void write_classifier_summary(RunSummary summary, const ClassifierResult& result, const std::string& path);

}  // namespace memtrain::train

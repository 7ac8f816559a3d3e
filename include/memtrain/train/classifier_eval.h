// Test-set accuracy of an image classifier: every sample once, in eval mode and without a graph, batch by
// batch in index order. For the image examples (train_fashion_mnist, train_efficientnet), whose Trainer
// evaluates the loss only.
#pragma once

#include "memtrain/data/loader.h"
#include "memtrain/nn/module.h"

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

}  // namespace memtrain::train

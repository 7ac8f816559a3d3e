// What the resume tests of the multi-rank layouts share: one run that saves a checkpoint after step 3 and goes on
// to step 6, and a second, made the same way, that resumes from the newest checkpoint and trains the same steps.
// A resumed run must continue on the bits of the run that never stopped.
#pragma once

#include "memtrain/core/tensor.h"
#include "memtrain/nn/module.h"
#include "memtrain/train/trainer.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace memtrain::dist_test {

inline std::vector<float> values(const Tensor& t) {
  const Tensor c = t.detach().to(DType::f32).contiguous();
  return {c.data<float>(), c.data<float>() + c.numel()};
}

struct ResumeRuns {
  std::string saved;                             // the checkpoint the first run wrote after step 3
  std::int64_t resumed_at = -1;                  // the step the second run resumed at (-1: it found none)
  std::vector<double> went_on, resumed;          // the losses of steps 4 to 6 in each run
  std::map<std::string, std::vector<float>> went_on_weights, resumed_weights;  // after step 6
};

// make() -> a pair (model, std::unique_ptr<train::Trainer>), attached to its ranks as the test needs.
template <typename Make>
ResumeRuns run_and_resume(const Make& make) {
  ResumeRuns r;
  {
    auto [model, trainer] = make();
    for (int s = 0; s < 3; ++s) trainer->train_step();
    r.saved = trainer->save_checkpoint();
    for (int s = 3; s < 6; ++s) r.went_on.push_back(trainer->train_step().loss);
    for (const auto& [name, p] : model->named_parameters()) r.went_on_weights[name] = values(p);
  }
  auto [model, trainer] = make();
  if (!trainer->resume_latest()) return r;
  r.resumed_at = trainer->step();
  for (int s = 3; s < 6; ++s) r.resumed.push_back(trainer->train_step().loss);
  for (const auto& [name, p] : model->named_parameters()) r.resumed_weights[name] = values(p);
  return r;
}

}  // namespace memtrain::dist_test

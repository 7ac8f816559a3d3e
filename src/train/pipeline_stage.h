// What a Trainer holds as one stage of a pipeline (memtrain/train/pipeline.h), and the helpers of its step.
#pragma once

#include "memtrain/core/allocator.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/train/pipeline.h"
#include "memtrain/train/trainer_config.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <vector>

namespace memtrain::train::detail {

// Message tags between stages (between two stages, each tag's messages arrive in order).
enum PipelineTag : int {
  kTagActivation,      // forward: a stage's output to the next
  kTagActivationGrad,  // backward: its gradient to the previous stage
  kTagTokenRowsGrad,   // first -> last: the lookup's gradient, per micro-batch
  kTagTiedWeight,      // last -> first: wte after the step
  kTagEvalActivation,  // evaluate(): forward only
};

struct PipelineStage {
  std::shared_ptr<PipelineLink> link;
  std::shared_ptr<const nn::GPT> model;
  int stage = 0;
  int stages = 1;
  Tensor tied;  // wte: the last stage's trained parameter, the first stage's frozen copy; undefined elsewhere
  // The whole model's trained parameters in one rank's order (its optimizer groups'): their sizes, and where
  // each of this stage's trained_params() is among them.
  std::vector<std::int64_t> global_numels;
  std::vector<std::size_t> global_index;
  // Seconds this stage has waited for another stage's activations or gradients (the pipeline's bubble and
  // transfer time), and the seconds of the micro-batch loops they fall in: over every step so far.
  double idle_seconds = 0.0, step_seconds = 0.0;
  bool first() const { return stage == 0; }
  bool last() const { return stage + 1 == stages; }
};

// params without the stage's tied weight: what the stage's gradient tree sums (the tied one has its own).
std::vector<Tensor> untied(const PipelineStage& stage, const std::vector<Tensor>& params);
// The canonical norm's blocks: each stage filled in its own parameters', the others are zero; every stage gets
// all of them (x + 0 is exact, so the sum over stages is the owner's value).
void combine_stage_blocks(const PipelineStage& stage, std::vector<double>& blocks);
// Every stage's memory (its allocator's `stats`, its optimizer's state bytes) and idle fraction, gathered from all
// stages (each calls it): RunSummary::stages.
nlohmann::json stage_table(const PipelineStage& stage, const MemoryStats& stats, std::size_t optimizer_state_bytes);

// The names of `whole`'s trained parameters in the order a Trainer over it with `config` holds them (its
// optimizer groups'); `whole` may live on meta. Defined beside the Trainer's optimizer construction.
std::vector<std::string> trained_order(const TrainerConfig& config, const nn::NamedTensors& whole);

}  // namespace memtrain::train::detail

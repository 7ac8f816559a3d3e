// Pipeline parallelism (TrainerConfig::pipeline_stages = P): each rank of the launcher's group holds one stage
// of the model (nn::GPTStage: contiguous blocks, the embeddings on the first stage, ln_f and the head on the
// last), so no rank holds the whole model, its gradients or its optimizer state.
//
// A step's grad_accum micro-batches (m >= P) flow through the stages in the order pipeline_order gives:
// activations go forward and their gradients back as messages over a PipelineLink (dist::attach_gpt_pipeline
// makes one over the MPI group). Under 1F1B a stage holds at most P - stage
// micro-batches' activations at once, against m under GPipe's order.
//
// The same bits as one rank: every stage sums its micro-batch gradients in the canonical tree
// (TrainerConfig::canonical_reduction, on for a pipeline) in micro-batch order, the global norm is the canonical
// one over the whole model's parameters in one rank's order (each stage fills in its own 256-element blocks),
// and the loss is the last stage's. The tied wte is trained by the last stage. The first stage looks rows up in
// a frozen copy and sends the lookup's gradient, micro-batch by micro-batch, to the last stage, which scatters it
// into that micro-batch's head gradient exactly as the embedding's backward does on one rank, before the
// micro-batch joins the tree. After each step the last stage sends the new wte to the first. The price of
// those bits: the last stage holds up to P micro-batches' [V, C] head gradients while the lookups' gradients
// are on their way.
//
// Only the last stage has the loss (it is shared with every rank for the metrics); rank 0 writes the run's files.
#pragma once

#include "memtrain/core/tensor.h"

#include <cstdint>
#include <string>
#include <vector>

namespace memtrain::train {

struct PipelineAction {
  bool forward = true;  // else backward
  std::int64_t micro_batch = 0;
  bool operator==(const PipelineAction&) const = default;
};

// The order in which stage `stage` of `stages` runs the forwards and backwards of micro-batches 0..m-1.
// "1f1b": min(stages - stage - 1, m) warm-up forwards, then one forward and one backward in turn, then the
// remaining backwards (PipeDream-Flush / Megatron). "gpipe": every forward, then every backward. Both run each
// micro-batch's backward in micro-batch order.
std::vector<PipelineAction> pipeline_order(const std::string& schedule, int stage, int stages,
                                           std::int64_t micro_batches);

// What a Trainer needs to be one stage of a pipeline: messages to the other stages, and values gathered from all
// of them. dist::attach_gpt_pipeline makes one over a dist::Communicator; Trainer::attach_pipeline takes it.
class PipelineLink {
 public:
  virtual ~PipelineLink() = default;
  virtual int stage() const = 0;
  virtual int stages() const = 0;
  // Starts sending t (any dtype and shape, on the CPU) to stage `to` and returns at once; t stays alive until
  // its bytes have left. Messages with one tag between two stages arrive in the order they were sent.
  virtual void send(const Tensor& t, int to, int tag) = 0;
  // The next tensor `from` sent with `tag`, in a new tensor (under the caller's memory category). Blocks, bounded
  // by the link's timeout, which names the stage waited for.
  virtual Tensor receive(int from, int tag) = 0;
  virtual void reap_sends() = 0;   // drops the sends that have completed
  virtual void flush_sends() = 0;  // waits until every send has completed
  // Every stage's values, stage by stage (each passes the same count).
  virtual std::vector<double> gather_f64(const std::vector<double>& mine) = 0;
  virtual std::vector<std::int64_t> gather_i64(const std::vector<std::int64_t>& mine) = 0;
};

}  // namespace memtrain::train

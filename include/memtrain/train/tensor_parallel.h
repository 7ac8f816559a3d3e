// Tensor parallelism (TrainerConfig::tensor_parallel = T): every rank of the group holds its part of each block
// and of the vocabulary (nn::GPT with an nn::TensorShard; nn/tensor_parallel_ops.h has the ops), so parameters,
// gradients and optimizer state per rank are about 1/T of the blocks'. The ranks train on the same batches:
// the forward and the backward sum the parts inside the model, so the loss is the same on every rank, and the
// parameters held whole receive identical gradients. What the Trainer adds is the global gradient norm (the
// parts' squares summed over the ranks, the whole parameters' counted once), fp16's overflow decision taken by
// all ranks together, and one writer of the run's files (rank 0).
//
// The sums inside the model change the order of the additions: a run matches the run alone to float rounding,
// not bit for bit.
#pragma once

#include <cstdint>
#include <vector>

namespace memtrain::train {

// What a Trainer needs from the other ranks of its tensor-parallel group; dist::attach_gpt_tensor_parallel makes
// one over a dist::Communicator.
class TensorParallelLink {
 public:
  virtual ~TensorParallelLink() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank's values, rank by rank (each passes the same count).
  virtual std::vector<double> gather_f64(const std::vector<double>& mine) = 0;
  virtual std::vector<std::int64_t> gather_i64(const std::vector<std::int64_t>& mine) = 0;
};

}  // namespace memtrain::train

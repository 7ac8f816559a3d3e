// Tensor parallelism over a dist::Communicator: the group a split GPT's layers sum over (nn/tensor_shard.h,
// nn/tensor_parallel_ops.h) and the trainer's side of it (train/tensor_parallel.h).
#pragma once

#include "memtrain/dist/communicator.h"
#include "memtrain/nn/tensor_shard.h"

#include <memory>

namespace memtrain::nn {
class GPT;
}  // namespace memtrain::nn
namespace memtrain::train {
class Trainer;
}  // namespace memtrain::train

namespace memtrain::dist {

// `comm`'s ranks as the group of a split model: sums by Communicator::all_reduce_canonical (the same bits on
// every rank, whatever the group's size), gathers by Communicator::all_gather. Build the model with
// nn::TensorShard{comm->rank(), comm->size(), tensor_parallel_group(comm)}.
std::shared_ptr<nn::TensorParallelGroup> tensor_parallel_group(std::shared_ptr<Communicator> comm);

// Makes `trainer` train `model` (an nn::GPT built with the shard above) as rank comm->rank() of a
// tensor-parallel group: the same batches on every rank, the global gradient norm over every rank's parts (the
// parameters held whole counted once), only rank 0 writing the run's files. Beside data parallelism (attached
// over the data group of dist::split_data_model) each data rank's group trains on its own block of the batches and
// the parts' gradients are summed over the data group. Refused before anything changes,
// naming the numbers: config.tensor_parallel differing from the group's size, a model built for another rank or
// group size, configs that differ between ranks.
void attach_gpt_tensor_parallel(train::Trainer& trainer, std::shared_ptr<const nn::GPT> model,
                                std::shared_ptr<Communicator> comm);

}  // namespace memtrain::dist

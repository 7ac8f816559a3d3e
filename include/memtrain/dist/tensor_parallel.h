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

// The launcher's ranks as data x tensor: rank = d * tensor + t, so a tensor-parallel group's ranks are
// neighbours (as Megatron-LM keeps them on one host). `tensor` holds the ranks whose parts make one model, `data`
// the ranks that hold the same parts and sum their gradients (dist::attach_data_parallel over it; a group of one
// when world's size is `tensor`). Every rank calls it together; refused when world's size is not a multiple of
// `tensor`.
struct DataTensorGroups {
  std::shared_ptr<Communicator> data;
  std::shared_ptr<Communicator> tensor;
};
DataTensorGroups split_data_tensor(const std::shared_ptr<Communicator>& world, int tensor);

// Makes `trainer` train `model` (an nn::GPT built with the shard above) as rank comm->rank() of a
// tensor-parallel group: the same batches on every rank, the global gradient norm over every rank's parts (the
// parameters held whole counted once), only rank 0 writing the run's files. Beside data parallelism (attached
// over the data group of split_data_tensor) each data rank's group trains on its own block of the batches and
// the parts' gradients are summed over the data group. Refused before anything changes,
// naming the numbers: config.tensor_parallel differing from the group's size, a model built for another rank or
// group size, configs that differ between ranks.
void attach_gpt_tensor_parallel(train::Trainer& trainer, std::shared_ptr<const nn::GPT> model,
                                std::shared_ptr<Communicator> comm);

}  // namespace memtrain::dist

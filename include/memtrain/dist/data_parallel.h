// Data parallel training over a dist::Communicator (ZeRO stage 0: every rank keeps every gradient and all
// optimizer state).
//
// Every rank runs the same Trainer on its own block of each step's micro-batches; DataParallel sums their
// gradients, target counts and losses over the ranks. Gradients go in buckets (reverse parameter order, the
// first bucket small so its reduction can start early, then bucket_bytes each), each one summed with
// Communicator::all_reduce_canonical: with the Trainer's canonical local tree, a run gives the same losses and
// weights, bit for bit, at 1, 2 or 4 ranks for the same global batch (micro_batch x grad_accum x ranks).
#pragma once

#include "memtrain/dist/communicator.h"
#include "memtrain/train/gradient_sync.h"
#include "memtrain/train/trainer.h"

#include <cstddef>
#include <memory>
#include <string>

namespace memtrain::dist {

struct DataParallelOptions {
  std::size_t first_bucket_bytes = std::size_t{1} << 20;  // the last parameters' gradients, ready first
  std::size_t bucket_bytes = std::size_t{25} << 20;
};

class DataParallel : public train::GradientSync {
 public:
  explicit DataParallel(std::shared_ptr<Communicator> comm, DataParallelOptions options = {});
  std::int64_t rank() const override { return comm_->rank(); }
  std::int64_t world_size() const override { return comm_->size(); }
  void check_same_config(const nlohmann::json& config) override;
  std::vector<std::int64_t> gather_i64(const std::vector<std::int64_t>& mine) override;
  std::vector<double> gather_f64(const std::vector<double>& mine) override;
  void reduce_gradients(const std::vector<Tensor>& params) override;
  void barrier() override { comm_->barrier(); }

  const DataParallelOptions& options() const { return options_; }
  Communicator& communicator() { return *comm_; }

 private:
  std::shared_ptr<Communicator> comm_;
  DataParallelOptions options_;
};

// "micro_batch: 8 here, 4 in the other" for the first field (in key order, nested keys joined by '.') whose
// value differs between two configs' JSON; empty when they are equal.
std::string first_difference(const nlohmann::json& here, const nlohmann::json& other);

// Makes `trainer` one rank of a data-parallel run over `comm` (trainer.config().world_size must equal
// comm->size()). With a group of one it changes nothing.
void attach_data_parallel(train::Trainer& trainer, std::shared_ptr<Communicator> comm,
                          DataParallelOptions options = {});

}  // namespace memtrain::dist

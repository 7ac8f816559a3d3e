// Data parallel training over a dist::Communicator (ZeRO stage 0: every rank keeps every gradient and all
// optimizer state).
//
// Every rank runs the same Trainer on its own block of each step's micro-batches; DataParallel sums their
// gradients, target counts and losses over the ranks. Gradients go in buckets in the order the backward makes
// them, the first bucket first_bucket_bytes so its sum can start early, then bucket_bytes each. That order is
// learned: the first step's buckets follow expect_order (the Trainer's: the model's parameters in reverse
// registration order; without it, reverse index order, which is not the backward's when the parameters are
// listed by optimizer group: a first bucket holding every layer's biases would fill only at the end and hold
// back every sum); after it, the buckets are planned again in the order rank 0's hooks reported the gradients
// (as PyTorch DDP rebuilds its buckets). A bucket is summed canonically (Communicator::all_reduce_canonical's
// reduce-scatter and all-gather) on a thread of its own as soon as the last of its gradients is final (the
// Trainer reports them from the gradient-ready hooks of the step's last backward), so communication overlaps
// the rest of the backward. Buckets are summed strictly in order, so every rank issues the same sequence of
// operations whatever order its hooks fire in. With the Trainer's canonical local tree, a run gives the same
// losses and weights, bit for bit, at 1, 2 or 4 ranks for the same global batch (micro_batch x grad_accum x
// ranks).
//
// Memory: a bucket's flat buffer becomes its parameters' gradients (they are views into it), so the sums need
// no copy beyond the packing. One bucket is in flight: a bucket is handed to the sums only once every earlier
// bucket that is packed has been summed, so a ZeRO-2 rank holds its shards plus the bucket being summed, the
// one filling and any packed out of order (a parameter's hook fired later than its bucket's place), however
// slow the sums. Every accounted allocation and free is made on the trainer's thread (the sums only fill
// buffers it made), so a rank's live bytes never depend on the sums' timing and its prediction on the meta
// device is exact.
#pragma once

#include "memtrain/dist/communicator.h"
#include "memtrain/train/gradient_sync.h"
#include "memtrain/train/trainer.h"

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace memtrain::dist {

struct DataParallelOptions {
  std::size_t first_bucket_bytes = std::size_t{1} << 20;  // the last parameters' gradients, ready first
  std::size_t bucket_bytes = std::size_t{25} << 20;
  // ZeRO-1: parameters gathered per all_gather after the step; its receive buffer is transient memory on top
  // of the parameters, so it is kept small.
  std::size_t gather_bytes = std::size_t{4} << 20;
  // Each bucket's sum first sleeps this long, as over a slow network (tests: memory must not depend on it).
  double sum_delay_seconds = 0.0;
};

// Where a data-parallel run's time went, summed over its steps.
struct DataParallelStats {
  std::int64_t steps = 0;
  std::int64_t buckets = 0;       // bucket sums run
  std::int64_t early_buckets = 0;  // of them, handed to the sums during the backward (from the hooks)
  std::size_t bytes = 0;          // gradient bytes summed
  double sum_seconds = 0.0;       // the sums themselves, on the communication thread
  double wait_seconds = 0.0;      // the trainer blocked waiting for sums (one bucket in flight; after the backward)
  double gather_seconds = 0.0;    // ZeRO-1/2: exchanging the stepped shards
  std::int64_t replans = 0;       // buckets planned again in the order the backward made the gradients
  std::string describe() const;  // one line for the run's report
};

class DataParallel : public train::GradientSync {
 public:
  explicit DataParallel(std::shared_ptr<Communicator> comm, DataParallelOptions options = {});
  ~DataParallel() override;  // stops the communication thread
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  std::int64_t rank() const override { return comm_->rank(); }
  std::int64_t world_size() const override { return comm_->size(); }
  void check_same_config(const nlohmann::json& config) override;
  std::vector<std::int64_t> gather_i64(const std::vector<std::int64_t>& mine) override;
  std::vector<double> gather_f64(const std::vector<double>& mine) override;
  void begin_gradients(const std::vector<Tensor>& params, const std::vector<std::int64_t>& shard_align) override;
  void expect_order(std::vector<std::size_t> order) override;
  void gradient_ready(std::size_t index) override;
  void finish_gradients() override;
  void set_landed(std::function<void(std::size_t param, double norm)> landed) override;
  void barrier() override { comm_->barrier(); }
  std::vector<std::int64_t> shard_bounds(std::int64_t numel, std::int64_t align) override;
  void gather_shards(const std::vector<Tensor>& params, const std::vector<std::int64_t>& aligns) override;
  Tensor take_shard_gradient(std::size_t index) override;
  void combine_disjoint(std::vector<double>& values) override;

  const DataParallelOptions& options() const { return options_; }
  DataParallelStats stats() const;
  Communicator& communicator() { return *comm_; }

 private:
  struct Bucket {
    DType dtype = DType::f32;
    bool sharded = false;             // ZeRO-2: reduce-scattered, each rank keeping its shards' sums
    std::vector<std::size_t> params;  // indices into params_, in the order of order_
    std::int64_t numel = 0;
    std::size_t bytes = 0;
    // ZeRO-2's layout: the packed bucket holds rank 0's shards of its parameters, then rank 1's, ... (a whole
    // bucket's parts are the reduce-scatter half of its all-reduce: shard_bounds(numel, size(), 1))
    std::vector<std::int64_t> part_bounds;   // where each rank's part begins (size() + 1 entries)
    std::vector<std::int64_t> shard_bounds;  // per parameter, flattened: that parameter's shard_bounds
    std::size_t unreported = 0;  // this step: parameters not yet reported ready
    Tensor filling;              // this step: gradients copied in as they are reported (the trainer's thread)
    Tensor flat;                 // this step: the packed gradients, then their sum (ZeRO-2: this rank's part)
    Tensor mine;                 // this step, from packing until released: this rank's part of the sum
    std::vector<double> norms;   // this step, ZeRO-2 with set_landed: each parameter's canonical norm
  };
  std::shared_ptr<Communicator> comm_;
  DataParallelOptions options_;
  std::vector<Tensor> params_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;  // by parameter index
  std::vector<std::size_t> slot_of_;    // by parameter index: its position in its bucket's params
  std::vector<bool> reported_;          // by parameter index, this step
  std::vector<std::size_t> ready_order_;  // this step: the parameters in the order they were reported
  std::vector<std::size_t> order_;        // the order buckets follow (empty: reverse index order)
  bool order_learned_ = false;            // the first step's backward has set order_
  bool replan_ = false;                   // order_ changed: plan the buckets again at the next step
  std::vector<std::int64_t> shard_align_;  // by parameter index: ZeRO-2's reduce-scatter alignment, 0: whole
  std::vector<Tensor> shard_grads_;     // by parameter index, ZeRO-2: this rank's summed shard

  // The communication thread sums buckets[next_sum_] once it is packed, in index order.
  std::thread worker_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<bool> packed_;  // by bucket, this step: its gradients are in its flat buffer
  std::size_t next_sum_ = 0;  // this step: the buckets before it are summed
  std::exception_ptr error_;
  bool stop_ = false;
  bool finishing_ = false;  // the trainer's thread is in finish_gradients
  DataParallelStats stats_;
  double worker_sent_bytes_ = 0.0;  // this step: what the worker's sums sent, as a simulated group counts it
  std::function<void(std::size_t, double)> landed_;  // set_landed's
  std::size_t released_ = 0;   // this step: the buckets before it are released (wait_and_release)
  std::size_t delivered_ = 0;  // this step: the buckets before it are handed over (their gradients set)

  // Buckets of one dtype and one kind of sum (whole or sharded), in the order of order_.
  void plan_buckets(const std::vector<Tensor>& params, const std::vector<std::int64_t>& shard_align);
  void copy_in(std::size_t param);  // the trainer's thread: into its bucket, freeing the gradient at once
  void pack(std::size_t bucket);    // the trainer's thread: hand a complete bucket to the worker
  // After the first step: the buckets follow the order the backward reported the gradients (rank 0's).
  void learn_order();
  // The trainer's thread: waits until buckets [0, until) are summed and frees what their sums no longer need
  // (a sharded bucket's whole buffer, a whole bucket's part), so live bytes follow the trainer alone.
  void wait_and_release(std::size_t until);
  void release(std::size_t until);  // the same, for buckets [0, until) known to be summed
  // The count of buckets packed in order from the first (the trainer's thread, which alone packs them).
  std::size_t packed_prefix() const;
  // The trainer's thread: sets the gradients of summed bucket `bucket` (calling landed_ for each).
  void deliver(std::size_t bucket);
  // With landed_: delivers every bucket whose successor is packed too (all: every bucket), waiting for its sum.
  void deliver_landed(bool all);
  // The worker, ZeRO-2 with landed_: each parameter's canonical norm from every rank's blocks of bucket b.
  void shard_norms(Bucket& b, const Tensor& mine);
  // One dtype, one all_gather.
  void gather_shard_group(const std::vector<Tensor>& params, const std::vector<std::int64_t>& aligns);
  void run_worker();
};

// "micro_batch: 8 here, 4 in the other" for the first field (in key order, nested keys joined by '.') whose
// value differs between two configs' JSON; empty when they are equal.
std::string first_difference(const nlohmann::json& here, const nlohmann::json& other);

// Makes `trainer` one rank of a data-parallel run over `comm` (trainer.config().world_size must equal
// comm->size()) and returns the DataParallel (for its stats); null, changing nothing, for a group of one
// with world_size 1.
std::shared_ptr<DataParallel> attach_data_parallel(train::Trainer& trainer, std::shared_ptr<Communicator> comm,
                                                   DataParallelOptions options = {});

// For train::RunInputs::prepare: makes the meta trainer of train::predict_memory rank `rank` of its config's
// world_size over a simulated_group, with these bucket options, so the prediction is that rank's memory.
std::function<void(train::Trainer&)> simulate_rank(int rank, DataParallelOptions options = {});

}  // namespace memtrain::dist

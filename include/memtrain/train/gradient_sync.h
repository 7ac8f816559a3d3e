// What a Trainer asks of the other processes of a data-parallel run. dist::DataParallel implements it over a
// dist::Communicator (the distributed layer sits above training, so the Trainer only sees this interface);
// without one a Trainer trains alone.
//
// Each rank runs the same Trainer on its own block of every step's micro-batches (data::LoaderOptions::
// batch_block): global micro-batch i of a step belongs to rank i / grad_accum. The Trainer sums its block's
// gradients in the canonical tree order and hands them over parameter by parameter as they become final;
// the sync completes the tree across ranks, and every rank then takes the same optimizer step. The calls
// come from the Trainer's thread.
#pragma once

#include "memtrain/core/tensor.h"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace memtrain::train {

// What a sync that compresses the gradients (dist::DgcSync) sent in its last finish_gradients.
struct SyncBytes {
  std::int64_t sent = 0;   // this rank's bytes on the wire (the compressed gradients)
  std::int64_t dense = 0;  // the bytes of the same gradients uncompressed
};

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  virtual std::int64_t rank() const = 0;
  virtual std::int64_t world_size() const = 0;
  // Refuses (on every rank) a configuration that is not the same on every rank, naming the first field that
  // differs and a rank that holds another value.
  virtual void check_same_config(const nlohmann::json& config) = 0;
  // Every rank's values, in rank order (each rank passes as many).
  virtual std::vector<std::int64_t> gather_i64(const std::vector<std::int64_t>& mine) = 0;
  virtual std::vector<double> gather_f64(const std::vector<double>& mine) = 0;
  // The gradients of one step, in three calls. begin_gradients names the parameters (the same list every
  // step). gradient_ready(k) says params[k].grad() holds this rank's final block sum (undefined: no gradient,
  // taken as zero); the Trainer calls it from the gradient-ready hooks of the step's last backward, so the
  // sums of complete buckets can run while the backward goes on. finish_gradients takes every parameter not
  // reported yet as ready, waits for all sums, and leaves each .grad holding the canonical sum over every
  // rank's block, the same bits on every rank. A parameter with shard_align[k] > 0 (ZeRO-2; `shard_align`
  // empty: none) has only the sum of this rank's shard (shard_bounds(numel, shard_align[k])) kept instead
  // (take_shard_gradient), and its .grad left undefined.
  virtual void begin_gradients(const std::vector<Tensor>& params, const std::vector<std::int64_t>& shard_align) = 0;
  // The order the backward is expected to report the parameters in (indices into begin_gradients' params: the
  // model's parameters in reverse registration order), so that the first step's buckets fill one after
  // another; after it, the order the hooks actually reported is used.
  virtual void expect_order(std::vector<std::size_t> order) = 0;
  virtual void gradient_ready(std::size_t index) = 0;
  virtual void finish_gradients() = 0;
  // Layer-wise updates: from then on, each parameter's summed gradient is handed to `landed(k, norm)` on the
  // trainer's thread as soon as it is known to have landed: bucket j's parameters during the backward, once the
  // buckets up to j + 1 are handed to the sums (waiting for bucket j's sum), the rest in finish_gradients.
  // params[k].grad() then holds the sum (at ZeRO-2: take_shard_gradient(k)); `norm` is the canonical norm
  // (train/grad_norm.h) of the whole summed gradient, at ZeRO-2 from every rank's blocks.
  virtual void set_landed(std::function<void(std::size_t param, double norm)> landed) = 0;
  // Waits until every rank arrives (e.g. rank 0 has written a checkpoint the others will read).
  virtual void barrier() = 0;

  // ZeRO-1: each rank steps only its shard of every parameter (and keeps optimizer state for it alone).
  // Where the ranks' shards of a tensor of `numel` elements begin: world_size() + 1 offsets, 0 .. numel, every
  // boundary a multiple of `align`, itself a multiple of the 8-bit block size (256), so a shard is whole blocks
  // of its tensor's state (and, for align a multiple of a matrix's row length, whole rows).
  virtual std::vector<std::int64_t> shard_bounds(std::int64_t numel, std::int64_t align) = 0;
  // After the shards' step: every rank's shard (shard_bounds(numel, aligns[k])) of each parameter (contiguous)
  // copied to every rank.
  virtual void gather_shards(const std::vector<Tensor>& params, const std::vector<std::int64_t>& aligns) = 0;
  // ZeRO-2, after finish_gradients: the summed gradient of this rank's shard of params[index], flat (undefined
  // when the shard is empty), handed over: the sync keeps no reference, so it is freed with the caller's.
  virtual Tensor take_shard_gradient(std::size_t index) = 0;
  // `values`: entries each nonzero on at most one rank; afterwards every rank holds all of them (exact, since
  // only zeros are added to each).
  virtual void combine_disjoint(std::vector<double>& values) = 0;
  // A compressing sync: what its last finish_gradients sent (StepMetrics::grad_bytes_sent); none otherwise.
  virtual std::optional<SyncBytes> last_step_bytes() const { return std::nullopt; }
};

}  // namespace memtrain::train

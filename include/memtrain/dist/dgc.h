// Deep Gradient Compression (Lin et al. 2018) over a dist::Communicator: a train::GradientSync that sends, per
// step and per tensor, only the (index, value) pairs of the largest accumulated gradients, and keeps the rest on
// the rank for later steps (TrainerConfig::grad_compression "dgc:RATIO").
//
// Each step, on every rank, for each parameter in index order (params[k].grad() = this rank's block sum g):
//   local clipping   g := g * min(1, (grad_clip / sqrt(N)) / |g_rank|)   (|g_rank|: the norm of all this rank's
//                    gradients; off when clip_norm is 0)
//   momentum corr.   u := m * u + g;  v := v + u
//   top-k            the k = max(1, ceil((1 - s) * numel)) largest |v| (ties: lower index), s the step's
//                    sparsity (dgc_sparsity: the warm-up, then ratio)
//   error feedback   the selected v are sent; u and v are cleared there (momentum factor masking)
// Then one exchange for all tensors: the pair counts (all_gather_i64), then every rank's indices (i32, into
// the parameters laid end to end) and values (f32) by Communicator::all_gather over those counts. Every rank
// adds the ranks' pairs into zeros in rank order, so every rank gets the same bits, and .grad becomes that sum
// (views into one flat buffer). Like DataParallel's sums, it is a plain sum over the ranks: each rank's block
// is already weighted by its share of the global batch's targets, so nothing is divided.
//
// Bytes: this rank sends 8 bytes per pair (plus the count); the dense figure is 4 bytes per gradient element
// (what the f32 gradients themselves weigh), so at ratio 0.999 a tensor sends ~500x fewer bytes.
// Memory: u and v (two f32 copies of every gradient, kept across steps) are counted as optimizer_state: like an
// optimizer's moments they live from the first step to the end of the run. The summed gradient is gradients.
// Not checkpointed: a resumed run starts with empty u and v and its warm-up again.
// Supports: ZeRO 0, CPU tensors (f32 parameters), no layer-wise updates; the rest of GradientSync (config
// check, value gathers, barrier, combine_disjoint) is a DataParallel's, composed inside.
#pragma once

#include "memtrain/dist/communicator.h"
#include "memtrain/dist/data_parallel.h"
#include "memtrain/train/gradient_sync.h"
#include "memtrain/train/trainer.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace memtrain::dist {

struct DgcOptions {
  double ratio = 0.999;           // final sparsity, in (0, 1): the share of each tensor NOT sent in a step
  double momentum = 0.0;          // the momentum correction's m, in [0, 1)
  std::int64_t warmup_steps = 0;  // sparsity warm-up (dgc_sparsity)
  double clip_norm = 0.0;         // local clipping threshold before the 1/sqrt(N) scaling (the trainer's grad_clip)
};

// From the trainer's config: grad_compression's ratio, momentum and warm-up, and grad_clip as clip_norm.
DgcOptions dgc_options(const train::TrainerConfig& config);

// The sparsity of step `step` (0-based): within the warm-up, quarter by quarter, 0.75, 0.9375, 0.984375, 0.996
// (each capped at ratio); then ratio.
double dgc_sparsity(const DgcOptions& options, std::int64_t step);
// Elements of a tensor of `numel` sent at `sparsity`: max(1, ceil((1 - sparsity) * numel)), at most numel.
std::int64_t dgc_keep_count(std::int64_t numel, double sparsity);

// One tensor's local step (the math above, in f32): g, u and v hold n elements (g null: a zero gradient);
// appends the k selected (offset + index, v) pairs to `index` / `value` in increasing index order and clears u
// and v there.
void dgc_accumulate_and_select(const float* g, float* u, float* v, std::int64_t n, double momentum, float scale,
                               std::int64_t k, std::int64_t offset, std::vector<std::int32_t>& index,
                               std::vector<float>& value);

// What a DgcSync sent over the run (this rank).
struct DgcStats {
  std::int64_t steps = 0;
  std::int64_t pairs = 0;          // (index, value) pairs sent
  std::int64_t sent_bytes = 0;     // their bytes
  std::int64_t dense_bytes = 0;    // the same gradients uncompressed
  double select_seconds = 0.0;     // accumulation and top-k
  double exchange_seconds = 0.0;   // the gathers and the sum
  std::string describe() const;  // one line for the run's report
};

class DgcSync : public train::GradientSync {
 public:
  DgcSync(std::shared_ptr<Communicator> comm, DgcOptions options);

  std::int64_t rank() const override { return dense_.rank(); }
  std::int64_t world_size() const override { return dense_.world_size(); }
  void check_same_config(const nlohmann::json& config) override { dense_.check_same_config(config); }
  std::vector<std::int64_t> gather_i64(const std::vector<std::int64_t>& mine) override {
    return dense_.gather_i64(mine);
  }
  std::vector<double> gather_f64(const std::vector<double>& mine) override { return dense_.gather_f64(mine); }
  void begin_gradients(const std::vector<Tensor>& params, const std::vector<std::int64_t>& shard_align) override;
  void expect_order(std::vector<std::size_t>) override {}  // no buckets: the exchange is one, at the end
  void gradient_ready(std::size_t index) override;
  void finish_gradients() override;
  void set_landed(std::function<void(std::size_t param, double norm)> landed) override;
  void barrier() override { dense_.barrier(); }
  std::vector<std::int64_t> shard_bounds(std::int64_t numel, std::int64_t align) override {
    return dense_.shard_bounds(numel, align);
  }
  void gather_shards(const std::vector<Tensor>& params, const std::vector<std::int64_t>& aligns) override {
    dense_.gather_shards(params, aligns);
  }
  Tensor take_shard_gradient(std::size_t index) override { return dense_.take_shard_gradient(index); }
  void combine_disjoint(std::vector<double>& values) override { dense_.combine_disjoint(values); }
  std::optional<train::SyncBytes> last_step_bytes() const override { return last_; }

  const DgcOptions& options() const { return options_; }
  const DgcStats& stats() const { return stats_; }
  // The residuals of params[k] (for tests): u (momentum) and v (accumulated, not yet sent); undefined before
  // the first step.
  const Tensor& momentum_of(std::size_t k) const { return u_.at(k); }
  const Tensor& residual_of(std::size_t k) const { return v_.at(k); }

 private:
  std::shared_ptr<Communicator> comm_;
  DgcOptions options_;
  DataParallel dense_;  // the uncompressed sync's collectives, for everything but the gradients
  std::vector<Tensor> params_;
  std::vector<std::int64_t> offset_;  // by parameter: where it starts with the parameters laid end to end
  std::vector<Tensor> u_, v_;         // by parameter: momentum and accumulated gradient (f32, flat)
  std::optional<train::SyncBytes> last_;
  DgcStats stats_;
};

// Makes `trainer` one rank of a compressed data-parallel run over `comm` (config.grad_compression must be on;
// world_size must equal comm->size(); a group of one is attached too, so a run alone compresses as well).
std::shared_ptr<DgcSync> attach_dgc(train::Trainer& trainer, std::shared_ptr<Communicator> comm);

}  // namespace memtrain::dist

// Adafactor (Shazeer & Stern 2018), the variant of Hugging Face transformers' `Adafactor` with
// scale_parameter=False, relative_step=False, warmup_init=False (so the step size is the group's lr):
//   beta2_t = 1 - t^decay_rate (decay_rate -0.8);  G = g*g + eps1 (eps1 1e-30)
//   parameters of rank >= 2 (last two dims m x n, leading dims batch): factored second moment
//     R = beta2_t*R + (1-beta2_t)*mean_j G  (m),  C = beta2_t*C + (1-beta2_t)*mean_i G  (n)
//     u = g / sqrt(R C^T / mean(R))          (= r c^T / sum(r) with sums instead of means)
//   rank 0/1: V = beta2_t*V + (1-beta2_t)*G,  u = g / sqrt(V)
//   update clipping: u /= max(1, RMS(u)/clip_threshold) (clip 1.0);  u *= lr
//   optional first moment (off by default): M = beta1*M + (1-beta1)*u, u = M  (beta1 = group.beta1)
//   decoupled weight decay: p -= wd*lr*p;  then p -= u.
// State bytes: (m + n)*4 per m x n matrix (times the batch), 4n per vector, plus 4 per element with the
// first moment. Contiguous f32 parameters on the CPU or a CUDA device (state on the parameter's device; the
// device rule is cuda::adafactor_*_step, equal to this one up to f32 rounding). On the CPU the column means
// and the update's RMS sum over the rows in the fixed tree of src/cpu/row_tree.h.
//
// ZeRO (shard_rows): a parameter is rows x cols (a matrix [..., m, n]: batch * m rows of n; a vector: rows of
// 1 element), and each rank steps a range of whole rows, held as a flat view (ParamGroup::whole_shape names
// the whole tensor). Its row and column statistics are whole on every rank (m + n floats, replicated); the
// vector statistic and the first moment cover the rank's rows. A step exchanges, over all parameters at once:
//   1. each rank's new row statistics and its column sums of whole subtrees of the row tree;
//   2. its subtree sums of the update's squares.
// So every rank computes the statistics and clip factor of the run alone, to the bit, from O(rows + cols *
// log rows) values per matrix, and a parameter is skipped on every rank when any rank's rows hold NaN or Inf.
#pragma once

#include "memtrain/optim/optimizer.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace memtrain::optim {

struct AdafactorOptions {
  double decay_rate = -0.8;
  double eps1 = 1e-30;
  double clip_threshold = 1.0;
  bool use_first_moment = false;  // when true, beta1 of each group is the first-moment coefficient
};

class Adafactor : public Optimizer {
 public:
  struct RowShards {
    int rank = 0;
    // The first row of every rank's range, and the row count last (world_size + 1 entries), for a whole
    // tensor of this shape.
    std::function<std::vector<std::int64_t>(const Shape& whole)> row_bounds;
    // Every rank's values, rank by rank (each rank passes any number); every rank calls it together.
    std::function<std::vector<std::vector<double>>(const std::vector<double>& mine)> gather;
  };

  explicit Adafactor(std::vector<ParamGroup> groups, AdafactorOptions options = {});
  std::string_view name() const override { return "Adafactor"; }
  const AdafactorOptions& options() const { return options_; }
  // Before the first step: the groups hold every rank's row views (see above), empty ones included, and the
  // step exchanges through `shards`. CPU (and meta) parameters only.
  void shard_rows(RowShards shards);
  // A bf16 parameter (no f32 master) is stepped a slice at a time: update_narrow.
  bool slices_narrow_params() const override { return true; }

 protected:
  StepReport step_all() override;
  void init_state(const Tensor& param, const ParamGroup& group, ParamState& state) override;
  void update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) override;
  void update_narrow(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state,
                     const NarrowStep& narrow) override;

 private:
  AdafactorOptions options_;
  RowShards shards_;  // empty unless sharded
  StepReport step_row_shards();  // src/optim/adafactor_shards.cpp
};

}  // namespace memtrain::optim

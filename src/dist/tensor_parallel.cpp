// Tensor parallelism over a Communicator: the group a split model sums over, and the trainer's link.
#include "memtrain/dist/tensor_parallel.h"

#include "dist/same_config.h"
#include "memtrain/core/error.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/train/tensor_parallel.h"
#include "memtrain/train/trainer.h"

#include <algorithm>
#include <vector>

namespace memtrain::dist {

namespace {

class CommunicatorGroup final : public nn::TensorParallelGroup {
 public:
  explicit CommunicatorGroup(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {}
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  void all_reduce_sum(Tensor& t) override {
    Tensor flat = t.view({t.numel()});
    comm_->all_reduce_canonical(flat);
  }
  void all_gather(const Tensor& mine, Tensor& all) override {
    const std::int64_t n = mine.numel();
    MT_CHECK(all.numel() == n * comm_->size(), "tensor-parallel all_gather",
             "{} elements for {} ranks of {} each", all.numel(), comm_->size(), n);
    std::vector<std::int64_t> bounds(static_cast<std::size_t>(comm_->size() + 1));
    for (std::size_t q = 0; q < bounds.size(); ++q) bounds[q] = n * static_cast<std::int64_t>(q);
    Tensor flat = all.view({all.numel()});
    comm_->all_gather(mine.view({n}), bounds, flat);
  }

 private:
  std::shared_ptr<Communicator> comm_;
};

class CommunicatorTensorLink final : public train::TensorParallelLink {
 public:
  explicit CommunicatorTensorLink(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {}
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  std::vector<double> gather_f64(const std::vector<double>& mine) override { return comm_->all_gather_f64(mine); }
  std::vector<std::int64_t> gather_i64(const std::vector<std::int64_t>& mine) override {
    return comm_->all_gather_i64(mine);
  }

 private:
  std::shared_ptr<Communicator> comm_;
};

}  // namespace

std::shared_ptr<nn::TensorParallelGroup> tensor_parallel_group(std::shared_ptr<Communicator> comm) {
  MT_CHECK(comm != nullptr, "dist::tensor_parallel_group", "the communicator is null");
  return std::make_shared<CommunicatorGroup>(std::move(comm));
}

void attach_gpt_tensor_parallel(train::Trainer& trainer, std::shared_ptr<const nn::GPT> model,
                                std::shared_ptr<Communicator> group) {
  const char* where = "dist::attach_gpt_tensor_parallel";
  MT_CHECK(model != nullptr && group != nullptr, where, "the model or the group is null");
  MT_CHECK(&trainer.model() == model.get(), where, "the trainer was not built over this model");
  const train::TrainerConfig& config = trainer.config();
  // First, while every rank still takes part: the checks below then fail on every rank alike or on none.
  detail::require_same_config(config.to_json(), *group, where);
  MT_CHECK(config.tensor_parallel == group->size(), where,
           "config.tensor_parallel is {} but the group has {} ranks (launch with mpirun -np {})",
           config.tensor_parallel, group->size(), config.tensor_parallel);
  // A rank whose model is another part is refused on every rank, so none goes on to wait for it.
  const nn::TensorShard& shard = model->tensor_shard();
  const bool mine_ok = shard.count == group->size() && shard.rank == group->rank();
  const std::vector<std::int64_t> ok = group->all_gather_i64({mine_ok ? 1 : 0});
  MT_CHECK(mine_ok, where,
           "the model holds tensor-parallel part {} of {}, but this is rank {} of {}: build it with "
           "nn::TensorShard{{rank, size, dist::tensor_parallel_group(comm)}}", shard.rank, shard.count, group->rank(),
           group->size());
  MT_CHECK(std::find(ok.begin(), ok.end(), 0) == ok.end(), where,
           "another rank's model is not its tensor-parallel part (see that rank's error)");
  std::vector<Tensor> split;
  for (const auto& [name, t] : model->named_parameters())
    if (model->split_by_tensor_parallel(name)) split.push_back(t);
  trainer.attach_tensor_parallel(std::make_shared<CommunicatorTensorLink>(std::move(group)), split);
}

}  // namespace memtrain::dist

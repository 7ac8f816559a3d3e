// Optimizer offload (TrainerConfig::offload_optimizer): the arena the optimizer's state lives in, and fit()'s
// start-up check of its directory.
#include "memtrain/core/file_arena.h"
#include "memtrain/train/trainer.h"

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace memtrain::train {

namespace {

// The meta run of a prediction (train/predict.h) with file offload: the state is counted here, not by the meta
// allocator, so the predicted peaks leave it out as the run's will. Distinct addresses, never mapped.
class MetaStateArena final : public StateArena {
 public:
  MetaStateArena() : StateArena(Device::meta()) {}
  std::string where() const override { return "files (predicted)"; }

 protected:
  void* take(std::size_t nbytes) override {
    const std::uintptr_t step = (std::max<std::size_t>(nbytes, 1) + 63) & ~std::uintptr_t{63};
    return reinterpret_cast<void*>(next_.fetch_add(step));
  }
  void give_back(void*, std::size_t) noexcept override {}

 private:
  std::atomic<std::uintptr_t> next_{std::uintptr_t{1} << 57};  // apart from the meta allocator's (1 << 56 up)
};

}  // namespace

void Trainer::set_up_offload() {
  const std::string dir = offload_directory(config_.offload_optimizer);
  if (dir.empty()) return;
  if (device_.is_meta()) {
    offload_ = std::make_shared<MetaStateArena>();
  } else {
    offload_ = std::make_shared<FileArena>(dir);  // refuses a missing or read-only directory now
  }
  optimizer_->set_state_arena(offload_);
}

void Trainer::check_offload_room() const {
  const auto* files = dynamic_cast<const FileArena*>(offload_.get());
  if (files == nullptr || optimizer_->state_bytes() > 0) return;
  const optim::Optimizer::StatePlan plan = optimizer_->planned_state();
  files->check_room(plan.bytes, plan.largest_tensor_bytes);
}

}  // namespace memtrain::train

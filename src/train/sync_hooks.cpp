#include "train/sync_hooks.h"

namespace memtrain::train::detail {

std::shared_ptr<SyncHooks> SyncHooks::install(const std::vector<Tensor>& params) {
  std::shared_ptr<SyncHooks> hooks(new SyncHooks());
  const std::weak_ptr<SyncHooks> weak = hooks;
  for (std::size_t k = 0; k < params.size(); ++k) {
    Tensor p = params[k];
    p.register_grad_ready_hook([weak, k](Tensor&) {
      if (auto h = weak.lock()) h->on_ready(k);
    });
  }
  return hooks;
}

void SyncHooks::on_ready(std::size_t index) {
  if (tree_ == nullptr) return;
  tree_->complete(index);
  sync_->gradient_ready(index);
}

}  // namespace memtrain::train::detail

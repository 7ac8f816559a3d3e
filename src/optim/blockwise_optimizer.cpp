// BlockwiseOptimizer: the state layout AdamW8bit and Lion8bit share (memtrain/optim/blockwise_optimizer.h).
#include "memtrain/optim/blockwise_optimizer.h"

#include "core/backend.h"
#include "memtrain/core/allocator.h"

namespace memtrain::optim {

BlockwiseOptimizer::BlockwiseOptimizer(std::vector<ParamGroup> groups, std::int64_t block_size,
                                       std::int64_t min_8bit_size, const char* who, std::vector<Moment> moments)
    : Optimizer(std::move(groups)),
      block_size_(block_size),
      min_8bit_size_(min_8bit_size),
      who_(who),
      moments_(std::move(moments)) {
  MT_CHECK(block_size > 0, who, "block_size must be positive, got {}", block_size);
  MT_CHECK(min_8bit_size >= 0, who, "min_8bit_size must be >= 0, got {}", min_8bit_size);
}

void BlockwiseOptimizer::init_state(const Tensor& param, const ParamGroup& group, ParamState& state) {
  check_f32_contiguous(param, who_);
  const Device device = param.device();
  const std::int64_t n = param.numel();
  // 8-bit or not is the whole tensor's choice: a shard of a large tensor is 8-bit however small it is.
  const bool eight_bit = whole_numel(param, group) >= min_8bit_size_;
  MT_CHECK(!eight_bit || ::memtrain::detail::backend_for(device).blockwise_block_size_ok(block_size_), who_,
           "block_size {} is not supported on {} (a power of two in [32, 4096])", block_size_, device.str());
  CategoryGuard guard(MemoryCategory::optimizer_state);
  for (const Moment& m : moments_) {
    const std::string name = m.name;
    if (!eight_bit) {
      state.tensors[name] = zeros(param.shape(), DType::f32, device);
      continue;
    }
    // Made on the CPU (the fresh codes come from the map's encoder) and moved: meta keeps the bytes, reads zeros.
    QuantizedState q(n, m.map, block_size_);
    state.tensors[name + ".codes"] = q.codes().to(device);
    state.tensors[name + ".absmax"] = q.absmax().to(device);
  }
}

std::pair<Tensor, Tensor> BlockwiseOptimizer::moment(const ParamState& state, const std::string& name,
                                                     QuantMap map) const {
  const auto codes = state.tensors.find(name + ".codes");
  if (codes == state.tensors.end()) return {state.tensors.at(name), Tensor()};
  const QuantizedState q(codes->second, state.tensors.at(name + ".absmax"), map, block_size_);  // checks the layout
  return {q.codes(), q.absmax()};
}

}  // namespace memtrain::optim

// The common part of the optimizers whose moments are block-wise 8-bit state (quantized_state.h):
// AdamW8bit and Lion8bit. A parameter of n >= min_8bit_size elements (a ZeRO shard: its whole tensor's, see
// ParamGroup::whole_shape) keeps each moment "<name>" as
// "<name>.codes" (u8 [n]) and "<name>.absmax" (f32 [ceil(n / block_size)]); a smaller one keeps "<name>" in
// f32 (the scales would cost more than they save). The base makes that state; a subclass names its moments
// and implements the step, which is the backend's (core/backend.h).
#pragma once

#include "memtrain/optim/optimizer.h"
#include "memtrain/optim/quantized_state.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace memtrain::optim {

class BlockwiseOptimizer : public Optimizer {
 public:
  std::int64_t block_size() const { return block_size_; }
  std::int64_t min_8bit_size() const { return min_8bit_size_; }
  // Each block of block_size elements is quantised on its own (absmax per block), so slices on block
  // boundaries step independently.
  std::int64_t elementwise_block() const override { return block_size_; }

 protected:
  // A moment of the state and the map its 8-bit codes use.
  struct Moment {
    const char* name;
    QuantMap map;
  };
  // `who` names the optimizer in errors. block_size > 0, min_8bit_size >= 0.
  BlockwiseOptimizer(std::vector<ParamGroup> groups, std::int64_t block_size, std::int64_t min_8bit_size,
                     const char* who, std::vector<Moment> moments);
  // Checks param (contiguous f32 on a device whose backend takes this block size), then allocates each
  // moment (zeros, as QuantizedState makes them) on param's device.
  void init_state(const Tensor& param, const ParamGroup& group, ParamState& state) final;
  // The backend's view of moment `name`: (codes, absmax) of 8-bit state, checked against its block layout,
  // or (f32 values, undefined).
  std::pair<Tensor, Tensor> moment(const ParamState& state, const std::string& name, QuantMap map) const;

 private:
  std::int64_t block_size_;
  std::int64_t min_8bit_size_;
  const char* who_;
  std::vector<Moment> moments_;
};

}  // namespace memtrain::optim

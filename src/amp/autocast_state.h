// Internal side of amp::Autocast: what the ops, the backward engine and activation checkpointing call.
#pragma once

#include "memtrain/amp/autocast.h"

#include <optional>
#include <vector>

namespace memtrain::amp::detail {

// Floating tensors cast to the compute dtype (parameters through the guard's cache); others unchanged.
// nullopt when autocast is off or nothing needed a cast, so an op can write
//   if (auto c = autocast_to_compute({x, w, b})) return linear((*c)[0], (*c)[1], (*c)[2]);
std::optional<std::vector<Tensor>> autocast_to_compute(const std::vector<Tensor>& inputs);
// Floating tensors of another dtype cast to f32; nullopt when autocast is off or nothing changed.
std::optional<std::vector<Tensor>> autocast_to_f32(const std::vector<Tensor>& inputs);
// Under the fp8 policy: amp::fp8_linear of x (cast to bf16) with the guard's FP8 copy of weight (quantized once
// per guard); nullopt otherwise.
std::optional<Tensor> autocast_linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

}  // namespace memtrain::amp::detail

// Gradient clipping by global L2 norm. The sum of squares is each device's backend's sum_of_squares (in double:
// over ~1e8 fp32 terms a float accumulator would lose the small gradients entirely); CUDA gradients stay on
// their device. The clip itself is ops::mul_ on the device.
//
// On meta the norm is 0 (a meta tensor reads as zeros), so clip_grad_norm never clips there: a dry run
// accounts the bytes of the norm's reduction but not those of the scaling, which is in place anyway.
#include "train/grad_norm.h"

#include "core/backend.h"
#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/allocator.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

namespace memtrain::train {

namespace detail {

double sum_of_squares(const std::vector<Tensor>& tensors) {
  autograd::NoGradGuard no_grad;
  // Converted copies are workspace.
  CategoryGuard category(MemoryCategory::workspace);
  // By device, in order (the CPU first, then each CUDA device by index), each list in the callers' order.
  std::map<std::pair<int, int>, std::vector<Tensor>> by_device;
  for (const Tensor& t : tensors) {
    if (!t.defined()) continue;
    by_device[{static_cast<int>(t.device().type), t.device().index}].push_back(t);
  }
  double total = 0.0;
  for (const auto& [key, list] : by_device)
    total += ::memtrain::detail::backend_for(list.front().device()).sum_of_squares(list);
  return total;
}

void block_squares(const Tensor& g, double* out) {
  ::memtrain::detail::backend_for(g.device()).block_sums_of_squares(g, out);
}

double canonical_norm(const Tensor& grad) {
  if (!grad.defined()) return 0.0;
  autograd::NoGradGuard no_grad;
  CategoryGuard category(MemoryCategory::workspace);
  const std::int64_t n = grad.numel();
  std::vector<double> blocks(static_cast<std::size_t>((n + 255) / 256), 0.0);
  if (grad.dtype() == DType::f32 && grad.is_contiguous()) {
    block_squares(grad, blocks.data());
  } else {
    // Another dtype (a bf16 parameter's gradient) is widened a slice of 2^20 elements (4 MiB) at a time, on
    // 256-element blocks, so no f32 copy of the whole gradient is made; the blocks are the same.
    constexpr std::int64_t kSlice = std::int64_t{1} << 20;
    const Tensor flat = grad.contiguous().view({n});
    for (std::int64_t a = 0; a < n; a += kSlice)
      block_squares(flat.narrow(0, a, std::min(kSlice, n - a)).to(DType::f32), blocks.data() + a / 256);
  }
  double total = 0.0;
  for (const double b : blocks) total += b;
  return std::sqrt(total);
}

double canonical_grad_norm(const std::vector<std::int64_t>& numels, const std::vector<GradPiece>& pieces,
                           const std::function<void(std::vector<double>&)>& combine_disjoint) {
  constexpr std::int64_t kBlock = 256;
  std::vector<std::size_t> first_block(numels.size() + 1, 0);
  for (std::size_t i = 0; i < numels.size(); ++i)
    first_block[i + 1] = first_block[i] + static_cast<std::size_t>((numels[i] + kBlock - 1) / kBlock);
  std::vector<double> blocks(first_block.back(), 0.0);
  for (const GradPiece& piece : pieces) {
    if (!piece.grad.defined()) continue;
    MT_CHECK(piece.grad.dtype() == DType::f32 && piece.grad.is_contiguous() && piece.begin % kBlock == 0,
             "canonical_grad_norm", "parameter {}: a piece must be a contiguous f32 gradient starting on a "
             "{}-element block (got {} from element {})", piece.param, kBlock, dtype_name(piece.grad.dtype()),
             piece.begin);
    block_squares(piece.grad, blocks.data() + first_block[piece.param] + static_cast<std::size_t>(piece.begin / kBlock));
  }
  if (combine_disjoint) combine_disjoint(blocks);
  double total = 0.0;
  for (const double b : blocks) total += b;
  return std::sqrt(total);
}

}  // namespace detail

double global_grad_norm(const std::vector<Tensor>& params) {
  std::vector<Tensor> grads;
  grads.reserve(params.size());
  for (const Tensor& p : params) grads.push_back(p.grad());
  return std::sqrt(detail::sum_of_squares(grads));
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  const double norm = global_grad_norm(params);
  if (max_norm > 0.0 && std::isfinite(norm) && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    autograd::NoGradGuard no_grad;
    CategoryGuard category(MemoryCategory::workspace);
    for (const Tensor& p : params) {
      Tensor g = p.grad();
      if (g.defined()) ops::mul_(g, scale);
    }
  }
  return norm;
}

}  // namespace memtrain::train

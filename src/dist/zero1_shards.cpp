// ZeRO-1's side of DataParallel: where each rank's shard of a tensor lies, and the exchange of the stepped
// shards after the optimizer step.
#include "memtrain/dist/data_parallel.h"

#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"

#include <chrono>
#include <mutex>

namespace memtrain::dist {

std::vector<std::int64_t> DataParallel::shard_bounds(std::int64_t numel, std::int64_t align) {
  MT_CHECK(align > 0 && align % 256 == 0, "DataParallel::shard_bounds",
           "align {} is not a positive multiple of the 8-bit block (256)", align);
  return dist::shard_bounds(numel, comm_->size(), align);
}

void DataParallel::gather_shards(const std::vector<Tensor>& params, const std::vector<std::int64_t>& aligns) {
  MT_CHECK(aligns.size() == params.size(), "DataParallel::gather_shards", "{} alignments for {} parameters",
           aligns.size(), params.size());
  // One all_gather per group of parameters (of one dtype, up to gather_bytes): rank q's part is its shards
  // of those parameters, one after another, so a step makes a few large messages instead of one per tensor.
  const auto t0 = std::chrono::steady_clock::now();
  std::size_t first = 0;
  while (first < params.size()) {
    std::size_t last = first + 1;
    std::size_t bytes = static_cast<std::size_t>(params[first].numel()) * dtype_size(params[first].dtype());
    while (last < params.size() && params[last].dtype() == params[first].dtype()) {
      const std::size_t more = static_cast<std::size_t>(params[last].numel()) * dtype_size(params[last].dtype());
      if (bytes + more > options_.gather_bytes) break;
      bytes += more;
      ++last;
    }
    const auto from = static_cast<std::ptrdiff_t>(first), to = static_cast<std::ptrdiff_t>(last);
    gather_shard_group({params.begin() + from, params.begin() + to}, {aligns.begin() + from, aligns.begin() + to});
    first = last;
  }
  std::lock_guard lock(mutex_);
  stats_.gather_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void DataParallel::gather_shard_group(const std::vector<Tensor>& params, const std::vector<std::int64_t>& aligns) {
  autograd::NoGradGuard no_grad;
  CategoryGuard category(MemoryCategory::workspace);
  const auto ranks = static_cast<std::size_t>(comm_->size());
  std::vector<std::vector<std::int64_t>> shards;  // per parameter: its shard_bounds
  std::vector<std::int64_t> bounds(ranks + 1, 0);  // of the packed parts
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    MT_CHECK(p.is_contiguous(), "DataParallel::gather_shards", "parameter of shape {} is not contiguous",
             shape_str(p.shape()));
    shards.push_back(shard_bounds(p.numel(), aligns[i]));
    for (std::size_t q = 0; q < ranks; ++q) bounds[q + 1] += shards.back()[q + 1] - shards.back()[q];
  }
  for (std::size_t q = 0; q < ranks; ++q) bounds[q + 1] += bounds[q];
  // Part q of `packed` holds rank q's shards, parameter after parameter; `copy` moves one rank's shards
  // between the parameters and its part.
  const auto copy = [&](Tensor& packed, std::size_t q, bool into_params) {
    std::int64_t at = into_params ? bounds[q] : 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const std::int64_t begin = shards[i][q], n = shards[i][q + 1] - begin;
      Tensor flat = params[i].detach().view({params[i].numel()});
      Tensor part = packed.narrow(0, at, n);
      if (into_params) {
        flat.narrow(0, begin, n).copy_(part);
      } else {
        part.copy_(flat.narrow(0, begin, n));
      }
      at += n;
    }
  };
  const auto me = static_cast<std::size_t>(rank());
  Tensor mine = Tensor::empty({bounds[me + 1] - bounds[me]}, params.front().dtype(), comm_->device());
  copy(mine, me, false);
  Tensor all = Tensor::empty({bounds[ranks]}, params.front().dtype(), comm_->device());
  comm_->all_gather(mine, bounds, all);
  for (std::size_t q = 0; q < ranks; ++q)
    if (q != me) copy(all, q, true);
}

}  // namespace memtrain::dist

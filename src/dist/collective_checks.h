// Argument checks shared by every Communicator backend, so a group of one refuses exactly what MPI refuses.
// Each names the operation and what is wrong (MT_CHECK).
#pragma once

#include "memtrain/dist/communicator.h"

#include <cstdint>
#include <string_view>
#include <vector>

namespace memtrain::dist::detail {

// A defined, contiguous CPU tensor; `what` names the argument ("contribution", "mine", ...).
void check_host_tensor(std::string_view op, const Tensor& t, std::string_view what);
// A dtype the sums support: f64, f32, bf16, f16.
void check_summable(std::string_view op, DType dtype);
void check_root(std::string_view op, int root, int size);
// A point-to-point peer: another rank of the group; a tag at or above Communicator::kFirstUserTag.
void check_peer(std::string_view op, const Communicator& comm, int peer, int tag);
// The arguments of reduce_scatter_canonical (full = contribution) and all_gather (full = the gathered tensor):
// bounds of size + 1 non-decreasing entries from 0 to full's numel, `mine` with this rank's part's numel,
// both of one dtype.
void check_sharded(std::string_view op, const Communicator& comm, const Tensor& full,
                   const std::vector<std::int64_t>& bounds, const Tensor& mine);
// The same without the CPU check, for a backend on device tensors (which checks their device itself).
void check_shard_layout(std::string_view op, const Communicator& comm, const Tensor& full,
                        const std::vector<std::int64_t>& bounds, const Tensor& mine);

}  // namespace memtrain::dist::detail

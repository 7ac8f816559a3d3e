#include "dist/collective_checks.h"

namespace memtrain::dist::detail {

void check_host_tensor(std::string_view op, const Tensor& t, std::string_view what) {
  MT_CHECK(t.defined(), op, "{} is undefined", what);
  MT_CHECK(t.device().is_cpu(), op, "{} is on {}; collectives take CPU tensors", what, t.device().str());
  MT_CHECK(t.is_contiguous(), op, "{} (shape {}) is not contiguous", what, shape_str(t.shape()));
}

void check_summable(std::string_view op, DType dtype) {
  MT_CHECK(dtype == DType::f64 || dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16, op,
           "cannot sum {} (f64, f32, bf16 or f16)", dtype_name(dtype));
}

void check_root(std::string_view op, int root, int size) {
  MT_CHECK(root >= 0 && root < size, op, "root {} is not a rank of this group of {}", root, size);
}

void check_peer(std::string_view op, const Communicator& comm, int peer, int tag) {
  MT_CHECK(peer >= 0 && peer < comm.size() && peer != comm.rank(), op,
           "peer {} is not another rank of this group of {} (this is rank {})", peer, comm.size(), comm.rank());
  MT_CHECK(tag >= Communicator::kFirstUserTag, op, "tag {} is below {}, the collectives' own tags", tag,
           Communicator::kFirstUserTag);
}

void check_sharded(std::string_view op, const Communicator& comm, const Tensor& full,
                   const std::vector<std::int64_t>& bounds, const Tensor& mine) {
  check_host_tensor(op, full, "the full tensor");
  check_host_tensor(op, mine, "mine");
  check_shard_layout(op, comm, full, bounds, mine);
}

void check_shard_layout(std::string_view op, const Communicator& comm, const Tensor& full,
                        const std::vector<std::int64_t>& bounds, const Tensor& mine) {
  MT_CHECK(mine.dtype() == full.dtype(), op, "mine is {} but the full tensor is {}", dtype_name(mine.dtype()),
           dtype_name(full.dtype()));
  const auto size = static_cast<std::size_t>(comm.size());
  MT_CHECK(bounds.size() == size + 1, op, "bounds has {} entries; a group of {} needs {}", bounds.size(), size,
           size + 1);
  MT_CHECK(bounds.front() == 0 && bounds.back() == full.numel(), op,
           "bounds run from {} to {}; they must run from 0 to the full tensor's numel {}", bounds.front(),
           bounds.back(), full.numel());
  for (std::size_t q = 0; q < size; ++q) {
    MT_CHECK(bounds[q] <= bounds[q + 1], op, "bounds decrease at rank {} ({} > {})", q, bounds[q], bounds[q + 1]);
  }
  const auto me = static_cast<std::size_t>(comm.rank());
  const std::int64_t part = bounds[me + 1] - bounds[me];
  MT_CHECK(mine.numel() == part, op, "mine has {} elements; rank {}'s part has {}", mine.numel(), me, part);
}

}  // namespace memtrain::dist::detail

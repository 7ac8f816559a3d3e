#include "memtrain/dist/data_parallel.h"

#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <utility>

namespace memtrain::dist {

namespace {

std::string diff_at(const std::string& path, const nlohmann::json& here, const nlohmann::json& other) {
  if (here.is_object() && other.is_object()) {
    // Keys in order over both, so every rank names the same first field.
    std::map<std::string, int> keys;
    for (const auto& [k, v] : here.items()) keys[k];
    for (const auto& [k, v] : other.items()) keys[k];
    for (const auto& [k, unused] : keys) {
      const std::string sub = path.empty() ? k : path + "." + k;
      if (!here.contains(k)) return fmt::format("{}: absent here, {} in the other", sub, other.at(k).dump());
      if (!other.contains(k)) return fmt::format("{}: {} here, absent in the other", sub, here.at(k).dump());
      std::string d = diff_at(sub, here.at(k), other.at(k));
      if (!d.empty()) return d;
    }
    return {};
  }
  if (here == other) return {};
  return fmt::format("{}: {} here, {} in the other", path.empty() ? "(the config)" : path, here.dump(), other.dump());
}

// A bucket: consecutive parameters (in reverse order) whose gradients are summed as one flat tensor.
struct Bucket {
  DType dtype;
  std::vector<std::size_t> params;  // indices into the params vector
  std::int64_t numel = 0;
  std::size_t bytes = 0;
};

std::vector<Bucket> make_buckets(const std::vector<Tensor>& params, const DataParallelOptions& o) {
  std::vector<Bucket> buckets;
  for (std::size_t k = params.size(); k-- > 0;) {
    const Tensor& p = params[k];
    if (!p.requires_grad()) continue;
    const std::size_t bytes = static_cast<std::size_t>(p.numel()) * dtype_size(p.dtype());
    const bool start = buckets.empty() || buckets.back().dtype != p.dtype() ||
                       buckets.back().bytes + bytes > (buckets.size() == 1 ? o.first_bucket_bytes : o.bucket_bytes);
    if (start) buckets.push_back({p.dtype(), {}, 0, 0});
    buckets.back().params.push_back(k);
    buckets.back().numel += p.numel();
    buckets.back().bytes += bytes;
  }
  return buckets;
}

}  // namespace

std::string first_difference(const nlohmann::json& here, const nlohmann::json& other) {
  return diff_at("", here, other);
}

DataParallel::DataParallel(std::shared_ptr<Communicator> comm, DataParallelOptions options)
    : comm_(std::move(comm)), options_(options) {
  MT_CHECK(comm_ != nullptr, "DataParallel", "the communicator is null");
  MT_CHECK(options_.first_bucket_bytes > 0 && options_.bucket_bytes > 0, "DataParallel",
           "bucket sizes must be > 0 (first {} B, then {} B)", options_.first_bucket_bytes, options_.bucket_bytes);
}

void DataParallel::check_same_config(const nlohmann::json& config) {
  const std::string mine = config.dump();
  const nlohmann::json root = nlohmann::json::parse(comm_->broadcast_string(mine, 0));
  const std::string diff = first_difference(config, root);
  const std::vector<std::int64_t> differs = comm_->all_gather_i64({diff.empty() ? 0 : 1});
  const auto first = std::find(differs.begin(), differs.end(), 1);
  if (first == differs.end()) return;
  const int rank = static_cast<int>(first - differs.begin());
  // Every rank raises the same message: the differing rank's own account of the field.
  const std::string what = comm_->broadcast_string(diff, rank);
  MT_CHECK(false, "DataParallel", "the training config differs between ranks: rank {} vs rank 0, {} (\"here\" is "
           "rank {}, \"the other\" rank 0); every rank must run the same config", rank, what, rank);
}

std::vector<std::int64_t> DataParallel::gather_i64(const std::vector<std::int64_t>& mine) {
  return comm_->all_gather_i64(mine);
}

std::vector<double> DataParallel::gather_f64(const std::vector<double>& mine) { return comm_->all_gather_f64(mine); }

void DataParallel::reduce_gradients(const std::vector<Tensor>& params) {
  autograd::NoGradGuard no_grad;
  CategoryGuard category(MemoryCategory::gradients);
  for (const Bucket& b : make_buckets(params, options_)) {
    Tensor flat = Tensor::empty({b.numel}, b.dtype, Device::cpu());
    std::int64_t offset = 0;
    for (const std::size_t k : b.params) {
      const Tensor& p = params[k];
      Tensor slot = flat.narrow(0, offset, p.numel());
      const Tensor g = p.grad();
      if (g.defined()) {
        MT_CHECK(g.device().is_cpu(), "DataParallel::reduce_gradients",
                 "gradient of a {} parameter is on {}: the MPI communicator sums CPU tensors", shape_str(p.shape()),
                 g.device().str());
        slot.copy_(g.contiguous().view({p.numel()}));
      } else {
        slot.zero_();  // no gradient on this rank: zero, since another rank's block may have one
      }
      offset += p.numel();
    }
    comm_->all_reduce_canonical(flat);
    offset = 0;
    for (const std::size_t k : b.params) {
      Tensor p = params[k];
      // Views into the bucket: its one buffer is the gradients now (freed when the last of them is).
      p.set_grad(flat.narrow(0, offset, p.numel()).view(p.shape()));
      offset += p.numel();
    }
  }
}

void attach_data_parallel(train::Trainer& trainer, std::shared_ptr<Communicator> comm, DataParallelOptions options) {
  MT_CHECK(comm != nullptr, "attach_data_parallel", "the communicator is null");
  if (comm->size() == 1 && trainer.config().world_size == 1) return;
  trainer.set_gradient_sync(std::make_shared<DataParallel>(std::move(comm), options));
}

}  // namespace memtrain::dist

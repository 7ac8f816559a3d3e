// DataParallel: the gradient buckets, their sums on the communication thread, and the start-up checks.
#include "memtrain/dist/data_parallel.h"

#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "core/work_counter.h"
#include "train/grad_norm.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

namespace memtrain::dist {

DataParallel::DataParallel(std::shared_ptr<Communicator> comm, DataParallelOptions options)
    : comm_(std::move(comm)), options_(options) {
  MT_CHECK(comm_ != nullptr, "DataParallel", "the communicator is null");
  MT_CHECK(options_.first_bucket_bytes > 0 && options_.bucket_bytes > 0 && options_.gather_bytes > 0, "DataParallel",
           "bucket sizes must be > 0 (first {} B, then {} B, gathers {} B)", options_.first_bucket_bytes,
           options_.bucket_bytes, options_.gather_bytes);
}

void DataParallel::check_same_config(const nlohmann::json& config_in) {
  // Ranks on GPUs each train on their own (cuda:<local rank>): only the kind of device must agree.
  nlohmann::json config = config_in;
  if (config.contains("device") && config["device"].is_string() &&
      config["device"].get<std::string>().starts_with("cuda:"))
    config["device"] = "cuda";
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

DataParallel::~DataParallel() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void DataParallel::plan_buckets(const std::vector<Tensor>& params, const std::vector<std::int64_t>& shard_align) {
  params_ = params;
  shard_align_ = shard_align;
  buckets_.clear();
  bucket_of_.assign(params.size(), 0);
  slot_of_.assign(params.size(), 0);
  std::vector<std::size_t> order = order_;
  if (order.size() != params.size()) {  // until the first step has shown the backward's order: reversed
    order.resize(params.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
  }
  for (const std::size_t k : order) {
    const Tensor& p = params[k];
    MT_CHECK(p.device() == comm_->device(), "DataParallel", "parameter {} ({}) is on {}, but the {} communicator "
             "sums tensors on {} (a CUDA model needs dist::make_nccl_communicator, on the rank's own GPU)", k,
             shape_str(p.shape()), p.device().str(), comm_->backend(), comm_->device().str());
    const std::size_t bytes = static_cast<std::size_t>(p.numel()) * dtype_size(p.dtype());
    // The open bucket's limit: the first one is small, so its sum starts early in the backward.
    const std::size_t limit = buckets_.size() == 1 ? options_.first_bucket_bytes : options_.bucket_bytes;
    const bool start = buckets_.empty() || buckets_.back().dtype != p.dtype() ||
                       buckets_.back().sharded != (shard_align_[k] > 0) || buckets_.back().bytes + bytes > limit;
    if (start) {
      buckets_.emplace_back();
      buckets_.back().dtype = p.dtype();
      buckets_.back().sharded = shard_align_[k] > 0;
    }
    Bucket& b = buckets_.back();
    slot_of_[k] = b.params.size();
    b.params.push_back(k);
    b.numel += p.numel();
    b.bytes += bytes;
    bucket_of_[k] = buckets_.size() - 1;
  }
  const auto ranks = static_cast<std::size_t>(comm_->size());
  for (Bucket& b : buckets_) {
    if (!b.sharded) {  // summed as all_reduce_canonical sums: reduce-scattered in parts, then all-gathered
      b.part_bounds = dist::shard_bounds(b.numel, comm_->size(), 1);
      continue;
    }
    b.part_bounds.assign(ranks + 1, 0);
    for (const std::size_t k : b.params) {
      const std::vector<std::int64_t> bounds = shard_bounds(params_[k].numel(), shard_align_[k]);
      b.shard_bounds.insert(b.shard_bounds.end(), bounds.begin(), bounds.end());
      for (std::size_t q = 0; q < ranks; ++q) b.part_bounds[q + 1] += bounds[q + 1] - bounds[q];
    }
    for (std::size_t q = 0; q < ranks; ++q) b.part_bounds[q + 1] += b.part_bounds[q];
  }
}

void DataParallel::begin_gradients(const std::vector<Tensor>& params, const std::vector<std::int64_t>& align_in) {
  MT_CHECK(align_in.empty() || align_in.size() == params.size(), "DataParallel::begin_gradients",
           "{} shard alignments for {} parameters", align_in.size(), params.size());
  {
    std::lock_guard lock(mutex_);
    MT_CHECK(next_sum_ == 0 || next_sum_ == buckets_.size(), "DataParallel::begin_gradients",
             "the previous step's sums did not finish ({} of {} buckets)", next_sum_, buckets_.size());
  }
  // The worker is idle now: the buckets may be planned again.
  const std::vector<std::int64_t> sharded = align_in.empty() ? std::vector<std::int64_t>(params.size(), 0) : align_in;
  bool same = params.size() == params_.size() && sharded == shard_align_;
  for (std::size_t k = 0; same && k < params.size(); ++k) same = params[k].impl_ptr() == params_[k].impl_ptr();
  if (!same && !params_.empty()) {
    order_.clear();  // other parameters than last step's: their order is learned again
    order_learned_ = false;
  }
  std::lock_guard lock(mutex_);
  if (!same || replan_) plan_buckets(params, sharded);
  replan_ = false;
  ready_order_.clear();
  for (Bucket& b : buckets_) {
    b.unreported = b.params.size();
    b.filling = Tensor();
    b.flat = Tensor();
    b.mine = Tensor();
  }
  reported_.assign(params_.size(), false);
  shard_grads_.assign(params_.size(), Tensor());
  packed_.assign(buckets_.size(), false);
  next_sum_ = 0;
  released_ = 0;
  delivered_ = 0;
  error_ = nullptr;
  if (!worker_.joinable()) worker_ = std::thread([this] { run_worker(); });
}

void DataParallel::gradient_ready(std::size_t index) {
  MT_CHECK(index < params_.size(), "DataParallel::gradient_ready", "parameter {} of {}", index, params_.size());
  if (reported_[index]) return;
  reported_[index] = true;
  ready_order_.push_back(index);
  copy_in(index);
  const std::size_t b = bucket_of_[index];
  if (--buckets_[b].unreported == 0) pack(b);
}

void DataParallel::copy_in(std::size_t param) {
  Bucket& b = buckets_[bucket_of_[param]];
  autograd::NoGradGuard no_grad;
  CategoryGuard category(MemoryCategory::gradients);
  if (!b.filling.defined()) b.filling = Tensor::empty({b.numel}, b.dtype, comm_->device());
  // Plain: each parameter's gradient whole, one after another. ZeRO-2: part by part (rank q's shards of every
  // parameter, then rank q + 1's), the layout reduce_scatter_canonical hands out.
  const std::size_t i = slot_of_[param];
  const std::size_t ranks = static_cast<std::size_t>(comm_->size());
  const std::size_t parts = b.sharded ? ranks : 1;
  Tensor p = params_[param];
  const Tensor g = p.grad();
  for (std::size_t q = 0; q < parts; ++q) {
    std::int64_t offset = b.sharded ? b.part_bounds[q] : 0;
    for (std::size_t j = 0; j < i; ++j)
      offset += b.sharded ? b.shard_bounds[j * (ranks + 1) + q + 1] - b.shard_bounds[j * (ranks + 1) + q]
                          : params_[b.params[j]].numel();
    const std::int64_t begin = b.sharded ? b.shard_bounds[i * (ranks + 1) + q] : 0;
    const std::int64_t n = b.sharded ? b.shard_bounds[i * (ranks + 1) + q + 1] - begin : p.numel();
    Tensor slot = b.filling.narrow(0, offset, n);
    if (g.defined()) {
      slot.copy_(g.contiguous().view({p.numel()}).narrow(0, begin, n));
    } else {
      slot.zero_();  // no gradient on this rank: zero, since another rank's block may have one
    }
  }
  p.set_grad(Tensor());  // the bucket holds it now
}

void DataParallel::pack(std::size_t bucket) {
  Bucket& b = buckets_[bucket];
  // One bucket in flight: every bucket the worker can take (those before the first one not yet packed: sums go
  // in order) must have been summed, and is released here, before this one is handed over. Waiting for an
  // earlier bucket that is still filling would wait forever: this thread fills it.
  wait_and_release(packed_prefix());
  // This rank's part of the sum: a buffer of its own for a sharded bucket (the whole one is freed once the sum
  // has landed), else the bucket's own part, summed in place (the canonical sums allow it).
  Tensor mine;
  {
    autograd::NoGradGuard no_grad;
    CategoryGuard category(MemoryCategory::gradients);
    const auto r = static_cast<std::size_t>(comm_->rank());
    const std::int64_t begin = b.part_bounds[r], n = b.part_bounds[r + 1] - begin;
    mine = b.sharded ? Tensor::empty({n}, b.dtype, comm_->device()) : b.filling.narrow(0, begin, n);
  }
  {
    std::lock_guard lock(mutex_);
    b.mine = std::move(mine);
    b.flat = std::move(b.filling);
    b.filling = Tensor();
    packed_[bucket] = true;
    if (!finishing_) ++stats_.early_buckets;
  }
  changed_.notify_all();
  if (landed_) deliver_landed(false);
}

std::size_t DataParallel::packed_prefix() const {
  std::size_t packed = 0;
  while (packed < packed_.size() && packed_[packed]) ++packed;
  return packed;
}

void DataParallel::wait_and_release(std::size_t until) {
  {
    std::unique_lock lock(mutex_);
    const auto t0 = std::chrono::steady_clock::now();
    changed_.wait(lock, [&] { return next_sum_ >= until || error_; });
    stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (error_) std::rethrow_exception(error_);
  }
  release(until);
}

void DataParallel::release(std::size_t until) {
  for (; released_ < until; ++released_) {
    Bucket& b = buckets_[released_];
    if (b.sharded) {
      b.flat = std::move(b.mine);  // only this rank's part of the sum is kept
    } else {
      b.mine = Tensor();  // a view of flat, which holds the sum
    }
  }
}

void DataParallel::set_landed(std::function<void(std::size_t param, double norm)> landed) {
  landed_ = std::move(landed);
}

void DataParallel::deliver_landed(bool all) {
  std::unique_lock lock(mutex_);
  const std::size_t packed = packed_prefix();  // buckets [0, packed) are with the worker
  const std::size_t until = all ? buckets_.size() : (packed == 0 ? 0 : packed - 1);
  while (delivered_ < until) {
    const auto t0 = std::chrono::steady_clock::now();
    changed_.wait(lock, [&] { return next_sum_ > delivered_ || error_; });
    stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (error_) std::rethrow_exception(error_);
    const std::size_t b = delivered_++;
    lock.unlock();
    deliver(b);
    lock.lock();
  }
}

void DataParallel::shard_norms(Bucket& b, const Tensor& mine) {
  // Each parameter's blocks, this rank's filled in: every block lies on one rank, so summing the ranks'
  // copies adds only zeros to it, and the norm is the one tensor's canonical norm.
  const auto ranks = static_cast<std::size_t>(comm_->size()), r = static_cast<std::size_t>(comm_->rank());
  std::vector<std::size_t> first(b.params.size() + 1, 0);
  for (std::size_t i = 0; i < b.params.size(); ++i)
    first[i + 1] = first[i] + static_cast<std::size_t>((params_[b.params[i]].numel() + 255) / 256);
  std::vector<double> blocks(first.back(), 0.0);
  MT_CHECK(b.dtype == DType::f32, "DataParallel", "layer-wise updates at ZeRO-2 need f32 gradients, got {}",
           dtype_name(b.dtype));
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < b.params.size(); ++i) {
    const std::int64_t begin = b.shard_bounds[i * (ranks + 1) + r];
    const std::int64_t n = b.shard_bounds[i * (ranks + 1) + r + 1] - begin;
    train::detail::block_squares(mine.narrow(0, offset, n), blocks.data() + first[i] + begin / 256);
    offset += n;
  }
  const std::vector<double> all = comm_->all_gather_f64(blocks);
  b.norms.assign(b.params.size(), 0.0);
  for (std::size_t i = 0; i < b.params.size(); ++i) {
    double total = 0.0;
    for (std::size_t k = first[i]; k < first[i + 1]; ++k) {
      double block = 0.0;
      for (std::size_t q = 0; q < ranks; ++q) block += all[q * blocks.size() + k];
      total += block;
    }
    b.norms[i] = std::sqrt(total);
  }
}

void DataParallel::run_worker() {
  // The sums allocate their receive buffers here: gradient memory, as the buckets are.
  CategoryGuard category(MemoryCategory::gradients);
  // A simulated group counts the bytes its sums would send here; finish_gradients hands them on to the
  // trainer's thread (a prediction's work counter).
  ::memtrain::detail::WorkCounts sent;
  ::memtrain::detail::WorkCounterGuard counting(&sent);
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stop_ || (next_sum_ < packed_.size() && packed_[next_sum_] && !error_); });
    if (stop_) return;
    Bucket& b = buckets_[next_sum_];
    // The trainer's thread allocated both and frees them (wait_and_release): nothing here allocates or frees
    // accounted memory, so a rank's live bytes never depend on how far the sums have got, and a prediction
    // on the meta device, whose sums take no time, sees the same peak.
    Tensor flat = b.flat, mine = b.mine;
    lock.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    std::exception_ptr error;
    try {
      if (options_.sum_delay_seconds > 0.0)
        std::this_thread::sleep_for(std::chrono::duration<double>(options_.sum_delay_seconds));
      comm_->reduce_scatter_canonical(flat, b.part_bounds, mine);
      if (b.sharded && landed_) shard_norms(b, mine);
      if (!b.sharded) comm_->all_gather(mine, b.part_bounds, flat);  // all_reduce_canonical's two halves
    } catch (...) {
      error = std::current_exception();
    }
    flat = Tensor();
    mine = Tensor();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    lock.lock();
    stats_.sum_seconds += seconds;
    ++stats_.buckets;
    stats_.bytes += b.bytes;
    worker_sent_bytes_ += std::exchange(sent.communicated_bytes, 0.0);
    if (error) {
      error_ = error;
    } else {
      ++next_sum_;
    }
    changed_.notify_all();
  }
}

void DataParallel::finish_gradients() {
  finishing_ = true;  // only this thread reads or writes it
  for (std::size_t k = 0; k < params_.size(); ++k) gradient_ready(k);
  finishing_ = false;
  wait_and_release(buckets_.size());
  {
    std::lock_guard lock(mutex_);
    ++stats_.steps;
    if (::memtrain::detail::WorkCounts* c = ::memtrain::detail::current_work_counter())
      c->communicated_bytes += worker_sent_bytes_;
    worker_sent_bytes_ = 0.0;
  }
  for (; delivered_ < buckets_.size(); ++delivered_) deliver(delivered_);
  if (!order_learned_) learn_order();
}

void DataParallel::expect_order(std::vector<std::size_t> order) {
  std::vector<std::size_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i)
    MT_CHECK(sorted[i] == i, "DataParallel::expect_order", "not a permutation of the parameters: index {} is {}", i,
             sorted[i]);
  std::lock_guard lock(mutex_);
  order_ = std::move(order);
  order_learned_ = false;
  replan_ = true;
}

void DataParallel::learn_order() {
  order_learned_ = true;
  // Rank 0's order for every rank: the buckets, and so the sums, must be the same everywhere.
  const std::vector<std::int64_t> seen(ready_order_.begin(), ready_order_.end());
  const std::vector<std::int64_t> all = comm_->all_gather_i64(seen);
  std::vector<std::size_t> order(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(seen.size()));
  std::vector<std::size_t> planned;  // the order the buckets follow now
  for (const Bucket& b : buckets_) planned.insert(planned.end(), b.params.begin(), b.params.end());
  if (order == planned) return;
  order_ = std::move(order);
  replan_ = true;
  ++stats_.replans;
}

void DataParallel::deliver(std::size_t bucket) {
  release(bucket + 1);  // a bucket packed out of order may land before the next pack releases it
  Bucket& b = buckets_[bucket];
  const auto ranks = static_cast<std::size_t>(comm_->size()), r = static_cast<std::size_t>(comm_->rank());
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < b.params.size(); ++i) {
    const std::size_t k = b.params[i];
    Tensor p = params_[k];
    // Views into the bucket: its one buffer is the gradients now (freed when the last of them is).
    if (b.sharded) {
      const std::int64_t n = b.shard_bounds[i * (ranks + 1) + r + 1] - b.shard_bounds[i * (ranks + 1) + r];
      if (n > 0) shard_grads_[k] = b.flat.narrow(0, offset, n);
      offset += n;
    } else {
      p.set_grad(b.flat.narrow(0, offset, p.numel()).view(p.shape()));
      offset += p.numel();
    }
    if (landed_) landed_(k, b.sharded ? b.norms[i] : train::detail::canonical_norm(p.grad()));
  }
  b.flat = Tensor();
}

Tensor DataParallel::take_shard_gradient(std::size_t index) {
  MT_CHECK(index < shard_grads_.size(), "DataParallel::take_shard_gradient", "parameter {} of {}", index,
           shard_grads_.size());
  return std::exchange(shard_grads_[index], Tensor());
}

void DataParallel::combine_disjoint(std::vector<double>& values) {
  // A simulated rank (a prediction, on meta) allocates the same bytes and leaves its values as they are.
  if (comm_->device().is_meta()) {
    Tensor t = Tensor::empty({static_cast<std::int64_t>(values.size())}, DType::f64, Device::meta());
    comm_->all_reduce_sum(t);
    return;
  }
  Tensor t = tensor(values, {static_cast<std::int64_t>(values.size())});
  comm_->all_reduce_sum(t);
  values.assign(t.data<double>(), t.data<double>() + values.size());
}

DataParallelStats DataParallel::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

std::string DataParallelStats::describe() const {
  std::string line = fmt::format("data parallel: {} steps, {} bucket sums ({} started during the backward) of "
                                 "{:.1f} MiB in all; {:.3f} s summing, {:.3f} s of it waited for",
                                 steps, buckets, early_buckets, static_cast<double>(bytes) / (1 << 20), sum_seconds,
                                 wait_seconds);
  if (replans > 0) line += fmt::format(" (buckets planned again in the backward's order after the first step)");
  if (gather_seconds > 0.0) line += fmt::format("; {:.3f} s gathering the stepped shards (ZeRO)", gather_seconds);
  return line;
}

std::shared_ptr<DataParallel> attach_data_parallel(train::Trainer& trainer, std::shared_ptr<Communicator> comm,
                                                   DataParallelOptions options) {
  MT_CHECK(comm != nullptr, "attach_data_parallel", "the communicator is null");
  // A prediction (meta) of a compressed run sums dense: its u and v are not predicted.
  MT_CHECK(!train::parse_grad_compression(trainer.config().grad_compression).enabled() ||
               trainer.config().device.is_meta(),
           "attach_data_parallel", "config.grad_compression is '{}': attach with dist::attach_dgc (dist/dgc.h)",
           trainer.config().grad_compression);
  if (comm->size() == 1 && trainer.config().world_size == 1) return nullptr;
  auto dp = std::make_shared<DataParallel>(std::move(comm), options);
  trainer.set_gradient_sync(dp);
  return dp;
}

std::function<void(train::Trainer&)> simulate_rank(int rank, DataParallelOptions options) {
  return [rank, options](train::Trainer& trainer) {
    MT_CHECK(trainer.config().device.is_meta(), "dist::simulate_rank",
             "the trainer runs on {}: a simulated rank trains only on the meta device (predict_memory)",
             trainer.config().device.str());
    attach_data_parallel(trainer, simulated_group(rank, static_cast<int>(trainer.config().world_size)), options);
  };
}

}  // namespace memtrain::dist

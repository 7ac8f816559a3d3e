// The batch loader: the epoch permutation, the rank's share of it, and the prefetching worker thread.
#include "memtrain/data/loader.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/core/philox.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

namespace memtrain::data {

namespace {

// The loader's Philox counters carry this tag in their high word, so with the same seed they never meet
// the global stream (whose counter_hi is 0): shuffling cannot perturb or replay the model's random numbers.
constexpr std::uint64_t kLoaderStreamTag = 0x4C4F414445520000ull;  // "LOADER\0\0"

// 64-bit draws from Philox(key = seed, counter = (block, tag | epoch)), two per block.
class EpochDraws {
 public:
  EpochDraws(std::uint64_t seed, std::int64_t epoch)
      : seed_(seed), counter_hi_(kLoaderStreamTag ^ static_cast<std::uint64_t>(epoch)) {}

  std::uint64_t next_u64() {
    if (lane_ == 0) block_ = philox4x32_10(counter_lo_++, counter_hi_, seed_);
    const std::uint64_t v = (static_cast<std::uint64_t>(block_.v[lane_ + 1]) << 32) | block_.v[lane_];
    lane_ = (lane_ + 2) % 4;
    return v;
  }

  // Uniform in [0, bound) without modulo bias (Lemire's multiply-and-reject).
  std::uint64_t below(std::uint64_t bound) {
    unsigned __int128 m = static_cast<unsigned __int128>(next_u64()) * bound;
    auto low = static_cast<std::uint64_t>(m);
    if (low < bound) {
      const std::uint64_t threshold = (0 - bound) % bound;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(next_u64()) * bound;
        low = static_cast<std::uint64_t>(m);
      }
    }
    return static_cast<std::uint64_t>(m >> 64);
  }

 private:
  std::uint64_t seed_;
  std::uint64_t counter_hi_;
  std::uint64_t counter_lo_ = 0;
  Philox4x32 block_{};
  int lane_ = 0;
};

}  // namespace

void LoaderOptions::validate() const {
  MT_CHECK(batch_size >= 1, "LoaderOptions", "batch_size {} must be >= 1", batch_size);
  MT_CHECK(world_size >= 1, "LoaderOptions", "world_size {} must be >= 1", world_size);
  MT_CHECK(rank >= 0 && rank < world_size, "LoaderOptions", "rank {} is outside [0, world_size {})", rank,
           world_size);
  MT_CHECK(prefetch >= 0, "LoaderOptions", "prefetch {} must be >= 0", prefetch);
  MT_CHECK(batch_block >= 0, "LoaderOptions", "batch_block {} must be >= 0", batch_block);
}

std::vector<std::int64_t> epoch_share(std::int64_t num_samples, const LoaderOptions& options, std::int64_t epoch) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(num_samples));
  for (std::int64_t i = 0; i < num_samples; ++i) order[static_cast<std::size_t>(i)] = i;
  if (options.shuffle) {
    EpochDraws draws(options.seed, epoch);
    for (std::int64_t i = num_samples - 1; i > 0; --i) {
      const auto j = static_cast<std::int64_t>(draws.below(static_cast<std::uint64_t>(i) + 1));
      std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
    }
  }
  // Every rank takes the same count, floor(N / W), so ranks stay in lockstep; the tail of the order is
  // left out this epoch (a different tail next epoch when shuffling).
  // Sharing whole batches (batch_block), every rank sees the whole order and the batches pick the ranks.
  if (options.batch_block > 0) return order;
  const std::int64_t share = num_samples / options.world_size;
  std::vector<std::int64_t> mine(static_cast<std::size_t>(share));
  for (std::int64_t j = 0; j < share; ++j)
    mine[static_cast<std::size_t>(j)] = order[static_cast<std::size_t>(options.rank + j * options.world_size)];
  return mine;
}

// ---- the worker: collates ahead into a queue of at most `prefetch` batches ----

struct Loader::Worker {
  std::mutex mutex;
  std::condition_variable space;  // the worker waits here for room in the queue
  std::condition_variable ready;  // next() waits here for a batch or an error
  std::deque<Batch> queue;
  std::exception_ptr error;       // what collate threw; the worker has stopped
  bool stop = false;
  std::thread thread;
};

Loader::Loader(std::shared_ptr<const Dataset> dataset, LoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  MT_CHECK(dataset_ != nullptr, "Loader", "dataset is null");
  options_.validate();
  const std::int64_t n = dataset_->size();
  const std::int64_t share = options_.batch_block > 0 ? n : n / options_.world_size;
  MT_CHECK(batches_per_epoch() >= 1, "Loader",
           "{}: rank share of {} samples (of {} over world_size {}) holds no {} of batch_size {}",
           dataset_->describe(), share, n, options_.world_size, options_.drop_last ? "full batch" : "sample",
           options_.batch_size);
  position_ = first_owned(position_);
  start_worker();
}

Loader::~Loader() { stop_worker(); }

std::int64_t Loader::batches_per_epoch() const {
  const std::int64_t share = options_.batch_block > 0 ? dataset_->size() : dataset_->size() / options_.world_size;
  return options_.drop_last ? share / options_.batch_size : (share + options_.batch_size - 1) / options_.batch_size;
}

LoaderPosition Loader::position() const { return position_; }

bool Loader::owns(LoaderPosition p) const {
  if (options_.batch_block == 0) return true;
  const std::int64_t global = p.epoch * batches_per_epoch() + p.batch;
  return (global / options_.batch_block) % options_.world_size == options_.rank;
}

LoaderPosition Loader::first_owned(LoaderPosition p) const {
  while (!owns(p)) {
    if (++p.batch == batches_per_epoch()) {
      ++p.epoch;
      p.batch = 0;
    }
  }
  return p;
}

LoaderPosition Loader::advance(LoaderPosition p) const {
  if (++p.batch == batches_per_epoch()) {
    ++p.epoch;
    p.batch = 0;
  }
  return first_owned(p);
}

std::vector<std::int64_t> Loader::slice_batch(const std::vector<std::int64_t>& share, std::int64_t batch) const {
  const auto begin = static_cast<std::size_t>(batch * options_.batch_size);
  const std::size_t end = std::min(share.size(), begin + static_cast<std::size_t>(options_.batch_size));
  return {share.begin() + static_cast<std::ptrdiff_t>(begin), share.begin() + static_cast<std::ptrdiff_t>(end)};
}

std::vector<std::int64_t> Loader::batch_indices(LoaderPosition p) const {
  check_position(p, "Loader::batch_indices");
  return slice_batch(epoch_share(dataset_->size(), options_, p.epoch), p.batch);
}

void Loader::check_position(LoaderPosition p, const char* where) const {
  MT_CHECK(p.epoch >= 0 && p.batch >= 0 && p.batch < batches_per_epoch(), where,
           "position (epoch {}, batch {}) is outside epochs >= 0 and batches [0, {})", p.epoch, p.batch,
           batches_per_epoch());
}

Batch Loader::collate_at(LoaderPosition p, ShareCache& cache) const {
  if (cache.epoch != p.epoch) {
    cache.share = epoch_share(dataset_->size(), options_, p.epoch);
    cache.epoch = p.epoch;
  }
  CategoryGuard guard(MemoryCategory::data);  // for datasets that do not set it themselves
  return dataset_->collate(slice_batch(cache.share, p.batch));
}

Batch Loader::next() {
  if (!worker_) {
    Batch b = collate_at(position_, sync_cache_);
    position_ = advance(position_);
    return b;
  }
  std::unique_lock lock(worker_->mutex);
  worker_->ready.wait(lock, [&] { return !worker_->queue.empty() || worker_->error; });
  // Batches collated before a failure are still handed out; the error surfaces at the batch that failed.
  if (worker_->queue.empty()) std::rethrow_exception(worker_->error);
  Batch b = std::move(worker_->queue.front());
  worker_->queue.pop_front();
  lock.unlock();
  worker_->space.notify_one();
  position_ = advance(position_);
  return b;
}

void Loader::seek(LoaderPosition p) {
  check_position(p, "Loader::seek");
  if (options_.batch_block > 0) {
    const std::int64_t group = options_.batch_block * options_.world_size;
    const std::int64_t global = p.epoch * batches_per_epoch() + p.batch;
    MT_CHECK(global % group == 0, "Loader::seek",
             "position (epoch {}, batch {}) is batch {} of the global stream, not the start of a group of {} "
             "(world_size {} x batch_block {})", p.epoch, p.batch, global, group, options_.world_size,
             options_.batch_block);
  }
  stop_worker();
  position_ = first_owned(p);
  start_worker();
}

void Loader::start_worker() {
  if (options_.prefetch == 0) return;
  worker_ = std::make_unique<Worker>();
  worker_->thread = std::thread([this, w = worker_.get(), p = position_]() mutable {
    // The category is thread-local: batch tensors made here must be counted as data too.
    CategoryGuard guard(MemoryCategory::data);
    ShareCache cache;
    for (;;) {
      {
        std::unique_lock lock(w->mutex);
        w->space.wait(lock, [&] { return w->stop || static_cast<std::int64_t>(w->queue.size()) < options_.prefetch; });
        if (w->stop) return;
      }
      Batch b;
      try {
        b = collate_at(p, cache);
      } catch (...) {
        std::lock_guard lock(w->mutex);
        w->error = std::current_exception();
        w->ready.notify_all();
        return;
      }
      {
        std::lock_guard lock(w->mutex);
        if (w->stop) return;
        w->queue.push_back(std::move(b));
      }
      w->ready.notify_one();
      p = advance(p);
    }
  });
}

void Loader::stop_worker() {
  if (!worker_) return;
  {
    std::lock_guard lock(worker_->mutex);
    worker_->stop = true;
  }
  worker_->space.notify_all();
  if (worker_->thread.joinable()) worker_->thread.join();
  worker_.reset();
}

}  // namespace memtrain::data

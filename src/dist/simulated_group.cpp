// One rank of a group that does not exist, on the meta device: what a memory prediction of a data-parallel run
// trains over (communicator.h). Collectives keep the layout checks every backend makes and move nothing; with a
// work counter installed on the calling thread they count the bytes this rank would send (core/work_counter.h).
#include "core/work_counter.h"
#include "dist/collective_checks.h"
#include "memtrain/dist/communicator.h"

namespace memtrain::dist {
namespace {

void count_sent(double bytes) {
  if (::memtrain::detail::WorkCounts* c = ::memtrain::detail::current_work_counter()) c->communicated_bytes += bytes;
}

class SimulatedGroup final : public Communicator {
 public:
  SimulatedGroup(int rank, int size) : rank_(rank), size_(size) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return rank_; }
  std::string backend() const override { return "simulated"; }
  Device device() const override { return Device::meta(); }

  void barrier() override {}
  void broadcast(Tensor& t, int root) override {
    MT_CHECK(t.defined(), "broadcast", "the tensor is undefined");
    detail::check_root("broadcast", root, size_);
  }
  std::string broadcast_string(const std::string& s, int root) override {
    detail::check_root("broadcast_string", root, size_);
    return s;
  }
  std::vector<double> all_gather_f64(const std::vector<double>& mine) override { return repeated(mine); }
  std::vector<std::int64_t> all_gather_i64(const std::vector<std::int64_t>& mine) override { return repeated(mine); }

  // Host values too (the trainer's combined norm blocks): nothing to add, no other rank holds any.
  void all_reduce_sum(Tensor& t) override {
    MT_CHECK(t.defined(), "all_reduce_sum", "the tensor is undefined");
    detail::check_summable("all_reduce_sum", t.dtype());
  }
  void reduce_scatter_canonical(const Tensor& contribution, const std::vector<std::int64_t>& bounds,
                                Tensor& mine) override {
    detail::check_shard_layout("reduce_scatter_canonical", *this, contribution, bounds, mine);
    detail::check_summable("reduce_scatter_canonical", contribution.dtype());
    count_sent(static_cast<double>(contribution.nbytes() - mine.nbytes()));  // every other rank's part
  }
  void all_gather(const Tensor& mine, const std::vector<std::int64_t>& bounds, Tensor& full) override {
    detail::check_shard_layout("all_gather", *this, full, bounds, mine);
    count_sent(static_cast<double>(mine.nbytes()) * (size_ - 1));  // this rank's part, to every other rank
  }

 private:
  template <typename T>
  std::vector<T> repeated(const std::vector<T>& mine) const {
    std::vector<T> all;
    for (int q = 0; q < size_; ++q) all.insert(all.end(), mine.begin(), mine.end());
    return all;
  }

  int rank_, size_;
};

}  // namespace

std::shared_ptr<Communicator> simulated_group(int rank, int size) {
  MT_CHECK(size >= 1 && rank >= 0 && rank < size, "dist::simulated_group", "rank {} of a group of {}", rank, size);
  return std::make_shared<SimulatedGroup>(rank, size);
}

}  // namespace memtrain::dist

// The group of one: every collective is a copy (or nothing), after the same argument checks as MPI's backend.
#include "dist/collective_checks.h"
#include "memtrain/dist/communicator.h"

#include <cstring>

namespace memtrain::dist {
namespace {

class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  std::string backend() const override { return "single"; }
  std::shared_ptr<Communicator> split(int, int) override { return single_process(); }

  void barrier() override {}
  void broadcast(Tensor& t, int root) override {
    detail::check_host_tensor("broadcast", t, "the tensor");
    detail::check_root("broadcast", root, 1);
  }
  std::string broadcast_string(const std::string& s, int root) override {
    detail::check_root("broadcast_string", root, 1);
    return s;
  }
  std::vector<double> all_gather_f64(const std::vector<double>& mine) override { return mine; }
  std::vector<std::int64_t> all_gather_i64(const std::vector<std::int64_t>& mine) override { return mine; }

  void all_reduce_sum(Tensor& t) override {
    detail::check_host_tensor("all_reduce_sum", t, "the tensor");
    detail::check_summable("all_reduce_sum", t.dtype());
  }
  void reduce_scatter_canonical(const Tensor& contribution, const std::vector<std::int64_t>& bounds,
                                Tensor& mine) override {
    detail::check_sharded("reduce_scatter_canonical", *this, contribution, bounds, mine);
    detail::check_summable("reduce_scatter_canonical", contribution.dtype());
    copy_bytes(contribution, mine);  // one leaf: the tree is the leaf itself
  }
  void all_gather(const Tensor& mine, const std::vector<std::int64_t>& bounds, Tensor& full) override {
    detail::check_sharded("all_gather", *this, full, bounds, mine);
    copy_bytes(mine, full);
  }

 private:
  static void copy_bytes(const Tensor& from, Tensor& to) {
    if (from.nbytes() > 0 && from.data_ptr() != to.data_ptr()) std::memmove(to.data_ptr(), from.data_ptr(), from.nbytes());
  }
};

}  // namespace

std::shared_ptr<Communicator> single_process() { return std::make_shared<SingleProcess>(); }

}  // namespace memtrain::dist

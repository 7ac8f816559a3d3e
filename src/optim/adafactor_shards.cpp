// Adafactor's step over ZeRO row shards (see adafactor.h): each rank updates its rows, and the statistics
// that span rows (column means, the mean of the row statistics, the update's RMS) are completed from what
// the ranks exchange, with the arithmetic of the CPU backend's adafactor_step (cpu/adafactor_rows.h) and the
// row tree's order (cpu/row_tree.h), so the bits are the run alone's.
#include "memtrain/optim/adafactor.h"

#include "cpu/adafactor_rows.h"
#include "cpu/row_tree.h"
#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/allocator.h"

#include <cmath>
#include <map>
#include <utility>

namespace memtrain::optim {
namespace af = cpu::adafactor;

namespace {

// A rank's word on a parameter before anything changes: a step runs only when every rank says ready.
enum Status : int { ready = 1, no_gradient = 0, nonfinite = -1 };

// Reads the values ranks sent, in the order they wrote them.
class Reader {
 public:
  explicit Reader(const std::vector<double>& values) : values_(values) {}
  double next() { return *take(1); }
  const double* take(std::size_t n) {
    MT_CHECK(at_ + n <= values_.size(), "Adafactor (ZeRO)", "a rank sent {} values, fewer than its parameters need",
             values_.size());
    const double* p = values_.data() + at_;
    at_ += n;
    return p;
  }

 private:
  const std::vector<double>& values_;
  std::size_t at_ = 0;
};

// Node (lo, hi) -> its values, from every rank's message.
using NodeValues = std::map<std::pair<std::int64_t, std::int64_t>, const double*>;

const double* lookup(const NodeValues& nodes, cpu::RowNode n) {
  const auto it = nodes.find({n.lo, n.hi});
  return it == nodes.end() ? nullptr : it->second;
}

}  // namespace

StepReport Adafactor::step_row_shards() {
  // One parameter of the step, as every rank sees it.
  struct Item {
    Tensor* param = nullptr;  // this rank's flat row view
    const ParamGroup* group = nullptr;
    ParamState* state = nullptr;
    Shape whole;
    bool factored = false;
    std::int64_t rows = 0, cols = 1, batch_rows = 0;  // batch_rows: rows per batch (factored), else rows
    std::vector<std::int64_t> bounds;                  // every rank's first row, then rows
    Tensor grad;                                       // f32, contiguous, this rank's rows
    Status status = ready;
    bool go = false;  // every rank is ready
    int rank = 0;
    std::int64_t first() const { return bounds[static_cast<std::size_t>(rank)]; }
    std::int64_t last() const { return bounds[static_cast<std::size_t>(rank) + 1]; }
  };
  const char* where = "Adafactor (ZeRO)";
  autograd::NoGradGuard no_grad;
  StepReport report;
  std::vector<Item> items;
  for_each_slot([&](Tensor& param, const ParamGroup& group, ParamState& state) {
    Item it;
    it.param = &param;
    it.group = &group;
    it.state = &state;
    it.rank = shards_.rank;
    it.whole = whole_shape(param, group);
    it.factored = it.whole.size() >= 2;
    const std::int64_t numel = shape_numel(it.whole);
    it.cols = it.factored ? it.whole.back() : 1;
    it.rows = it.cols == 0 ? 0 : numel / it.cols;
    it.batch_rows = it.factored ? it.whole[it.whole.size() - 2] : it.rows;
    it.bounds = shards_.row_bounds(it.whole);
    MT_CHECK(it.bounds.size() >= 2 && it.bounds.back() == it.rows, where, "row bounds of a {} tensor end at {}",
             shape_str(it.whole), it.bounds.empty() ? 0 : it.bounds.back());
    MT_CHECK((it.last() - it.first()) * it.cols == param.numel(), where,
             "a shard of {} elements is not rows [{}, {}) of a {} tensor", param.numel(), it.first(), it.last(),
             shape_str(it.whole));
    const Tensor g = param.grad();
    if (param.numel() == 0) {
      it.status = ready;
    } else if (!g.defined()) {
      it.status = no_gradient;
    } else {
      MT_CHECK(g.numel() == param.numel(), where, "a shard of {} elements has a gradient of {}", param.numel(),
               g.numel());
      it.status = is_finite(g) ? ready : nonfinite;
      if (it.status == ready) {
        CategoryGuard category(MemoryCategory::workspace);
        it.grad = g.to(DType::f32).contiguous();
      }
    }
    items.push_back(std::move(it));
  });

  const bool meta = std::any_of(items.begin(), items.end(), [](const Item& i) { return i.param->device().is_meta(); });
  if (meta) {
    // A prediction: the ranks are alike and hold no values. The state and the two update buffers of a step,
    // allocated as the real step allocates them.
    for (Item& it : items) {
      if (it.status != ready) continue;
      ParamState& state = *it.state;
      ensure_state(*it.param, *it.group, state);
      ++state.step;
      CategoryGuard category(MemoryCategory::workspace);
      for (int pass = 0; pass < 2; ++pass) (void)Tensor::empty({it.param->numel()}, DType::f32, it.param->device());
      ++report.updated;
    }
    return report;
  }

  // 1. Every rank's status; for a ready matrix, its new row statistics and the column sums of its subtrees.
  std::vector<double> mine;
  std::vector<std::vector<float>> new_rows(items.size());
  for (std::size_t k = 0; k < items.size(); ++k) {
    Item& it = items[k];
    mine.push_back(it.status);
    if (it.status != ready) continue;
    ParamState& state = *it.state;
    ensure_state(*it.param, *it.group, state);
    if (!it.factored || it.param->numel() == 0) continue;
    const double beta2t = 1.0 - std::pow(static_cast<double>(state.step + 1), options_.decay_rate);
    const float* g = it.grad.data<float>();
    const float* R = state.tensors.at("exp_avg_sq_row").data<float>();
    std::vector<float>& rows = new_rows[k];
    rows.assign(R + it.first(), R + it.last());
    af::update_row_stats(g, rows.data(), it.last() - it.first(), it.cols, beta2t, options_.eps1);
    mine.insert(mine.end(), rows.begin(), rows.end());
    std::vector<double> sums(static_cast<std::size_t>(it.cols));
    for (std::int64_t lo = 0; lo < it.rows; lo += it.batch_rows)
      for (const cpu::RowNode n : cpu::row_tree_cover(lo, lo + it.batch_rows, it.first(), it.last())) {
        af::column_sums(g + (n.lo - it.first()) * it.cols, n.hi - n.lo, it.cols, options_.eps1, sums.data());
        mine.insert(mine.end(), sums.begin(), sums.end());
      }
  }
  const std::vector<std::vector<double>> first = shards_.gather(mine);
  const auto ranks = first.size();

  // Every rank's statuses first: a parameter steps only when all are ready.
  std::vector<Reader> readers;
  for (const auto& values : first) readers.emplace_back(values);
  for (std::size_t k = 0; k < items.size(); ++k) {
    Item& it = items[k];
    MT_CHECK(it.bounds.size() == ranks + 1, where, "{} ranks sent values, but a {} tensor is split over {}", ranks,
             shape_str(it.whole), it.bounds.size() - 1);
    bool all_ready = true, any_nonfinite = false;
    std::vector<Status> status(ranks);
    for (std::size_t q = 0; q < ranks; ++q) {
      status[q] = static_cast<Status>(static_cast<int>(readers[q].next()));
      all_ready = all_ready && status[q] == ready;
      any_nonfinite = any_nonfinite || status[q] == nonfinite;
    }
    if (any_nonfinite) ++report.skipped_nonfinite;
    it.go = all_ready && it.rows > 0;
    // The ready ranks' payloads, read whether or not the parameter steps, so the next parameter's are next.
    NodeValues nodes;
    ParamState& state = *it.state;
    std::vector<std::pair<std::size_t, const double*>> row_values;  // rank -> its new row statistics
    for (std::size_t q = 0; q < ranks; ++q) {
      if (status[q] != ready || !it.factored) continue;
      const std::int64_t a = it.bounds[q], b = it.bounds[q + 1];
      if (a == b) continue;
      row_values.emplace_back(q, readers[q].take(static_cast<std::size_t>(b - a)));
      for (std::int64_t lo = 0; lo < it.rows; lo += it.batch_rows)
        for (const cpu::RowNode n : cpu::row_tree_cover(lo, lo + it.batch_rows, a, b))
          nodes[{n.lo, n.hi}] = readers[q].take(static_cast<std::size_t>(it.cols));
    }
    if (!it.go) continue;
    ++state.step;
    ++report.updated;
    const double beta2t = 1.0 - std::pow(static_cast<double>(state.step), options_.decay_rate);
    if (it.factored) {
      float* R = state.tensors.at("exp_avg_sq_row").data<float>();
      float* C = state.tensors.at("exp_avg_sq_col").data<float>();
      for (const auto& [q, values] : row_values)
        for (std::int64_t i = it.bounds[q]; i < it.bounds[q + 1]; ++i)
          R[i] = static_cast<float>(values[i - it.bounds[q]]);
      std::vector<double> col_sum(static_cast<std::size_t>(it.cols));
      for (std::int64_t lo = 0; lo < it.rows; lo += it.batch_rows) {
        cpu::row_tree_combine(lo, lo + it.batch_rows, it.cols,
                              [&](cpu::RowNode n) { return lookup(nodes, n); }, col_sum.data());
        af::update_col_stats(col_sum.data(), C + (lo / it.batch_rows) * it.cols, it.cols, it.batch_rows, beta2t);
      }
    } else if (it.param->numel() > 0) {
      af::update_vector_stats(it.grad.data<float>(), state.tensors.at("exp_avg_sq").data<float>(),
                              it.param->numel(), beta2t, options_.eps1);
    }
  }

  // The update of this rank's rows, from the whole statistics: computed once for the squares and again to
  // apply (one buffer at a time, as the step alone holds).
  const auto update_of = [&](const Item& it) {
    ParamState& state = *it.state;
    CategoryGuard category(MemoryCategory::workspace);
    Tensor u = Tensor::empty({it.param->numel()}, DType::f32, it.param->device());
    if (it.param->numel() == 0) return u;
    const float* g = it.grad.data<float>();
    if (!it.factored) {
      af::vector_update(g, state.tensors.at("exp_avg_sq").data<float>(), u.data<float>(), it.param->numel());
      return u;
    }
    const float* R = state.tensors.at("exp_avg_sq_row").data<float>();
    const float* C = state.tensors.at("exp_avg_sq_col").data<float>();
    // The rows of each batch this rank holds, with that batch's mean row statistic.
    for (std::int64_t lo = 0; lo < it.rows; lo += it.batch_rows) {
      const std::int64_t a = std::max(lo, it.first()), b = std::min(lo + it.batch_rows, it.last());
      if (a >= b) continue;
      const double r_mean = af::row_stats_total(R + lo, it.batch_rows) / it.batch_rows;
      af::factored_update(g + (a - it.first()) * it.cols, R + a, C + (lo / it.batch_rows) * it.cols, r_mean,
                          u.data<float>() + (a - it.first()) * it.cols, b - a, it.cols);
    }
    return u;
  };

  // 2. The subtree sums of the update's squares over the rows.
  mine.clear();
  for (const Item& it : items) {
    if (!it.go || it.param->numel() == 0) continue;
    const Tensor u = update_of(it);
    std::vector<double> squares(static_cast<std::size_t>(it.last() - it.first()));
    af::row_squares(u.data<float>(), it.last() - it.first(), it.cols, squares.data());
    for (const cpu::RowNode n : cpu::row_tree_cover(0, it.rows, it.first(), it.last())) {
      double sum = 0.0;
      cpu::row_tree_sum(n.lo, n.hi, 1, [&](std::int64_t i, double* leaf) { *leaf = squares[i - it.first()]; }, &sum);
      mine.push_back(sum);
    }
  }
  const std::vector<std::vector<double>> second = shards_.gather(mine);
  readers.clear();
  for (const auto& values : second) readers.emplace_back(values);
  for (const Item& it : items) {
    if (!it.go) continue;
    NodeValues nodes;
    for (std::size_t q = 0; q < ranks; ++q)
      for (const cpu::RowNode n : cpu::row_tree_cover(0, it.rows, it.bounds[q], it.bounds[q + 1]))
        nodes[{n.lo, n.hi}] = readers[q].take(1);
    double sum_sq = 0.0;
    cpu::row_tree_combine(0, it.rows, 1, [&](cpu::RowNode n) { return lookup(nodes, n); }, &sum_sq);
    if (it.param->numel() == 0) continue;
    const Tensor u = update_of(it);
    ParamState& state = *it.state;
    const auto m = state.tensors.find("exp_avg");
    af::apply(it.param->data<float>(), u.data<float>(), m == state.tensors.end() ? nullptr : m->second.data<float>(),
              it.param->numel(), af::clipped_scale(sum_sq, shape_numel(it.whole), it.group->lr, options_.clip_threshold),
              it.group->lr, it.group->weight_decay, it.group->beta1);
    for (const auto& [name, t] : state.tensors) release_state_pages(t);  // offloaded (Optimizer::set_state_arena)
  }
  return report;
}

}  // namespace memtrain::optim

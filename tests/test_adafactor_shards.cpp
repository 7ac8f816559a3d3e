// Adafactor over ZeRO row shards (optim::Adafactor::shard_rows), with the ranks as threads of one process and
// the exchange a barrier: 1 to 4 ranks, uneven row ranges (some empty), a batched matrix, a single-row matrix,
// vectors and a scalar, with and without the first moment, clipping active. Every rank's rows of every
// parameter, and the replicated row and column statistics, equal the unsharded step's bit for bit; a NaN in
// one rank's rows makes every rank skip that parameter, as the step alone skips it. And the row tree itself:
// its covers tile a range with maximal subtrees, and combining any partition's covers gives the bits of one sum.
#include "memtrain/core/rng.h"
#include "memtrain/optim/adafactor.h"

#include "cpu/row_tree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace mt = memtrain;
using mt::Shape;
using mt::Tensor;

namespace {

// Every thread's values, handed out once all `size` threads have brought theirs.
class ThreadGather {
 public:
  explicit ThreadGather(int size) : size_(size), slots_(static_cast<std::size_t>(size)) {}
  std::vector<std::vector<double>> gather(int rank, const std::vector<double>& mine) {
    std::unique_lock lock(mutex_);
    const std::int64_t generation = generation_;
    slots_[static_cast<std::size_t>(rank)] = mine;
    if (++arrived_ == size_) {
      result_ = slots_;
      arrived_ = 0;
      ++generation_;
      changed_.notify_all();
    } else {
      changed_.wait(lock, [&] { return generation_ != generation; });
    }
    return result_;
  }

 private:
  int size_;
  int arrived_ = 0;
  std::int64_t generation_ = 0;
  std::vector<std::vector<double>> slots_, result_;
  std::mutex mutex_;
  std::condition_variable changed_;
};

// rows x cols as the row-shard step sees a tensor.
std::int64_t cols_of(const Shape& s) { return s.size() >= 2 ? s.back() : 1; }
std::int64_t rows_of(const Shape& s) { return mt::shape_numel(s) / cols_of(s); }

// Uneven row ranges: rank q of `ranks` starts at a cut that depends on the tensor; some ranges are empty.
std::vector<std::int64_t> uneven_bounds(std::int64_t rows, int ranks, std::size_t salt) {
  std::vector<std::int64_t> b(static_cast<std::size_t>(ranks) + 1, rows);
  b[0] = 0;
  for (int q = 1; q < ranks; ++q) {
    const std::int64_t cut = static_cast<std::int64_t>((salt * 7 + static_cast<std::size_t>(q) * 13) % 5) *
                             rows / 4;  // 0, 1/4, ..., all of the rows
    b[static_cast<std::size_t>(q)] = std::max(b[static_cast<std::size_t>(q) - 1], std::min(rows, cut));
  }
  return b;
}

std::vector<float> values(const Tensor& t) {
  const Tensor c = t.contiguous();
  return {c.data<float>(), c.data<float>() + c.numel()};
}

const std::vector<Shape> kShapes = {{7, 3, 40}, {50, 33}, {1, 64}, {300}, {5}, {}};
constexpr int kSteps = 5;

// The step's gradient of tensor i: random, with a NaN in row `nan_row` at step `nan_step`.
Tensor gradient(std::size_t i, int step, int nan_step, std::int64_t nan_row) {
  mt::manual_seed(1000 * static_cast<std::uint64_t>(step) + i);
  Tensor g = mt::randn(kShapes[i]);
  if (step == nan_step && i == 1) g.data<float>()[nan_row * cols_of(kShapes[i])] = std::nanf("");
  return g;
}

struct Outcome {
  std::vector<std::vector<float>> params;          // whole tensors (sharded: each rank's rows put together)
  std::vector<std::vector<float>> row_stats, col;  // by tensor (factored ones)
  std::vector<std::int64_t> skipped;               // per step
};

mt::optim::AdafactorOptions options(bool first_moment) {
  mt::optim::AdafactorOptions o;
  o.clip_threshold = 0.5;  // the update's RMS is about 1: every step clips
  o.use_first_moment = first_moment;
  return o;
}

std::vector<Tensor> initial_params() {
  mt::manual_seed(5);
  std::vector<Tensor> params;
  for (const Shape& s : kShapes) params.push_back(mt::randn(s));
  return params;
}

Outcome run_alone(bool first_moment, int nan_step, std::int64_t nan_row) {
  std::vector<Tensor> params = initial_params();
  mt::optim::Adafactor opt({mt::optim::ParamGroup{params, 1e-2, 0.1, 0.9}}, options(first_moment));
  Outcome out;
  for (int step = 0; step < kSteps; ++step) {
    for (std::size_t i = 0; i < params.size(); ++i) params[i].set_grad(gradient(i, step, nan_step, nan_row));
    out.skipped.push_back(opt.step().skipped_nonfinite);
  }
  const auto state = opt.state_dict();
  for (std::size_t i = 0; i < params.size(); ++i) {
    out.params.push_back(values(params[i]));
    const auto r = state.find(std::to_string(i) + ".exp_avg_sq_row");
    out.row_stats.push_back(r == state.end() ? std::vector<float>{} : values(r->second));
    const auto c = state.find(std::to_string(i) + ".exp_avg_sq_col");
    out.col.push_back(c == state.end() ? std::vector<float>{} : values(c->second));
  }
  return out;
}

// Rank q of `ranks` holds rows bounds_of(shape)[q, q + 1) of every tensor; the ranks run as threads.
Outcome run_sharded(int ranks, bool first_moment, int nan_step, std::int64_t nan_row) {
  const auto bounds_of = [ranks](const Shape& s) {
    std::size_t salt = 0;
    for (std::size_t i = 0; i < kShapes.size(); ++i)
      if (kShapes[i] == s) salt = i;
    return uneven_bounds(rows_of(s), ranks, salt);
  };
  // The draws first, here: the generator is the process's.
  std::vector<std::vector<Tensor>> grads(kSteps), whole(static_cast<std::size_t>(ranks));
  for (int step = 0; step < kSteps; ++step)
    for (std::size_t i = 0; i < kShapes.size(); ++i) grads[step].push_back(gradient(i, step, nan_step, nan_row));
  for (auto& w : whole) w = initial_params();
  const auto rows_view = [&](const Tensor& t, std::size_t i, int rank) {
    const std::vector<std::int64_t> b = bounds_of(kShapes[i]);
    const std::int64_t cols = cols_of(kShapes[i]);
    return t.detach().view({t.numel()}).narrow(0, b[rank] * cols, (b[rank + 1] - b[rank]) * cols);
  };

  ThreadGather exchange(ranks);
  std::vector<Outcome> per_rank(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank)
    threads.emplace_back([&, rank] {
      const std::vector<Tensor>& mine = whole[static_cast<std::size_t>(rank)];
      mt::optim::ParamGroup group{{}, 1e-2, 0.1, 0.9};
      for (std::size_t i = 0; i < mine.size(); ++i) {
        group.params.push_back(rows_view(mine[i], i, rank));
        group.whole_shape.push_back(kShapes[i]);
      }
      mt::optim::Adafactor opt({group}, options(first_moment));
      opt.shard_rows({rank, bounds_of, [&](const std::vector<double>& v) { return exchange.gather(rank, v); }});
      Outcome& out = per_rank[static_cast<std::size_t>(rank)];
      for (int step = 0; step < kSteps; ++step) {
        for (std::size_t i = 0; i < mine.size(); ++i)
          opt.param_groups()[0].params[i].set_grad(rows_view(grads[step][i], i, rank));
        out.skipped.push_back(opt.step().skipped_nonfinite);
      }
      const auto state = opt.state_dict();
      for (std::size_t i = 0; i < mine.size(); ++i) {
        const auto r = state.find(std::to_string(i) + ".exp_avg_sq_row");
        out.row_stats.push_back(r == state.end() ? std::vector<float>{} : values(r->second));
        const auto c = state.find(std::to_string(i) + ".exp_avg_sq_col");
        out.col.push_back(c == state.end() ? std::vector<float>{} : values(c->second));
      }
    });
  for (std::thread& t : threads) t.join();

  // Each rank's rows put together; the replicated statistics and the skips must agree on every rank.
  Outcome out = per_rank[0];
  for (std::size_t i = 0; i < kShapes.size(); ++i) {
    std::vector<float> p;
    for (int rank = 0; rank < ranks; ++rank) {
      const std::vector<float> rows = values(rows_view(whole[static_cast<std::size_t>(rank)][i], i, rank));
      p.insert(p.end(), rows.begin(), rows.end());
    }
    out.params.push_back(p);
    for (int rank = 1; rank < ranks; ++rank) {
      EXPECT_EQ(per_rank[static_cast<std::size_t>(rank)].row_stats[i], out.row_stats[i]) << "rank " << rank;
      EXPECT_EQ(per_rank[static_cast<std::size_t>(rank)].col[i], out.col[i]) << "rank " << rank;
    }
  }
  for (int rank = 1; rank < ranks; ++rank) EXPECT_EQ(per_rank[static_cast<std::size_t>(rank)].skipped, out.skipped);
  return out;
}

void expect_same_bits(const Outcome& got, const Outcome& want, const std::string& what) {
  ASSERT_EQ(got.params.size(), want.params.size());
  for (std::size_t i = 0; i < want.params.size(); ++i) {
    ASSERT_EQ(got.params[i].size(), want.params[i].size()) << what << ", tensor " << i;
    EXPECT_EQ(std::memcmp(got.params[i].data(), want.params[i].data(), want.params[i].size() * sizeof(float)), 0)
        << what << ": tensor " << i << " (" << mt::shape_str(kShapes[i]) << ") differs from the step alone";
    EXPECT_EQ(got.row_stats[i], want.row_stats[i]) << what << ", tensor " << i;
    EXPECT_EQ(got.col[i], want.col[i]) << what << ", tensor " << i;
  }
  EXPECT_EQ(got.skipped, want.skipped) << what;
}

}  // namespace

TEST(RowTree, CoversTileTheRangeWithMaximalSubtrees) {
  for (std::int64_t rows : {1, 2, 3, 7, 8, 13, 64, 100})
    for (std::int64_t a = 0; a <= rows; ++a)
      for (std::int64_t b = a; b <= rows; ++b) {
        const auto nodes = mt::cpu::row_tree_cover(0, rows, a, b);
        std::int64_t at = a;
        for (const auto& n : nodes) {
          EXPECT_EQ(n.lo, at) << rows << " rows, [" << a << ", " << b << ")";
          at = n.hi;
        }
        EXPECT_EQ(at, b) << rows << " rows, [" << a << ", " << b << ")";
        // Maximal: no two neighbours are the halves of one node.
        for (std::size_t k = 0; k + 1 < nodes.size(); ++k) {
          const std::int64_t n = nodes[k + 1].hi - nodes[k].lo;
          const bool siblings = n >= 2 && nodes[k].hi - nodes[k].lo ==
                                              static_cast<std::int64_t>(std::bit_floor(static_cast<std::uint64_t>(n - 1)));
          // Siblings of one parent would have been that parent, unless it sticks out of [a, b) (impossible:
          // it is their union) or is not a node of the tree (its lower end not where the tree splits).
          if (siblings) {
            const auto parent = mt::cpu::row_tree_cover(0, rows, nodes[k].lo, nodes[k + 1].hi);
            EXPECT_NE(parent.size(), 1u) << "nodes " << k << ", " << k + 1 << " of [" << a << ", " << b << ")";
          }
        }
      }
}

TEST(RowTree, AnyPartitionCombinesToTheBitsOfOneSum) {
  const std::int64_t rows = 37, width = 5;
  std::vector<double> leaves(rows * width);
  for (std::size_t k = 0; k < leaves.size(); ++k) leaves[k] = std::sin(static_cast<double>(k) * 1.7) * 1e3 + 1e-7 * k;
  const mt::cpu::RowLeaf leaf = [&](std::int64_t i, double* out) { std::copy_n(&leaves[i * width], width, out); };
  std::vector<double> one(width);
  mt::cpu::row_tree_sum(0, rows, width, leaf, one.data());
  for (std::int64_t j = 0; j < width; ++j) {
    double plain = 0.0;
    for (std::int64_t i = 0; i < rows; ++i) plain += leaves[i * width + j];
    EXPECT_NEAR(one[j], plain, 1e-9 * std::abs(plain) + 1e-9) << "column " << j;
  }
  for (const std::vector<std::int64_t>& cuts : std::vector<std::vector<std::int64_t>>{
           {0, 37}, {0, 18, 37}, {0, 1, 36, 37}, {0, 10, 10, 20, 37}, {0, 5, 9, 21, 33, 37}}) {
    std::map<std::pair<std::int64_t, std::int64_t>, std::vector<double>> nodes;
    for (std::size_t q = 0; q + 1 < cuts.size(); ++q)
      for (const auto& n : mt::cpu::row_tree_cover(0, rows, cuts[q], cuts[q + 1])) {
        std::vector<double> v(width);
        mt::cpu::row_tree_sum(n.lo, n.hi, width, leaf, v.data());
        nodes[{n.lo, n.hi}] = v;
      }
    std::vector<double> combined(width);
    mt::cpu::row_tree_combine(0, rows, width, [&](mt::cpu::RowNode n) -> const double* {
      const auto it = nodes.find({n.lo, n.hi});
      return it == nodes.end() ? nullptr : it->second.data();
    }, combined.data());
    EXPECT_EQ(std::memcmp(combined.data(), one.data(), sizeof(double) * width), 0) << cuts.size() - 1 << " parts";
  }
  // A row no node covers is named.
  EXPECT_THROW(mt::cpu::row_tree_combine(0, rows, width, [](mt::cpu::RowNode) -> const double* { return nullptr; },
                                         one.data()),
               mt::Error);
}

TEST(AdafactorShards, EveryRankCountGivesTheBitsOfTheStepAlone) {
  for (const bool first_moment : {false, true}) {
    const Outcome want = run_alone(first_moment, -1, 0);
    for (int ranks = 1; ranks <= 4; ++ranks)
      expect_same_bits(run_sharded(ranks, first_moment, -1, 0), want,
                       std::to_string(ranks) + " ranks" + (first_moment ? ", first moment" : ""));
  }
}

TEST(AdafactorShards, ANanInOneRanksRowsSkipsTheParameterOnEveryRank) {
  const Outcome want = run_alone(false, 2, 45);
  ASSERT_EQ(want.skipped, (std::vector<std::int64_t>{0, 0, 1, 0, 0}));
  for (int ranks = 2; ranks <= 4; ++ranks)
    expect_same_bits(run_sharded(ranks, false, 2, 45), want, std::to_string(ranks) + " ranks, NaN");
}

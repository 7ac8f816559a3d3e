// The contract's adafactor_step on the CPU (moved from optim/adafactor.cpp, whose class keeps the state and
// the step count): statistics accumulate in double (row means left to right; column means and the update's
// RMS over the rows in the fixed tree of cpu/row_tree.h, so a ZeRO run over row shards gets the same bits),
// elementwise work in float on raw pointers. The step never holds a parameter-sized buffer: the update u is
// computed a block at a time, twice (once for its RMS, once to apply it), the same bits each time; a gradient
// that is not f32 is widened a block of rows at a time; a bf16 parameter (no f32 master) is widened, stepped and
// rounded back a slice at a time. The blocks are tensors on the parameter's device, so meta accounts them too.
#include "cpu/adafactor_rows.h"
#include "cpu/convert.h"
#include "cpu/cpu_backend.h"
#include "cpu/row_tree.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace memtrain::cpu {
namespace adafactor {
namespace {

constexpr std::int64_t kParallelElements = 32768;
constexpr std::int64_t kColumnChunk = 256;  // columns per thread's tree (each column's sum is independent)

}  // namespace

void update_row_stats(const float* g, float* R, std::int64_t rows, std::int64_t cols, double beta2t, double eps1) {
#pragma omp parallel for if (rows * cols > kParallelElements)
  for (std::int64_t i = 0; i < rows; ++i) {
    double acc = 0.0;
    for (std::int64_t j = 0; j < cols; ++j) acc += static_cast<double>(g[i * cols + j]) * g[i * cols + j] + eps1;
    R[i] = static_cast<float>(beta2t * R[i] + (1.0 - beta2t) * (acc / cols));
  }
}

void column_sums_of_rows(std::int64_t rows, std::int64_t cols, double eps1, const RowReader& row, double* out) {
  const std::int64_t chunks = (cols + kColumnChunk - 1) / kColumnChunk;
#pragma omp parallel for if (rows * cols > kParallelElements)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t c0 = c * kColumnChunk, c1 = std::min(cols, c0 + kColumnChunk);
    float scratch[kColumnChunk];
    row_tree_sum(0, rows, c1 - c0,
                 [&](std::int64_t i, double* leaf) {
                   const float* g = row(i, c0, c1, scratch);
                   for (std::int64_t j = 0; j < c1 - c0; ++j) leaf[j] = static_cast<double>(g[j]) * g[j] + eps1;
                 },
                 out + c0);
  }
}

void column_sums(const float* g, std::int64_t rows, std::int64_t cols, double eps1, double* out) {
  column_sums_of_rows(rows, cols, eps1, [g, cols](std::int64_t i, std::int64_t c0, std::int64_t, float*) {
    return g + i * cols + c0;
  }, out);
}

void update_col_stats(const double* col_sum, float* C, std::int64_t cols, std::int64_t rows_of_batch, double beta2t) {
  for (std::int64_t j = 0; j < cols; ++j)
    C[j] = static_cast<float>(beta2t * C[j] + (1.0 - beta2t) * (col_sum[j] / rows_of_batch));
}

double row_stats_total(const float* R, std::int64_t rows_of_batch) {
  double total = 0.0;
  for (std::int64_t i = 0; i < rows_of_batch; ++i) total += R[i];
  return total;
}

void factored_update_columns(const float* g, float R_i, const float* C, double r_mean, std::int64_t j0,
                             std::int64_t j1, float* u) {
  const float r_factor = static_cast<float>(1.0 / std::sqrt(R_i / r_mean));
  for (std::int64_t j = j0; j < j1; ++j) u[j - j0] = g[j - j0] * r_factor / std::sqrt(C[j]);
}

void factored_update(const float* g, const float* R, const float* C, double r_mean, float* u, std::int64_t rows,
                     std::int64_t cols) {
#pragma omp parallel for if (rows * cols > kParallelElements)
  for (std::int64_t i = 0; i < rows; ++i) factored_update_columns(g + i * cols, R[i], C, r_mean, 0, cols, u + i * cols);
}

void update_vector_stats(const float* g, float* V, std::int64_t n, double beta2t, double eps1) {
#pragma omp parallel for if (n > kParallelElements)
  for (std::int64_t i = 0; i < n; ++i)
    V[i] = static_cast<float>(beta2t * V[i] + (1.0 - beta2t) * (static_cast<double>(g[i]) * g[i] + eps1));
}

void vector_update(const float* g, const float* V, float* u, std::int64_t n) {
#pragma omp parallel for if (n > kParallelElements)
  for (std::int64_t i = 0; i < n; ++i) u[i] = g[i] / std::sqrt(V[i]);
}

void row_squares(const float* u, std::int64_t rows, std::int64_t cols, double* out) {
#pragma omp parallel for if (rows * cols > kParallelElements)
  for (std::int64_t i = 0; i < rows; ++i) {
    double acc = 0.0;
    for (std::int64_t j = 0; j < cols; ++j) acc += static_cast<double>(u[i * cols + j]) * u[i * cols + j];
    out[i] = acc;
  }
}

float clipped_scale(double sum_sq, std::int64_t numel, double lr, double clip_threshold) {
  const double rms = numel > 0 ? std::sqrt(sum_sq / numel) : 0.0;
  return static_cast<float>(lr / std::max(1.0, rms / clip_threshold));
}

void apply(float* p, const float* u, float* M, std::int64_t n, float scale, double lr, double weight_decay,
           double beta1) {
  const float decay = static_cast<float>(1.0 - weight_decay * lr);
  if (M != nullptr) {
    const float b1 = static_cast<float>(beta1), one_minus_b1 = static_cast<float>(1.0 - beta1);
#pragma omp parallel for simd if (n > kParallelElements)
    for (std::int64_t i = 0; i < n; ++i) {
      M[i] = b1 * M[i] + one_minus_b1 * (u[i] * scale);
      p[i] = p[i] * decay - M[i];
    }
  } else {
#pragma omp parallel for simd if (n > kParallelElements)
    for (std::int64_t i = 0; i < n; ++i) p[i] = p[i] * decay - u[i] * scale;
  }
}

}  // namespace adafactor

namespace {

namespace af = adafactor;

constexpr std::int64_t kBlockElements = std::int64_t{1} << 20;  // 4 MiB of f32 per working buffer

// One step's arithmetic over a parameter seen as rows x cols (adafactor_rows.h): the statistics from the
// gradient, the clip scale, and the update u of any range of the flattened parameter. The gradient is read a
// block of rows at a time, widened into `g_block_` when it is not f32.
class Step {
 public:
  Step(const Tensor& param, const Tensor& grad, const Tensor& row, const Tensor& col, const Tensor& exp_avg_sq,
       double decay_rate, double eps1, std::int64_t step)
      : grad_(grad.contiguous()), row_(row), col_(col), exp_avg_sq_(exp_avg_sq), eps1_(eps1),
        beta2t_(1.0 - std::pow(static_cast<double>(step), decay_rate)), n_(param.numel()) {
    const Shape& s = param.shape();
    if (row.defined()) {
      m_ = s[s.size() - 2];
      cols_ = s.back();
      rows_ = cols_ == 0 ? 0 : n_ / cols_;
    } else {
      m_ = rows_ = n_;
      cols_ = 1;
    }
    rows_per_block_ = std::max<std::int64_t>(1, kBlockElements / std::max<std::int64_t>(cols_, 1));
    if (grad_.dtype() != DType::f32)
      g_block_ = Tensor::empty({std::min(n_, rows_per_block_ * cols_)}, DType::f32, param.device());
  }

  // R and C per batch of m rows (factored), or V (unfactored), from the gradient.
  void update_statistics() {
    if (!row_.defined()) {
      for_row_blocks(0, rows_, [&](std::int64_t a, std::int64_t b, const float* g) {
        af::update_vector_stats(g, exp_avg_sq_.data<float>() + a, b - a, beta2t_, eps1_);
      });
      return;
    }
    float* R = row_.data<float>();
    float* C = col_.data<float>();
    std::vector<double> col_sum(static_cast<std::size_t>(cols_));
    for (std::int64_t batch = 0; batch < rows_ / m_; ++batch) {
      const std::int64_t lo = batch * m_, hi = lo + m_;
      for_row_blocks(lo, hi, [&](std::int64_t a, std::int64_t b, const float* g) {
        af::update_row_stats(g, R + a, b - a, cols_, beta2t_, eps1_);
      });
      column_sums(lo, hi, col_sum.data());
      af::update_col_stats(col_sum.data(), C + batch * cols_, cols_, m_, beta2t_);
      r_means_.push_back(af::row_stats_total(R + lo, m_) / m_);
    }
  }

  // lr / max(1, rms(u) / clip): u a block at a time into `u_block`, its rows' squares summed over the fixed tree.
  float clip_scale(const Tensor& u_block, double lr, double clip_threshold) {
    std::vector<double> squares(static_cast<std::size_t>(rows_));
    for_row_blocks(0, rows_, [&](std::int64_t a, std::int64_t b, const float* g) {
      float* u = u_block.data<float>();
      update_of(a * cols_, b * cols_, g, u);
      af::row_squares(u, b - a, cols_, squares.data() + a);
    });
    double sum_sq = 0.0;
    if (rows_ > 0)
      row_tree_sum(0, rows_, 1, [&](std::int64_t i, double* leaf) { *leaf = squares[static_cast<std::size_t>(i)]; },
                   &sum_sq);
    return af::clipped_scale(sum_sq, n_, lr, clip_threshold);
  }

  // u over elements [e0, e1) of the flattened parameter into u, reading the gradient's same elements (widened
  // into u first when it is not f32).
  void update_range(std::int64_t e0, std::int64_t e1, float* u) const {
    const float* g = grad_.dtype() == DType::f32 ? grad_.data<float>() + e0 : nullptr;
    if (g == nullptr) {
      convert(static_cast<const char*>(grad_.data_ptr()) + e0 * static_cast<std::int64_t>(grad_.element_size()),
              grad_.dtype(), u, DType::f32, static_cast<std::size_t>(e1 - e0));
      g = u;
    }
    update_of(e0, e1, g, u);
  }

  std::int64_t numel() const { return n_; }
  std::int64_t block_elements() const { return std::min(n_, rows_per_block_ * cols_); }

 private:
  // fn(a, b, g) for rows [a, b) of [lo, hi) a block at a time, g the block's gradient as floats.
  template <typename Fn>
  void for_row_blocks(std::int64_t lo, std::int64_t hi, Fn&& fn) {
    for (std::int64_t a = lo; a < hi; a += rows_per_block_) {
      const std::int64_t b = std::min(hi, a + rows_per_block_);
      fn(a, b, rows_as_f32(a, b));
    }
  }

  const float* rows_as_f32(std::int64_t a, std::int64_t b) {
    if (grad_.dtype() == DType::f32) return grad_.data<float>() + a * cols_;
    float* out = g_block_.data<float>();
    convert(static_cast<const char*>(grad_.data_ptr()) + a * cols_ * static_cast<std::int64_t>(grad_.element_size()),
            grad_.dtype(), out, DType::f32, static_cast<std::size_t>((b - a) * cols_));
    return out;
  }

  // Column sums of rows [lo, hi) over the fixed row tree, each leaf row read (and widened) on its own.
  void column_sums(std::int64_t lo, std::int64_t hi, double* out) const {
    if (grad_.dtype() == DType::f32) {
      af::column_sums(grad_.data<float>() + lo * cols_, hi - lo, cols_, eps1_, out);
      return;
    }
    af::column_sums_of_rows(
        hi - lo, cols_, eps1_,
        [&](std::int64_t i, std::int64_t c0, std::int64_t c1, float* scratch) {
          convert(static_cast<const char*>(grad_.data_ptr()) +
                      ((lo + i) * cols_ + c0) * static_cast<std::int64_t>(grad_.element_size()),
                  grad_.dtype(), scratch, DType::f32, static_cast<std::size_t>(c1 - c0));
          return static_cast<const float*>(scratch);
        },
        out);
  }

  // u over elements [e0, e1), g the gradient at e0 (u may be g).
  void update_of(std::int64_t e0, std::int64_t e1, const float* g, float* u) const {
    if (!row_.defined()) {
      af::vector_update(g, exp_avg_sq_.data<float>() + e0, u, e1 - e0);
      return;
    }
    const float* R = row_.data<float>();
    const float* C = col_.data<float>();
    // Row by row; only the range's first and last rows may be partial.
    const std::int64_t i0 = e0 / cols_, i1 = (e1 + cols_ - 1) / cols_;
#pragma omp parallel for if (e1 - e0 > af::kParallelElements)
    for (std::int64_t i = i0; i < i1; ++i) {
      const std::int64_t j0 = std::max(e0, i * cols_) - i * cols_, j1 = std::min(e1, (i + 1) * cols_) - i * cols_;
      const std::int64_t at = i * cols_ + j0 - e0, batch = i / m_;
      af::factored_update_columns(g + at, R[i], C + batch * cols_, r_means_[static_cast<std::size_t>(batch)], j0, j1,
                                  u + at);
    }
  }

  Tensor grad_, row_, col_, exp_avg_sq_, g_block_;
  double eps1_, beta2t_;
  std::int64_t n_, m_ = 0, rows_ = 0, cols_ = 1, rows_per_block_ = 1;
  std::vector<double> r_means_;  // per batch: the mean of its rows' statistics
};

}  // namespace

void CpuBackend::adafactor_step(const Tensor& param, const Tensor& grad, const Tensor& row, const Tensor& col,
                                const Tensor& exp_avg_sq, const Tensor& exp_avg, double lr, double weight_decay,
                                double beta1, double decay_rate, double eps1, double clip_threshold,
                                std::int64_t step) const {
  Step s(param, grad, row, col, exp_avg_sq, decay_rate, eps1, step);
  // The update, a block at a time, in the caller's category (the optimizer's update runs under workspace).
  const Tensor u_block = Tensor::empty({s.block_elements()}, DType::f32, param.device());
  if (!runs_kernels() || param.numel() == 0) return;
  s.update_statistics();
  const float scale = s.clip_scale(u_block, lr, clip_threshold);
  float* u = u_block.data<float>();
  float* p = param.data<float>();
  float* M = data_or_null<float>(exp_avg);
  for (std::int64_t a = 0; a < s.numel(); a += s.block_elements()) {
    const std::int64_t b = std::min(s.numel(), a + s.block_elements());
    s.update_range(a, b, u);
    af::apply(p + a, u, M == nullptr ? nullptr : M + a, b - a, scale, lr, weight_decay, beta1);
  }
}

void CpuBackend::adafactor_step_bf16(const Tensor& param, const Tensor& grad, const Tensor& row, const Tensor& col,
                                     const Tensor& exp_avg_sq, const Tensor& exp_avg, double lr, double weight_decay,
                                     double beta1, double decay_rate, double eps1, double clip_threshold,
                                     std::int64_t step, const Tensor& compensation, std::uint64_t seed,
                                     std::uint64_t stream, std::int64_t slice_elements) const {
  MT_CHECK(param.dtype() == DType::bf16 && param.is_contiguous(), "adafactor_step_bf16",
           "param must be contiguous bf16, got {} {}", dtype_name(param.dtype()), shape_str(param.shape()));
  MT_CHECK(slice_elements > 0, "adafactor_step_bf16", "slice_elements must be positive, got {}", slice_elements);
  Step s(param, grad, row, col, exp_avg_sq, decay_rate, eps1, step);
  const std::int64_t n = s.numel();
  // Slices start on whole Philox blocks (8 elements) of the rounding: the bits do not depend on the slicing.
  const std::int64_t slice = std::min(n, std::max<std::int64_t>(8, slice_elements / 8 * 8));
  const Tensor u_block = Tensor::empty({std::max(s.block_elements(), slice)}, DType::f32, param.device());
  const Tensor wide = Tensor::empty({slice}, DType::f32, param.device());  // a slice of the parameter in f32
  if (!runs_kernels() || n == 0) return;
  s.update_statistics();
  const float scale = s.clip_scale(u_block, lr, clip_threshold);
  const Tensor flat = param.view({n});
  const Tensor comp = compensation.defined() ? compensation.view({n}) : Tensor();
  float* u = u_block.data<float>();
  float* M = data_or_null<float>(exp_avg);
  for (std::int64_t a = 0; a < n; a += slice) {
    const std::int64_t len = std::min(slice, n - a);
    const Tensor kept = flat.narrow(0, a, len), kept_comp = comp.defined() ? comp.narrow(0, a, len) : Tensor();
    const Tensor value = wide.narrow(0, 0, len);
    float* p = value.data<float>();
    convert(kept.data_ptr(), DType::bf16, p, DType::f32, static_cast<std::size_t>(len));
    if (kept_comp.defined()) {
      // value + compensation, as Optimizer's f32 copy of a Kahan parameter adds them.
      float c[1024];
      const auto* comp_bits = static_cast<const char*>(kept_comp.data_ptr());
      for (std::int64_t i = 0; i < len; i += 1024) {
        const std::int64_t k = std::min<std::int64_t>(1024, len - i);
        convert(comp_bits + i * 2, DType::bf16, c, DType::f32, static_cast<std::size_t>(k));
        for (std::int64_t t = 0; t < k; ++t) p[i + t] += c[t];
      }
    }
    s.update_range(a, a + len, u);
    af::apply(p, u, M == nullptr ? nullptr : M + a, len, scale, lr, weight_decay, beta1);
    round_into_bf16(kept, value, kept_comp, seed, stream, static_cast<std::uint64_t>(a));
  }
}

}  // namespace memtrain::cpu

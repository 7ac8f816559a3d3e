// The contract's adafactor_step on the CPU (moved from optim/adafactor.cpp, whose class keeps the state and
// the step count): statistics accumulate in double (row means left to right; column means and the update's
// RMS over the rows in the fixed tree of cpu/row_tree.h, so a ZeRO run over row shards gets the same bits),
// elementwise work in float on raw pointers. The update u is built in one workspace buffer of the parameter's
// size, allocated on the parameter's device so that meta accounts it too.
#include "cpu/adafactor_rows.h"
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

void column_leaf(const float* g_row, std::int64_t c0, std::int64_t c1, double eps1, double* out) {
  for (std::int64_t j = c0; j < c1; ++j) out[j - c0] = static_cast<double>(g_row[j]) * g_row[j] + eps1;
}

void column_sums(const float* g, std::int64_t rows, std::int64_t cols, double eps1, double* out) {
  const std::int64_t chunks = (cols + kColumnChunk - 1) / kColumnChunk;
#pragma omp parallel for if (rows * cols > kParallelElements)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t c0 = c * kColumnChunk, c1 = std::min(cols, c0 + kColumnChunk);
    row_tree_sum(0, rows, c1 - c0, [&](std::int64_t i, double* leaf) { column_leaf(g + i * cols, c0, c1, eps1, leaf); },
                 out + c0);
  }
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

void factored_update(const float* g, const float* R, const float* C, double r_mean, float* u, std::int64_t rows,
                     std::int64_t cols) {
#pragma omp parallel for if (rows * cols > kParallelElements)
  for (std::int64_t i = 0; i < rows; ++i) {
    const float r_factor = static_cast<float>(1.0 / std::sqrt(R[i] / r_mean));
    for (std::int64_t j = 0; j < cols; ++j) u[i * cols + j] = g[i * cols + j] * r_factor / std::sqrt(C[j]);
  }
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

void CpuBackend::adafactor_step(const Tensor& param, const Tensor& grad, const Tensor& row, const Tensor& col,
                                const Tensor& exp_avg_sq, const Tensor& exp_avg, double lr, double weight_decay,
                                double beta1, double decay_rate, double eps1, double clip_threshold,
                                std::int64_t step) const {
  namespace af = adafactor;
  const Tensor g32 = grad.to(DType::f32).contiguous();
  // The update u, in the caller's category (the optimizer's update runs under workspace).
  const Tensor u_buf = Tensor::empty(param.shape(), DType::f32, param.device());
  if (!runs_kernels()) return;
  const float* g = g32.data<float>();
  float* u = u_buf.data<float>();
  const std::int64_t n_all = param.numel();
  if (n_all == 0) return;
  const double beta2t = 1.0 - std::pow(static_cast<double>(step), decay_rate);
  const Shape& s = param.shape();
  std::int64_t rows = n_all, cols = 1;
  if (row.defined()) {
    const std::int64_t m = s[s.size() - 2];
    cols = s.back();
    rows = n_all / cols;
    float* R = row.data<float>();
    float* C = col.data<float>();
    std::vector<double> col_sum(static_cast<std::size_t>(cols));
    for (std::int64_t b = 0; b < rows / m; ++b) {
      const float* gb = g + b * m * cols;
      af::update_row_stats(gb, R + b * m, m, cols, beta2t, eps1);
      af::column_sums(gb, m, cols, eps1, col_sum.data());
      af::update_col_stats(col_sum.data(), C + b * cols, cols, m, beta2t);
      af::factored_update(gb, R + b * m, C + b * cols, af::row_stats_total(R + b * m, m) / m, u + b * m * cols, m,
                          cols);
    }
  } else {
    af::update_vector_stats(g, exp_avg_sq.data<float>(), n_all, beta2t, eps1);
    af::vector_update(g, exp_avg_sq.data<float>(), u, n_all);
  }
  std::vector<double> squares(static_cast<std::size_t>(rows));
  af::row_squares(u, rows, cols, squares.data());
  double sum_sq = 0.0;
  row_tree_sum(0, rows, 1, [&](std::int64_t i, double* leaf) { *leaf = squares[static_cast<std::size_t>(i)]; }, &sum_sq);
  af::apply(param.data<float>(), u, data_or_null<float>(exp_avg), n_all,
            af::clipped_scale(sum_sq, n_all, lr, clip_threshold), lr, weight_decay, beta1);
}

}  // namespace memtrain::cpu

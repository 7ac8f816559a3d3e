// The contract's adafactor_step on the CPU (moved from optim/adafactor.cpp, whose class keeps the state and
// the step count): statistics accumulate in double (row/column means, the update RMS), elementwise work in
// float on raw pointers. The update u is built in one workspace buffer of the parameter's size, allocated
// on the parameter's device so that meta accounts it too.
#include "cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace memtrain::cpu {
namespace {

// R [batch, rows], C [batch, cols] <- their running means of g^2 + eps1; u = g / sqrt(R C / mean(R)).
void adafactor_factored(const float* g, float* u, float* R, float* C, std::int64_t batch, std::int64_t rows,
                        std::int64_t cols, double beta2t, double eps1) {
  for (std::int64_t b = 0; b < batch; ++b) {
    const float* gb = g + b * rows * cols;
    float* ub = u + b * rows * cols;
    float* Rb = R + b * rows;
    float* Cb = C + b * cols;
    double r_total = 0.0;
#pragma omp parallel for reduction(+ : r_total) if (rows * cols > 32768)
    for (std::int64_t i = 0; i < rows; ++i) {
      double acc = 0.0;
      for (std::int64_t j = 0; j < cols; ++j) acc += static_cast<double>(gb[i * cols + j]) * gb[i * cols + j] + eps1;
      Rb[i] = static_cast<float>(beta2t * Rb[i] + (1.0 - beta2t) * (acc / cols));
      r_total += Rb[i];
    }
    std::vector<double> col_acc(cols, 0.0);
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) col_acc[j] += static_cast<double>(gb[i * cols + j]) * gb[i * cols + j] + eps1;
    for (std::int64_t j = 0; j < cols; ++j)
      Cb[j] = static_cast<float>(beta2t * Cb[j] + (1.0 - beta2t) * (col_acc[j] / rows));
    const double r_mean = r_total / rows;
#pragma omp parallel for if (rows * cols > 32768)
    for (std::int64_t i = 0; i < rows; ++i) {
      const float r_factor = static_cast<float>(1.0 / std::sqrt(Rb[i] / r_mean));
      for (std::int64_t j = 0; j < cols; ++j) ub[i * cols + j] = gb[i * cols + j] * r_factor / std::sqrt(Cb[j]);
    }
  }
}

// V [n] <- its running mean of g^2 + eps1; u = g / sqrt(V).
void adafactor_vector(const float* g, float* u, float* V, std::int64_t n_all, double beta2t, double eps1) {
#pragma omp parallel for if (n_all > 32768)
  for (std::int64_t i = 0; i < n_all; ++i) {
    V[i] = static_cast<float>(beta2t * V[i] + (1.0 - beta2t) * (static_cast<double>(g[i]) * g[i] + eps1));
    u[i] = g[i] / std::sqrt(V[i]);
  }
}

// Clips u by its RMS, then p = p (1 - wd lr) - (first moment of) u * lr / max(1, rms / clip).
void adafactor_apply(float* p, const float* u, float* M, std::int64_t n_all, double lr, double weight_decay,
                     double beta1, double clip_threshold) {
  double sum_sq = 0.0;
#pragma omp parallel for reduction(+ : sum_sq) if (n_all > 32768)
  for (std::int64_t i = 0; i < n_all; ++i) sum_sq += static_cast<double>(u[i]) * u[i];
  const double rms = n_all > 0 ? std::sqrt(sum_sq / n_all) : 0.0;
  const float scale = static_cast<float>(lr / std::max(1.0, rms / clip_threshold));
  const float decay = static_cast<float>(1.0 - weight_decay * lr);
  if (M != nullptr) {
    const float b1 = static_cast<float>(beta1), one_minus_b1 = static_cast<float>(1.0 - beta1);
#pragma omp parallel for simd if (n_all > 32768)
    for (std::int64_t i = 0; i < n_all; ++i) {
      M[i] = b1 * M[i] + one_minus_b1 * (u[i] * scale);
      p[i] = p[i] * decay - M[i];
    }
  } else {
#pragma omp parallel for simd if (n_all > 32768)
    for (std::int64_t i = 0; i < n_all; ++i) p[i] = p[i] * decay - u[i] * scale;
  }
}

}  // namespace

void CpuBackend::adafactor_step(const Tensor& param, const Tensor& grad, const Tensor& row, const Tensor& col,
                                const Tensor& exp_avg_sq, const Tensor& exp_avg, double lr, double weight_decay,
                                double beta1, double decay_rate, double eps1, double clip_threshold,
                                std::int64_t step) const {
  const Tensor g32 = grad.to(DType::f32).contiguous();
  // The update u, in the caller's category (the optimizer's update runs under workspace).
  const Tensor u_buf = Tensor::empty(param.shape(), DType::f32, param.device());
  if (!runs_kernels()) return;
  const float* g = g32.data<float>();
  float* u = u_buf.data<float>();
  const std::int64_t n_all = param.numel();
  const double beta2t = 1.0 - std::pow(static_cast<double>(step), decay_rate);
  const Shape& s = param.shape();
  if (row.defined()) {
    const std::int64_t rows = s[s.size() - 2], cols = s.back();
    const std::int64_t batch = rows * cols == 0 ? 0 : n_all / (rows * cols);
    adafactor_factored(g, u, row.data<float>(), col.data<float>(), batch, rows, cols, beta2t, eps1);
  } else {
    adafactor_vector(g, u, exp_avg_sq.data<float>(), n_all, beta2t, eps1);
  }
  adafactor_apply(param.data<float>(), u, data_or_null<float>(exp_avg), n_all, lr, weight_decay, beta1,
                  clip_threshold);
}

}  // namespace memtrain::cpu

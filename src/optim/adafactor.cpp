// Adafactor: statistics accumulate in double (row/column means, the update RMS), elementwise work in
// float on raw pointers. The update u is built in one workspace buffer of the parameter's size. Parameters on
// a CUDA device run the same rule through cuda::adafactor_*_step (deterministic device reductions), with
// their state on the device.
#include "memtrain/optim/adafactor.h"

#include "memtrain/cuda/optim.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace memtrain::optim {

Adafactor::Adafactor(std::vector<ParamGroup> groups, AdafactorOptions options)
    : Optimizer(std::move(groups)), options_(options) {
  MT_CHECK(options_.decay_rate < 0.0, "Adafactor", "decay_rate must be negative, got {}", options_.decay_rate);
  MT_CHECK(options_.clip_threshold > 0.0, "Adafactor", "clip_threshold must be positive, got {}",
           options_.clip_threshold);
  MT_CHECK(options_.eps1 >= 0.0, "Adafactor", "eps1 must be >= 0, got {}", options_.eps1);
  if (options_.use_first_moment) {
    for (std::size_t g = 0; g < param_groups().size(); ++g) {
      const double b1 = param_groups()[g].beta1;
      MT_CHECK(b1 >= 0.0 && b1 < 1.0, "Adafactor", "group {}: beta1 must lie in [0, 1), got {}", g, b1);
    }
  }
}

void Adafactor::init_state(const Tensor& param, const ParamGroup&, ParamState& state) {
  check_f32_contiguous(param, "Adafactor", /*cuda_ok=*/true);
  // Its step is not behind the backend contract yet, so it has no meta (dry-run) step.
  MT_CHECK(!param.device().is_meta(), "Adafactor", "has no step on meta yet (AdamW, SGD and Lion do)");
  const Shape& s = param.shape();
  const Device device = param.device();
  if (s.size() >= 2) {
    Shape row(s.begin(), s.end() - 1);  // [..., m]
    Shape col(s.begin(), s.end() - 2);  // [..., n]
    col.push_back(s.back());
    state.tensors["exp_avg_sq_row"] = zeros(row, DType::f32, device);
    state.tensors["exp_avg_sq_col"] = zeros(col, DType::f32, device);
  } else {
    state.tensors["exp_avg_sq"] = zeros(s, DType::f32, device);
  }
  if (options_.use_first_moment) state.tensors["exp_avg"] = zeros(s, DType::f32, device);
}

void Adafactor::update_cuda(Tensor& param, const Tensor& g32, const ParamGroup& group, ParamState& state) {
  const cuda::AdafactorHyper hyper{group.lr,       group.weight_decay,     group.beta1, options_.decay_rate,
                                   options_.eps1,  options_.clip_threshold, state.step};
  const Shape& s = param.shape();
  const auto n = static_cast<std::size_t>(param.numel());
  float* m = options_.use_first_moment ? state.tensors.at("exp_avg").data<float>() : nullptr;
  const int device = param.device().index;
  std::int64_t batch = 0, rows = 0, cols = 0;
  if (s.size() >= 2) {
    rows = s[s.size() - 2];
    cols = s.back();
    batch = rows * cols == 0 ? 0 : param.numel() / (rows * cols);
  }
  // Scratch for the update u and the reductions' partial sums; update() runs under the workspace category.
  const std::size_t ws_bytes = cuda::adafactor_workspace_bytes(n, batch, rows, cols);
  Tensor workspace = Tensor::empty({static_cast<std::int64_t>(ws_bytes)}, DType::u8, param.device());
  if (s.size() >= 2) {
    cuda::adafactor_factored_step(param.data<float>(), g32.data<float>(),
                                  state.tensors.at("exp_avg_sq_row").data<float>(),
                                  state.tensors.at("exp_avg_sq_col").data<float>(), m, batch, rows, cols, hyper,
                                  workspace.data<std::uint8_t>(), device);
  } else {
    cuda::adafactor_vector_step(param.data<float>(), g32.data<float>(), state.tensors.at("exp_avg_sq").data<float>(),
                                m, n, hyper, workspace.data<std::uint8_t>(), device);
  }
}

void Adafactor::update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) {
  if (param.device().is_cuda()) {
    update_cuda(param, grad_f32(grad, param.device()), group, state);
    return;
  }
  const Tensor g32 = grad_f32(grad);
  const float* g = g32.data<float>();
  float* p = param.data<float>();
  const std::int64_t n_all = param.numel();
  Tensor u_buf = Tensor::empty(param.shape(), DType::f32);  // workspace (update() runs under that category)
  float* u = u_buf.data<float>();

  const double beta2t = 1.0 - std::pow(static_cast<double>(state.step), options_.decay_rate);
  const double eps1 = options_.eps1;
  const Shape& s = param.shape();
  if (s.size() >= 2) {
    const std::int64_t rows = s[s.size() - 2], cols = s.back();
    const std::int64_t batch = rows * cols == 0 ? 0 : n_all / (rows * cols);
    float* R = state.tensors.at("exp_avg_sq_row").data<float>();
    float* C = state.tensors.at("exp_avg_sq_col").data<float>();
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
  } else {
    float* V = state.tensors.at("exp_avg_sq").data<float>();
#pragma omp parallel for if (n_all > 32768)
    for (std::int64_t i = 0; i < n_all; ++i) {
      V[i] = static_cast<float>(beta2t * V[i] + (1.0 - beta2t) * (static_cast<double>(g[i]) * g[i] + eps1));
      u[i] = g[i] / std::sqrt(V[i]);
    }
  }

  double sum_sq = 0.0;
#pragma omp parallel for reduction(+ : sum_sq) if (n_all > 32768)
  for (std::int64_t i = 0; i < n_all; ++i) sum_sq += static_cast<double>(u[i]) * u[i];
  const double rms = n_all > 0 ? std::sqrt(sum_sq / n_all) : 0.0;
  const float scale = static_cast<float>(group.lr / std::max(1.0, rms / options_.clip_threshold));
  const float decay = static_cast<float>(1.0 - group.weight_decay * group.lr);
  if (options_.use_first_moment) {
    float* M = state.tensors.at("exp_avg").data<float>();
    const float b1 = static_cast<float>(group.beta1), one_minus_b1 = static_cast<float>(1.0 - group.beta1);
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

}  // namespace memtrain::optim

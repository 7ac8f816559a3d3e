// Adafactor on CUDA, host side (src/cuda/optim.h): argument checks, beta2_t and the f32
// coefficients computed as optim::Adafactor computes them, the caller's workspace split into the kernels'
// scratch, and the five launches of kernels/adafactor.cuh on the current stream.
#include "cuda/optim.h"

#include "cuda/cuda_common.h"
#include "kernels/adafactor.cuh"
#include "memtrain/core/error.h"

#include <cmath>

namespace memtrain::cuda {
namespace {

// Where this file's launches go: the current stream of the current device (src/cuda/stream.h);
// every entry point calls it under its DeviceGuard, so that is the entry point's device.
cudaStream_t launch_stream() { return detail::current_stream(); }
constexpr std::size_t kAlign = 256;

std::size_t align_up(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Offsets of the scratch arrays inside the workspace; `total` is what adafactor_workspace_bytes reports.
struct Layout {
  std::size_t u = 0, sumsq = 0, r_mean = 0, col_partial = 0, scale = 0, total = 0;
};

Layout layout_for(std::size_t n, std::int64_t batch, std::int64_t rows, std::int64_t cols) {
  Layout l;
  std::size_t at = 0;
  l.u = at;
  at += align_up(n * sizeof(float));
  l.sumsq = at;
  at += align_up(static_cast<std::size_t>(adafactor_sumsq_blocks(n)) * sizeof(double));
  l.r_mean = at;
  at += align_up(static_cast<std::size_t>(batch) * sizeof(double));
  l.col_partial = at;
  at += align_up(static_cast<std::size_t>(batch * adafactor_col_chunks(rows) * cols) * sizeof(double));
  l.scale = at;
  at += align_up(sizeof(float));
  l.total = at;
  return l;
}

template <typename T>
T* at_offset(void* base, std::size_t offset) {
  return static_cast<T*>(static_cast<void*>(static_cast<char*>(base) + offset));
}

void check_hyper(const char* op, const AdafactorHyper& h, bool first_moment) {
  MT_CHECK(h.decay_rate < 0.0, op, "decay_rate must be negative, got {}", h.decay_rate);
  MT_CHECK(h.clip_threshold > 0.0, op, "clip_threshold must be positive, got {}", h.clip_threshold);
  MT_CHECK(h.eps1 >= 0.0, op, "eps1 must be >= 0, got {}", h.eps1);
  MT_CHECK(h.step >= 1, op, "step must be >= 1 (1-based, for beta2_t), got {}", h.step);
  MT_CHECK(!first_moment || (h.beta1 >= 0.0 && h.beta1 < 1.0), op, "beta1 must lie in [0, 1), got {}", h.beta1);
}

// As optim::Adafactor::update.
double beta2t_of(const AdafactorHyper& h) { return 1.0 - std::pow(static_cast<double>(h.step), h.decay_rate); }

// Launches the shared tail (scale, apply) and checks both launches.
void scale_and_apply(const char* op, float* param, float* exp_avg, std::size_t n, const AdafactorHyper& h,
                     void* workspace, const Layout& l) {
  float* u = at_offset<float>(workspace, l.u);
  float* scale = at_offset<float>(workspace, l.scale);
  MT_CUDA_CHECK(op, launch_adafactor_scale, u, n, at_offset<double>(workspace, l.sumsq), scale, h.lr,
                h.clip_threshold, launch_stream());
  const auto decay = static_cast<float>(1.0 - h.weight_decay * h.lr);
  const auto b1 = static_cast<float>(h.beta1), one_minus_b1 = static_cast<float>(1.0 - h.beta1);
  MT_CUDA_CHECK(op, launch_adafactor_apply, param, u, exp_avg, n, scale, decay, b1, one_minus_b1, launch_stream());
}

}  // namespace

std::size_t adafactor_workspace_bytes(std::size_t n, std::int64_t batch, std::int64_t rows, std::int64_t cols) {
  MT_CHECK(batch >= 0 && rows >= 0 && cols >= 0, "cuda::adafactor_workspace_bytes",
           "negative size batch={} rows={} cols={}", batch, rows, cols);
  return layout_for(n, batch, rows, cols).total;
}

void adafactor_factored_step(float* param, const float* grad, float* row, float* col, float* exp_avg,
                             std::int64_t batch, std::int64_t rows, std::int64_t cols, const AdafactorHyper& h,
                             void* workspace, int device) {
  constexpr const char* op = "cuda::adafactor_factored_step";
  check_hyper(op, h, exp_avg != nullptr);
  MT_CHECK(batch >= 0 && rows >= 0 && cols >= 0, op, "negative size batch={} rows={} cols={}", batch, rows, cols);
  const auto n = static_cast<std::size_t>(batch * rows * cols);
  if (n == 0) return;
  MT_CHECK(param != nullptr && grad != nullptr && row != nullptr && col != nullptr && workspace != nullptr, op,
           "null pointer (param, grad, row, col or workspace) for a [{}, {}, {}] parameter", batch, rows, cols);
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  const Layout l = layout_for(n, batch, rows, cols);
  const double beta2t = beta2t_of(h);
  MT_CUDA_CHECK(op, launch_adafactor_factored_stats, grad, row, col, at_offset<double>(workspace, l.col_partial),
                batch, rows, cols, beta2t, h.eps1, launch_stream());
  MT_CUDA_CHECK(op, launch_adafactor_factored_update, grad, row, col, at_offset<double>(workspace, l.r_mean),
                at_offset<float>(workspace, l.u), batch, rows, cols, launch_stream());
  scale_and_apply(op, param, exp_avg, n, h, workspace, l);
}

void adafactor_vector_step(float* param, const float* grad, float* exp_avg_sq, float* exp_avg, std::size_t n,
                           const AdafactorHyper& h, void* workspace, int device) {
  constexpr const char* op = "cuda::adafactor_vector_step";
  check_hyper(op, h, exp_avg != nullptr);
  if (n == 0) return;
  MT_CHECK(param != nullptr && grad != nullptr && exp_avg_sq != nullptr && workspace != nullptr, op,
           "null pointer (param, grad, exp_avg_sq or workspace) for {} elements", n);
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  const Layout l = layout_for(n, 0, 0, 0);
  MT_CUDA_CHECK(op, launch_adafactor_vector_update, grad, exp_avg_sq, at_offset<float>(workspace, l.u), n,
                beta2t_of(h), h.eps1, launch_stream());
  scale_and_apply(op, param, exp_avg, n, h, workspace, l);
}

}  // namespace memtrain::cuda

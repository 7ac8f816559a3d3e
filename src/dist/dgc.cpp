// DgcSync: momentum correction, local clipping, top-k with error feedback, and the sparse exchange.
#include "memtrain/dist/dgc.h"

#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>

namespace memtrain::dist {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

DgcOptions dgc_options(const train::TrainerConfig& config) {
  const train::GradCompression c = train::parse_grad_compression(config.grad_compression);
  MT_CHECK(c.enabled(), "dist::dgc_options", "grad_compression is '{}': Deep Gradient Compression is off",
           config.grad_compression);
  return {.ratio = c.ratio, .momentum = c.momentum, .warmup_steps = c.warmup_steps, .clip_norm = config.grad_clip};
}

double dgc_sparsity(const DgcOptions& options, std::int64_t step) {
  // The paper's warm-up: the kept share divided by 4 each stage (25%, 6.25%, 1.5625%, 0.4%).
  static constexpr std::array<double, 4> kWarmup = {0.75, 0.9375, 0.984375, 0.996};
  if (step < options.warmup_steps) {
    const auto stage = static_cast<std::size_t>((step * 4) / options.warmup_steps);
    return std::min(kWarmup[std::min<std::size_t>(stage, 3)], options.ratio);
  }
  return options.ratio;
}

std::int64_t dgc_keep_count(std::int64_t numel, double sparsity) {
  if (numel <= 0) return 0;
  // (1 - 0.999) * 1000 is 1.0000000000000009 in doubles: a share meant to be whole must not round up past it.
  const double share = (1.0 - sparsity) * static_cast<double>(numel);
  const auto k = static_cast<std::int64_t>(std::ceil(share - 1e-9 * std::max(1.0, share)));
  return std::clamp<std::int64_t>(k, 1, numel);
}

void dgc_accumulate_and_select(const float* g, float* u, float* v, std::int64_t n, double momentum, float scale,
                               std::int64_t k, std::int64_t offset, std::vector<std::int32_t>& index,
                               std::vector<float>& value) {
  const auto m = static_cast<float>(momentum);
  for (std::int64_t i = 0; i < n; ++i) {
    u[i] = m * u[i] + (g != nullptr ? g[i] * scale : 0.0f);
    v[i] += u[i];
  }
  k = std::clamp<std::int64_t>(k, 0, n);
  if (k == 0) return;
  // The k largest |v|, ties to the lower index, so the choice is a function of v alone.
  std::vector<std::int32_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  const auto larger = [v](std::int32_t a, std::int32_t b) {
    const float fa = std::fabs(v[a]), fb = std::fabs(v[b]);
    return fa > fb || (fa == fb && a < b);
  };
  if (k < n) std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), larger);
  order.resize(static_cast<std::size_t>(k));
  std::sort(order.begin(), order.end());
  for (const std::int32_t i : order) {
    index.push_back(static_cast<std::int32_t>(offset + i));
    value.push_back(v[i]);
    u[i] = 0.0f;  // momentum factor masking: a sent value must not be sent again through its momentum
    v[i] = 0.0f;
  }
}

DgcSync::DgcSync(std::shared_ptr<Communicator> comm, DgcOptions options)
    : comm_(std::move(comm)), options_(options), dense_(comm_) {
  const char* where = "DgcSync";
  MT_CHECK(options_.ratio > 0.0 && options_.ratio < 1.0, where,
           "grad_compression ratio {} is outside (0, 1) (dgc:0.999 sends 0.1% of each tensor)", options_.ratio);
  MT_CHECK(options_.momentum >= 0.0 && options_.momentum < 1.0, where, "momentum {} is outside [0, 1)",
           options_.momentum);
  MT_CHECK(options_.warmup_steps >= 0, where, "warmup_steps {} is negative", options_.warmup_steps);
  MT_CHECK(options_.clip_norm >= 0.0, where, "clip_norm {} is negative", options_.clip_norm);
  MT_CHECK(comm_->device().is_cpu(), where, "the {} communicator sums on {}: Deep Gradient Compression selects and "
           "exchanges on the CPU only", comm_->backend(), comm_->device().str());
}

void DgcSync::begin_gradients(const std::vector<Tensor>& params, const std::vector<std::int64_t>& shard_align) {
  const char* where = "DgcSync::begin_gradients";
  for (const std::int64_t a : shard_align)
    MT_CHECK(a == 0, where, "sharded gradients (zero 2) with grad_compression: compression needs zero 0");
  bool same = params.size() == params_.size();
  for (std::size_t k = 0; same && k < params.size(); ++k) same = params[k].impl_ptr() == params_[k].impl_ptr();
  if (same) return;
  // Other parameters than last step's: their residuals start again.
  params_ = params;
  offset_.assign(params.size() + 1, 0);
  for (std::size_t k = 0; k < params.size(); ++k) {
    const Tensor& p = params[k];
    MT_CHECK(p.device().is_cpu() && p.dtype() == DType::f32, where,
             "parameter {} ({}) is {} on {}: grad_compression takes f32 parameters on the CPU", k,
             shape_str(p.shape()), dtype_name(p.dtype()), p.device().str());
    offset_[k + 1] = offset_[k] + p.numel();
  }
  MT_CHECK(offset_.back() <= std::numeric_limits<std::int32_t>::max(), where,
           "{} gradient elements: the sparse exchange's indices are 32-bit", offset_.back());
  u_.assign(params.size(), Tensor());
  v_.assign(params.size(), Tensor());
}

void DgcSync::gradient_ready(std::size_t index) {
  // Nothing to overlap: the top-k needs the step's whole gradient, and the exchange is one for all tensors.
  MT_CHECK(index < params_.size(), "DgcSync::gradient_ready", "parameter {} of {}", index, params_.size());
}

void DgcSync::set_landed(std::function<void(std::size_t, double)>) {
  MT_CHECK(false, "DgcSync", "layerwise_update with grad_compression: the sparse exchange needs every gradient of "
           "the step at once; turn one of them off");
}

void DgcSync::finish_gradients() {
  autograd::NoGradGuard no_grad;
  const auto t0 = std::chrono::steady_clock::now();
  const double sparsity = dgc_sparsity(options_, stats_.steps);
  std::vector<Tensor> grads(params_.size());
  for (std::size_t k = 0; k < params_.size(); ++k) {
    const Tensor g = params_[k].grad();
    if (g.defined()) grads[k] = g.dtype() == DType::f32 ? g.contiguous() : g.to(DType::f32).contiguous();
  }
  // Local clipping: this rank's gradient to at most clip_norm / sqrt(N), so the sum of N stays near clip_norm.
  float scale = 1.0f;
  if (options_.clip_norm > 0.0) {
    double squares = 0.0;
    for (const Tensor& g : grads) {
      if (!g.defined()) continue;
      const float* x = g.data<float>();
      for (std::int64_t i = 0; i < g.numel(); ++i) squares += static_cast<double>(x[i]) * x[i];
    }
    const double norm = std::sqrt(squares);
    const double limit = options_.clip_norm / std::sqrt(static_cast<double>(comm_->size()));
    if (norm > limit) scale = static_cast<float>(limit / norm);
  }
  std::vector<std::int32_t> index;
  std::vector<float> value;
  for (std::size_t k = 0; k < params_.size(); ++k) {
    const std::int64_t n = params_[k].numel();
    if (!u_[k].defined()) {  // kept from the first step to the end of the run, as an optimizer's moments
      CategoryGuard category(MemoryCategory::optimizer_state);
      u_[k] = zeros({n});
      v_[k] = zeros({n});
    }
    dgc_accumulate_and_select(grads[k].defined() ? grads[k].data<float>() : nullptr, u_[k].data<float>(),
                              v_[k].data<float>(), n, options_.momentum, scale, dgc_keep_count(n, sparsity),
                              offset_[k], index, value);
    grads[k] = Tensor();
    params_[k].set_grad(Tensor());
  }
  stats_.select_seconds += seconds_since(t0);

  const auto t1 = std::chrono::steady_clock::now();
  const auto pairs = static_cast<std::int64_t>(index.size());
  const std::vector<std::int64_t> counts = comm_->all_gather_i64({pairs});
  std::vector<std::int64_t> bounds(counts.size() + 1, 0);
  for (std::size_t q = 0; q < counts.size(); ++q) bounds[q + 1] = bounds[q] + counts[q];
  Tensor flat;
  {
    CategoryGuard category(MemoryCategory::workspace);
    const Tensor my_index = Tensor::empty({pairs}, DType::i32), my_value = Tensor::empty({pairs}, DType::f32);
    if (pairs > 0) {
      std::memcpy(my_index.data_ptr(), index.data(), index.size() * sizeof(std::int32_t));
      std::memcpy(my_value.data_ptr(), value.data(), value.size() * sizeof(float));
    }
    Tensor all_index = Tensor::empty({bounds.back()}, DType::i32);
    Tensor all_value = Tensor::empty({bounds.back()}, DType::f32);
    comm_->all_gather(my_index, bounds, all_index);
    comm_->all_gather(my_value, bounds, all_value);
    {
      CategoryGuard grads_category(MemoryCategory::gradients);
      flat = zeros({offset_.back()});
    }
    // Rank 0's pairs first, then rank 1's, ...: the same additions in the same order on every rank.
    float* sum = flat.data<float>();
    const std::int32_t* at = all_index.data<std::int32_t>();
    const float* x = all_value.data<float>();
    for (std::int64_t j = 0; j < bounds.back(); ++j) {
      MT_CHECK(at[j] >= 0 && at[j] < offset_.back(), "DgcSync", "a rank sent index {} of {} elements", at[j],
               offset_.back());
      sum[at[j]] += x[j];
    }
  }
  for (std::size_t k = 0; k < params_.size(); ++k) {
    Tensor p = params_[k];
    p.set_grad(flat.narrow(0, offset_[k], p.numel()).view(p.shape()));
  }
  stats_.exchange_seconds += seconds_since(t1);

  const train::SyncBytes bytes{
      .sent = pairs * static_cast<std::int64_t>(sizeof(std::int32_t) + sizeof(float)),
      .dense = offset_.back() * static_cast<std::int64_t>(sizeof(float))};
  last_ = bytes;
  ++stats_.steps;
  stats_.pairs += pairs;
  stats_.sent_bytes += bytes.sent;
  stats_.dense_bytes += bytes.dense;
}

std::string DgcStats::describe() const {
  return fmt::format("deep gradient compression: {} steps, {} (index, value) pairs sent, {:.2f} MiB instead of "
                     "{:.1f} MiB dense ({:.0f}x fewer bytes); {:.3f} s selecting, {:.3f} s exchanging",
                     steps, pairs, static_cast<double>(sent_bytes) / (1 << 20),
                     static_cast<double>(dense_bytes) / (1 << 20),
                     sent_bytes > 0 ? static_cast<double>(dense_bytes) / static_cast<double>(sent_bytes) : 0.0,
                     select_seconds, exchange_seconds);
}

std::shared_ptr<DgcSync> attach_dgc(train::Trainer& trainer, std::shared_ptr<Communicator> comm) {
  MT_CHECK(comm != nullptr, "attach_dgc", "the communicator is null");
  auto sync = std::make_shared<DgcSync>(std::move(comm), dgc_options(trainer.config()));
  trainer.set_gradient_sync(sync);
  return sync;
}

}  // namespace memtrain::dist

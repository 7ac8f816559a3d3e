// CUDA optimizer steps, host side (src/cuda/optim.h): argument checks, the f32 coefficients
// computed from the double hyper-parameters exactly as each CPU optimizer class computes them, the device
// flag of the non-finite gate, the device copies of the CPU's encoder tables (core/quant_codebook.h: built and
// verified against the binary search by the optimizer layer), and dispatch to the launchers in
// kernels/optim.cuh.
#include "cuda/optim.h"

#include "cuda/cuda_common.h"
#include "kernels/optim.cuh"
#include "memtrain/core/error.h"
#include "core/quant_codebook.h"

#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace memtrain::cuda {
namespace {

// Where this file's launches go: the current stream of the current device (src/cuda/stream.h);
// every entry point calls it under its DeviceGuard, so that is the entry point's device.
cudaStream_t launch_stream() { return detail::current_stream(); }

static_assert(quant::kEncodeLoBits == ::memtrain::detail::kQuantEncodeLoBits &&
                  quant::kEncodeHiBits == ::memtrain::detail::kQuantEncodeHiBits,
              "the device encoder clamps as the CPU's");

using ::memtrain::detail::QuantCodebook;
using ::memtrain::detail::QuantCodebookKind;

// The code book kind of a QuantMap checked to be one of the two (a cast can make any byte), or an error naming op.
QuantCodebookKind codebook_kind(const char* op, QuantMap map) {
  const auto value = static_cast<std::uint8_t>(map);
  MT_CHECK(value == static_cast<std::uint8_t>(QuantCodebookKind::signed_dynamic) ||
               value == static_cast<std::uint8_t>(QuantCodebookKind::unsigned_dynamic),
           op, "unknown QuantMap {}", static_cast<int>(value));
  return static_cast<QuantCodebookKind>(value);
}

// One device int per device for the non-finite gate, allocated on first use and kept for the process.
// Its lock is held from clearing the flag until the kernel that reads it is enqueued, so two host threads
// stepping on one device cannot interleave their gate and step (the stream runs them in enqueue order).
struct GateFlag {
  std::mutex mutex;
  int* flag = nullptr;
};

// Call with `device` current.
GateFlag& gate_flag(const char* op, int device) {
  static std::mutex registry_mutex;
  static std::vector<std::unique_ptr<GateFlag>> flags;
  std::lock_guard lock(registry_mutex);
  const auto index = static_cast<std::size_t>(device);
  if (flags.size() <= index) flags.resize(index + 1);
  if (!flags[index]) {
    auto fresh = std::make_unique<GateFlag>();
    MT_CUDA_CHECK(op, cudaMalloc, reinterpret_cast<void**>(&fresh->flag), sizeof(int));
    flags[index] = std::move(fresh);
  }
  return *flags[index];
}

// The flag one gated call uses, held until the call's kernels are enqueued: on the legacy stream the
// device's persistent flag under its lock (calls run in enqueue order); on another stream a fresh int
// from the allocator, so calls on two streams never clear and read one flag at the same time.
class GateUse {
 public:
  GateUse(const char* op, int device) {
    if (launch_stream() == nullptr) {
      GateFlag& gate = gate_flag(op, device);
      lock_ = std::unique_lock(gate.mutex);
      flag_ = gate.flag;
    } else {
      own_.emplace(device, sizeof(int));
      flag_ = static_cast<int*>(own_->get());
    }
  }
  int* flag() const { return flag_; }

 private:
  std::unique_lock<std::mutex> lock_;
  std::optional<detail::CallScratch> own_;
  int* flag_ = nullptr;
};

// Enqueues launch(skip) with skip = the gate's flag after the gate kernel (skip_nonfinite), or null.
template <typename Launch>
void run_step(const char* op, const char* launcher, int device, const float* grad, std::size_t n,
              bool skip_nonfinite, Launch&& launch) {
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  if (!skip_nonfinite) {
    detail::check_cuda(launch(static_cast<const int*>(nullptr)), op, launcher);
    return;
  }
  GateUse gate(op, device);
  MT_CUDA_CHECK(op, launch_nonfinite_flag, grad, n, gate.flag(), launch_stream());
  detail::check_cuda(launch(static_cast<const int*>(gate.flag())), op, launcher);
}

// The two maps' encoder tables on one device, uploaded on first use and kept for the process.
struct DeviceTables {
  std::uint32_t* table[2] = {nullptr, nullptr};  // signed, unsigned
};

// Call with `device` current. The upload is a synchronous cudaMemcpy, done once per device.
EncodeTableArg device_encoder(const char* op, int device, QuantCodebookKind kind) {
  static std::mutex registry_mutex;
  static std::vector<std::unique_ptr<DeviceTables>> tables;
  const bool is_signed = kind == QuantCodebookKind::signed_dynamic;
  const QuantCodebook& t = ::memtrain::detail::quant_codebook(kind);
  const std::size_t entries = 2 * static_cast<std::size_t>(t.buckets);
  std::lock_guard lock(registry_mutex);
  const auto index = static_cast<std::size_t>(device);
  if (tables.size() <= index) tables.resize(index + 1);
  if (!tables[index]) tables[index] = std::make_unique<DeviceTables>();
  std::uint32_t*& dev = tables[index]->table[is_signed ? 0 : 1];
  if (dev == nullptr) {
    std::uint32_t* fresh = nullptr;
    MT_CUDA_CHECK(op, cudaMalloc, reinterpret_cast<void**>(&fresh), entries * sizeof(std::uint32_t));
    if (cudaError_t err = cudaMemcpy(fresh, t.table, entries * sizeof(std::uint32_t), cudaMemcpyHostToDevice);
        err != cudaSuccess) {
      cudaFree(fresh);
      detail::check_cuda(err, op, "cudaMemcpy");
    }
    dev = fresh;
  }
  // Second moments are never negative: only the unsigned map's positive half is staged in shared memory.
  const auto staged = static_cast<std::uint32_t>(is_signed ? entries : t.buckets);
  return EncodeTableArg{dev, t.low_bits, t.buckets, staged, t.zero_code};
}

void check_pointers(const char* op, std::size_t n, std::initializer_list<const void*> pointers) {
  for (const void* p : pointers) MT_CHECK(p != nullptr, op, "null pointer for {} elements", n);
}

void check_block_size(const char* op, std::int64_t block_size) {
  MT_CHECK(quant_block_size_supported(block_size), op,
           "block_size {} is not supported (a power of two in [32, 4096])", block_size);
}

const float* map_data(QuantCodebookKind kind) { return ::memtrain::detail::quant_codebook(kind).values; }

void check_adamw(const char* op, const AdamWHyper& h) {
  MT_CHECK(h.beta1 >= 0.0 && h.beta1 < 1.0 && h.beta2 >= 0.0 && h.beta2 < 1.0, op,
           "betas must lie in [0, 1), got ({}, {})", h.beta1, h.beta2);
  MT_CHECK(h.eps >= 0.0, op, "eps must be >= 0, got {}", h.eps);
  MT_CHECK(h.step >= 1, op, "step must be >= 1 (1-based, for bias correction), got {}", h.step);
}

void check_lion(const char* op, const LionHyper& h) {
  MT_CHECK(h.beta1 >= 0.0 && h.beta1 <= 1.0 && h.beta2 >= 0.0 && h.beta2 <= 1.0, op,
           "betas must lie in [0, 1], got ({}, {})", h.beta1, h.beta2);
}

// optim::Lion and optim::Lion8bit compute the same coefficients.
LionCoeffs lion_coeffs(const LionHyper& h) {
  return {static_cast<float>(h.beta1),     static_cast<float>(1.0 - h.beta1),
          static_cast<float>(h.beta2),     static_cast<float>(1.0 - h.beta2),
          static_cast<float>(1.0 - h.lr * h.weight_decay), static_cast<float>(h.lr)};
}

}  // namespace

void sgd_step(float* param, const float* grad, float* momentum, std::size_t n, const SgdHyper& h, int device) {
  constexpr const char* op = "cuda::sgd_step";
  MT_CHECK(h.momentum >= 0.0, op, "momentum must be >= 0, got {}", h.momentum);
  MT_CHECK(!h.nesterov || h.momentum > 0.0, op, "Nesterov needs momentum > 0");
  MT_CHECK(h.step >= 1, op, "step must be >= 1, got {}", h.step);
  if (n == 0) return;
  const bool use_momentum = h.momentum != 0.0;  // optim::SGD: beta1 == 0 is plain SGD
  check_pointers(op, n, {param, grad});
  MT_CHECK(!use_momentum || momentum != nullptr, op, "momentum {} needs a momentum buffer (null pointer)",
           h.momentum);
  // As optim::SGD::update.
  const SgdCoeffs c{static_cast<float>(h.lr), static_cast<float>(h.weight_decay), static_cast<float>(h.momentum),
                    use_momentum, h.nesterov, h.step == 1};
  run_step(op, "launch_sgd_step", device, grad, n, h.skip_nonfinite, [&](const int* skip) {
    return launch_sgd_step(param, grad, use_momentum ? momentum : nullptr, n, c, skip, launch_stream());
  });
}

void adamw_step(float* param, const float* grad, float* m, float* v, std::size_t n, const AdamWHyper& h,
                int device) {
  constexpr const char* op = "cuda::adamw_step";
  check_adamw(op, h);
  if (n == 0) return;
  check_pointers(op, n, {param, grad, m, v});
  // As optim::AdamW::update.
  const double t = static_cast<double>(h.step);
  const AdamWCoeffs c{static_cast<float>(h.beta1),
                      static_cast<float>(1.0 - h.beta1),
                      static_cast<float>(h.beta2),
                      static_cast<float>(1.0 - h.beta2),
                      static_cast<float>(1.0 - h.lr * h.weight_decay),
                      static_cast<float>(-h.lr / (1.0 - std::pow(h.beta1, t))),
                      static_cast<float>(std::sqrt(1.0 - std::pow(h.beta2, t))),
                      static_cast<float>(h.eps)};
  run_step(op, "launch_adamw_step", device, grad, n, h.skip_nonfinite,
           [&](const int* skip) { return launch_adamw_step(param, grad, m, v, n, c, skip, launch_stream()); });
}

void lion_step(float* param, const float* grad, float* m, std::size_t n, const LionHyper& h, int device) {
  constexpr const char* op = "cuda::lion_step";
  check_lion(op, h);
  if (n == 0) return;
  check_pointers(op, n, {param, grad, m});
  const LionCoeffs c = lion_coeffs(h);
  run_step(op, "launch_lion_step", device, grad, n, h.skip_nonfinite,
           [&](const int* skip) { return launch_lion_step(param, grad, m, n, c, skip, launch_stream()); });
}

void adamw8bit_step(float* param, const float* grad, std::uint8_t* m_codes, float* m_absmax, std::uint8_t* v_codes,
                    float* v_absmax, std::size_t n, std::int64_t block_size, const AdamWHyper& h, int device) {
  constexpr const char* op = "cuda::adamw8bit_step";
  check_adamw(op, h);
  check_block_size(op, block_size);
  if (n == 0) return;
  check_pointers(op, n, {param, grad, m_codes, m_absmax, v_codes, v_absmax});
  const float* m_map = map_data(QuantCodebookKind::signed_dynamic);
  const float* v_map = map_data(QuantCodebookKind::unsigned_dynamic);
  // As optim::AdamW8bit (its coeffs()): step size and 1 / sqrt(bias correction 2) in double, then f32.
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step));
  const AdamW8bitCoeffs c{static_cast<float>(h.beta1),
                          static_cast<float>(h.beta2),
                          static_cast<float>(1.0 - h.beta1),
                          static_cast<float>(1.0 - h.beta2),
                          static_cast<float>(1.0 - h.lr * h.weight_decay),
                          static_cast<float>(h.lr / bc1),
                          static_cast<float>(1.0 / std::sqrt(bc2)),
                          static_cast<float>(h.eps)};
  run_step(op, "launch_adamw8bit_step", device, grad, n, h.skip_nonfinite, [&](const int* skip) {
    const EncodeTableArg m_enc = device_encoder(op, device, QuantCodebookKind::signed_dynamic);
    const EncodeTableArg v_enc = device_encoder(op, device, QuantCodebookKind::unsigned_dynamic);
    return launch_adamw8bit_step(param, grad, m_codes, m_absmax, m_map, m_enc, v_codes, v_absmax, v_map, v_enc, n,
                                 static_cast<int>(block_size), c, skip, launch_stream());
  });
}

void lion8bit_step(float* param, const float* grad, std::uint8_t* m_codes, float* m_absmax, std::size_t n,
                   std::int64_t block_size, const LionHyper& h, int device) {
  constexpr const char* op = "cuda::lion8bit_step";
  check_lion(op, h);
  check_block_size(op, block_size);
  if (n == 0) return;
  check_pointers(op, n, {param, grad, m_codes, m_absmax});
  const float* map = map_data(QuantCodebookKind::signed_dynamic);
  const LionCoeffs c = lion_coeffs(h);
  run_step(op, "launch_lion8bit_step", device, grad, n, h.skip_nonfinite, [&](const int* skip) {
    const EncodeTableArg enc = device_encoder(op, device, QuantCodebookKind::signed_dynamic);
    return launch_lion8bit_step(param, grad, m_codes, m_absmax, map, enc, n, static_cast<int>(block_size), c, skip,
                                launch_stream());
  });
}

void quantize_blockwise(const float* src, std::uint8_t* codes, float* absmax, std::size_t n, std::int64_t block_size,
                        QuantMap map, int device) {
  constexpr const char* op = "cuda::quantize_blockwise";
  check_block_size(op, block_size);
  const QuantCodebookKind kind = codebook_kind(op, map);
  if (n == 0) return;
  check_pointers(op, n, {src, codes, absmax});
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  const EncodeTableArg enc = device_encoder(op, device, kind);
  MT_CUDA_CHECK(op, launch_quantize_blockwise, src, codes, absmax, enc, n, static_cast<int>(block_size),
                launch_stream());
}

void dequantize_blockwise(const std::uint8_t* codes, const float* absmax, float* dst, std::size_t n,
                          std::int64_t block_size, QuantMap map, int device) {
  constexpr const char* op = "cuda::dequantize_blockwise";
  check_block_size(op, block_size);
  const float* values = map_data(codebook_kind(op, map));
  if (n == 0) return;
  check_pointers(op, n, {codes, absmax, dst});
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  MT_CUDA_CHECK(op, launch_dequantize_blockwise, codes, absmax, dst, values, n, static_cast<int>(block_size),
                launch_stream());
}

bool grad_is_finite(const float* x, std::size_t n, int device) {
  constexpr const char* op = "cuda::grad_is_finite";
  if (n == 0) return true;
  check_pointers(op, n, {x});
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  GateUse gate(op, device);
  MT_CUDA_CHECK(op, launch_nonfinite_flag, x, n, gate.flag(), launch_stream());
  int bad = 0;
  // cudaMemcpy runs on the legacy stream, which waits for the check on any (blocking) memtrain stream.
  MT_CUDA_CHECK(op, cudaMemcpy, &bad, gate.flag(), sizeof(int), cudaMemcpyDeviceToHost);
  return bad == 0;
}

}  // namespace memtrain::cuda

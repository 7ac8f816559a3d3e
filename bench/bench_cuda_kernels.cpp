// GPU time of memtrain's CUDA kernels on GPT-2 124M shapes, beside scripts/device/kernels_peer.py, which
// times the same cases in PyTorch and prints the same table and JSON.
//
//   ./bench_cuda_kernels [out.json]
//
// Cases (random data, never zeros):
//   attention fwd / bwd / fwd+bwd (cuda::attention_*): B=8, H=12, T=1024, D=64, causal, f32 and bf16, q, k, v
//     read in place from a fused [B, T, 3, H, D] QKV buffer (dq, dk, dv written into one likewise), out and
//     dout [B, T, H, D]. FLOPs: 4 B H T^2 D / 2 for the causal forward, 2.5x that for the backward.
//   optimizer steps (cuda::*_step) on one f32 parameter of n = 124,439,808 (GPT-2 124M): adamw, adamw8bit,
//     lion, lion8bit (8-bit: block 256), each without and with the non-finite gradient gate
//     (skip_nonfinite, on by default, one more read of the gradient). Bytes moved: p, g read, p written
//     (12 B/param) plus the state read and written (2 x state bytes per param), + 4 B/param for the gate:
//     adamw 28, adamw8bit 16 + 16/256, lion 20, lion8bit 14 + 8/256.
//   layer_norm fwd / bwd / fwd+bwd (the CUDA backend's layer_norm_forward / _backward entries, src/cuda/norm.cu,
//     on tensors over the same buffers): N=8192, C=768, f32 and bf16, with weight and bias.
//     Bytes: fwd x read, out written, mean and rstd written; bwd dout, x read, dx written, mean, rstd read
//     (weight, bias and their gradients counted once).
//   cross_entropy fwd / bwd / fwd+bwd (cuda::cross_entropy_*): N=8192, V=50304, f32 and bf16, i64 targets,
//     mean-reduction scale (dloss = 1/N, stride 0). Bytes: fwd logits read, losses and lse written; bwd
//     logits read, dlogits written (plus targets and lse). The byte counts are the least each op must move,
//     the same on both sides, so GB/s is an effective bandwidth (PyTorch's cross entropy moves more).
//
// Method: 3 warm-up calls, then one long GEMM (~20 ms) so the host is far ahead of the device, then 30
// calls timed one by one with CUDA events enqueued back to back (cuda::time_reps_ms), reported as the
// median. Small cases rotate among enough buffer sets that one pass over them is >= 4x the 60 MB L2.
// Device buffers come from Allocator::get(Device::cuda(0)); uploads go through cuda::copy.
// Without a CUDA device it prints "no CUDA device: <reason>" and exits 0.
//
// A plain main(): bench/CMakeLists.txt links Google Benchmark into every bench_*, which is harmless here.
#include "core/backend.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/core/float_types.h"
#include "memtrain/core/tensor.h"
#include "cuda/attention.h"
#include "cuda/device_ops.h"
#include "cuda/gemm_lt.h"
#include "cuda/nn.h"
#include "cuda/optim.h"
#include "memtrain/optim/quantized_state.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace memtrain;

constexpr int kDev = 0;
constexpr std::int64_t kL2Bytes = 60'000'000;  // H100/H200 L2
constexpr int kWarmup = 3;
constexpr int kReps = 30;
constexpr double kPadMs = 20.0;  // device work enqueued ahead of each timed series

// Shapes.
constexpr std::int64_t kAttnB = 8, kAttnH = 12, kAttnT = 1024, kAttnD = 64;
constexpr std::size_t kOptimN = 124'439'808;  // GPT-2 124M (tied 50257 x 768 embedding)
constexpr std::int64_t kQuantBlock = 256;      // AdamW8bit / Lion8bit default
constexpr std::int64_t kRows = 8192;           // B * T tokens
constexpr std::int64_t kLnC = 768;
constexpr std::int64_t kVocab = 50304;

struct Result {
  std::string name, dtype;
  double median_ms = 0;
  double flops = 0;  // per call; 0: not a FLOP-bound case
  double bytes = 0;  // per call; 0: not reported
  double state_bytes_per_param = 0;  // optimizers only
  std::string error;
  double tflops() const { return flops > 0 && median_ms > 0 ? flops / (median_ms * 1e-3) / 1e12 : 0; }
  double gbps() const { return bytes > 0 && median_ms > 0 ? bytes / (median_ms * 1e-3) / 1e9 : 0; }
};

std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Device memory from the CUDA allocator, handed back when this goes out of scope.
class DeviceMemory {
 public:
  DeviceMemory() : alloc_(Allocator::get(Device::cuda(kDev))) {}
  ~DeviceMemory() {
    for (const Block& b : blocks_) alloc_.deallocate(b);
    alloc_.empty_cache();
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  void* get(std::size_t nbytes) {
    blocks_.push_back(alloc_.allocate(nbytes, MemoryCategory::other));
    return blocks_.back().ptr;
  }
  float* get_f32(std::size_t n) { return static_cast<float*>(get(n * sizeof(float))); }

 private:
  Allocator& alloc_;
  std::vector<Block> blocks_;
};

// n random values of dtype t (f32 or bf16) uploaded to dst: magnitudes uniform in [lo, hi), random signs
// unless `positive`. Made and copied in chunks so the host needs little memory.
void upload_random(void* dst, DType t, std::size_t n, std::uint64_t seed, float lo, float hi,
                   bool positive = false) {
  constexpr std::size_t kChunk = std::size_t(1) << 24;
  const std::size_t es = dtype_size(t);
  std::vector<std::uint8_t> host(std::min(n, kChunk) * es);
  std::uint64_t s = seed * 0x2545f4914f6cdd1dull + 1;
  for (std::size_t start = 0; start < n; start += kChunk) {
    const std::size_t len = std::min(kChunk, n - start);
    for (std::size_t i = 0; i < len; ++i) {
      const std::uint64_t r = splitmix(s);
      const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
      float x = lo + (hi - lo) * u;
      if (!positive && (r & 1)) x = -x;
      if (t == DType::f32) {
        std::memcpy(&host[4 * i], &x, 4);
      } else {
        const std::uint16_t bits = BFloat16::from_float(x).bits;
        std::memcpy(&host[2 * i], &bits, 2);
      }
    }
    cuda::copy(static_cast<std::uint8_t*>(dst) + start * es, Device::cuda(kDev), host.data(), Device::cpu(),
               len * es);
  }
}

// n random i64 class indices in [0, v).
void upload_targets(void* dst, std::size_t n, std::int64_t v, std::uint64_t seed) {
  std::vector<std::int64_t> host(n);
  std::uint64_t s = seed;
  for (auto& x : host) x = static_cast<std::int64_t>(splitmix(s) % static_cast<std::uint64_t>(v));
  cuda::copy(dst, Device::cuda(kDev), host.data(), Device::cpu(), n * sizeof(std::int64_t));
}

// Buffer sets so one pass over them is >= 4x the L2 (1 for cases far larger than it).
int buffer_sets(double set_bytes) {
  return static_cast<int>(std::clamp<double>(std::ceil(4.0 * kL2Bytes / set_bytes), 1, 16));
}

// Enqueues ~kPadMs of f32 GEMMs before a timed series, so every timed call is already queued when the
// device reaches it and the series measures device time, not host launch time.
class Pad {
 public:
  explicit Pad(DeviceMemory& mem) {
    for (float*& p : buf_) {
      p = mem.get_f32(kN * kN);
      cuda::fill(p, DType::f32, kN * kN, 1.0 / 64, kDev);
    }
    gemm();  // cuBLAS set-up outside the timing
    std::vector<float> ms = cuda::time_reps_ms(kDev, 3, [&](int) { gemm(); });
    const double one = std::max<double>(*std::min_element(ms.begin(), ms.end()), 1e-3);
    count_ = static_cast<int>(std::clamp<double>(std::ceil(kPadMs / one), 1, 200));
  }
  void enqueue() {
    for (int i = 0; i < count_; ++i) gemm();
  }

 private:
  static constexpr std::int64_t kN = 4096;
  void gemm() {
    cuda::gemm(DType::f32, false, false, kN, kN, kN, 1.f, buf_[0], kN, buf_[1], kN, 0.f, buf_[2], kN, kDev);
  }
  float* buf_[3] = {};
  int count_ = 1;
};

// Warm-up, pad, then the median of kReps timed calls of work(i).
double median_ms(Pad& pad, const std::function<void(int)>& work) {
  for (int i = 0; i < kWarmup; ++i) work(i);
  pad.enqueue();
  std::vector<float> ms = cuda::time_reps_ms(kDev, kReps, work);
  std::sort(ms.begin(), ms.end());
  return kReps % 2 ? ms[kReps / 2] : 0.5 * (double(ms[kReps / 2 - 1]) + ms[kReps / 2]);
}

const char* dtype_label(DType t) { return t == DType::f32 ? "f32" : "bf16"; }

// Runs one group of cases; an exception marks every case of the group not yet measured with the error.
void run_group(std::vector<Result>& results, const std::vector<Result>& planned,
               const std::function<void(std::vector<Result>&)>& body) {
  std::vector<Result> group = planned;
  try {
    body(group);
  } catch (const std::exception& e) {
    for (Result& r : group) {
      if (r.median_ms == 0) r.error = e.what();
    }
  }
  for (const Result& r : group) {
    if (r.error.empty()) {
      std::fprintf(stderr, "%s %s: %.4f ms\n", r.name.c_str(), r.dtype.c_str(), r.median_ms);
    } else {
      std::fprintf(stderr, "%s %s: error: %s\n", r.name.c_str(), r.dtype.c_str(), r.error.c_str());
    }
    results.push_back(r);
  }
}

Result plan(std::string name, const std::string& dtype, double flops, double bytes, double state = 0) {
  Result r;
  r.name = std::move(name);
  r.dtype = dtype;
  r.flops = flops;
  r.bytes = bytes;
  r.state_bytes_per_param = state;
  return r;
}

// ---- attention ----

void bench_attention(std::vector<Result>& results, Pad& pad, DType dt) {
  constexpr std::int64_t B = kAttnB, H = kAttnH, T = kAttnT, D = kAttnD, HD = H * D;
  const double fwd_flops = 4.0 * B * H * T * T * D / 2;  // causal: half the score matrix
  const std::string dn = dtype_label(dt);
  std::vector<Result> planned = {plan("attention_fwd", dn, fwd_flops, 0), plan("attention_bwd", dn, 2.5 * fwd_flops, 0),
                                 plan("attention_fwd+bwd", dn, 3.5 * fwd_flops, 0)};
  run_group(results, planned, [&](std::vector<Result>& group) {
    DeviceMemory mem;
    const std::size_t es = dtype_size(dt), n = B * T * HD;
    const int sets = buffer_sets(double(8 * n * es + B * H * T * 4));
    struct Set {
      void *qkv, *out, *dout, *dqkv;
      float* lse;
    };
    std::vector<Set> s(sets);
    for (int i = 0; i < sets; ++i) {
      s[i] = {mem.get(3 * n * es), mem.get(n * es), mem.get(n * es), mem.get(3 * n * es), mem.get_f32(B * H * T)};
      upload_random(s[i].qkv, dt, 3 * n, 100 + i, 0.0625f, 1.0f);
      upload_random(s[i].dout, dt, n, 200 + i, 0.0625f, 1.0f);
    }
    const cuda::HeadLayout fused{3 * T * HD, D, 3 * HD}, plain{T * HD, D, HD};
    auto at = [&](void* p, std::int64_t off) { return static_cast<void*>(static_cast<char*>(p) + off * es); };
    const double scale = 1.0 / std::sqrt(double(D));
    auto fwd = [&](int i) {
      const Set& x = s[i % sets];
      cuda::attention_forward(x.out, plain, x.lse, at(x.qkv, 0), fused, at(x.qkv, HD), fused, at(x.qkv, 2 * HD),
                              fused, B, H, T, D, scale, true, dt, kDev);
    };
    auto bwd = [&](int i) {
      const Set& x = s[i % sets];
      cuda::attention_backward(at(x.dqkv, 0), fused, at(x.dqkv, HD), fused, at(x.dqkv, 2 * HD), fused, x.dout, plain,
                               at(x.qkv, 0), fused, at(x.qkv, HD), fused, at(x.qkv, 2 * HD), fused, x.out, plain,
                               x.lse, B, H, T, D, scale, true, dt, kDev);
    };
    for (int i = 0; i < sets; ++i) fwd(i);  // out and lse of every set, for the backward
    group[0].median_ms = median_ms(pad, fwd);
    group[1].median_ms = median_ms(pad, bwd);
    group[2].median_ms = median_ms(pad, [&](int i) {
      fwd(i);
      bwd(i);
    });
  });
}

// ---- optimizer steps ----

void bench_optim(std::vector<Result>& results, Pad& pad) {
  const double n = double(kOptimN);
  const double blocks_per_param = 1.0 / double(kQuantBlock);
  const double state[4] = {8, 2 + 8 * blocks_per_param, 4, 1 + 4 * blocks_per_param};
  const char* names[4] = {"adamw_step", "adamw8bit_step", "lion_step", "lion8bit_step"};
  std::vector<Result> planned;
  for (int gate = 0; gate < 2; ++gate) {
    for (int k = 0; k < 4; ++k) {
      const double bytes = n * (12 + 2 * state[k] + (gate ? 4 : 0));
      planned.push_back(plan(std::string(names[k]) + (gate ? " +gate" : ""), "f32", 0, bytes, state[k]));
    }
  }
  run_group(results, planned, [&](std::vector<Result>& group) {
    DeviceMemory mem;
    const std::size_t n_blocks = (kOptimN + kQuantBlock - 1) / kQuantBlock;
    float* p = mem.get_f32(kOptimN);
    float* g = mem.get_f32(kOptimN);
    float* m = mem.get_f32(kOptimN);
    float* v = mem.get_f32(kOptimN);
    auto* m_codes = static_cast<std::uint8_t*>(mem.get(kOptimN));
    auto* v_codes = static_cast<std::uint8_t*>(mem.get(kOptimN));
    float* m_absmax = mem.get_f32(n_blocks);
    float* v_absmax = mem.get_f32(n_blocks);
    upload_random(p, DType::f32, kOptimN, 1, 0.01f, 0.1f);
    upload_random(g, DType::f32, kOptimN, 2, 1e-4f, 1e-2f);
    upload_random(m, DType::f32, kOptimN, 3, 1e-5f, 1e-3f);
    upload_random(v, DType::f32, kOptimN, 4, 1e-8f, 1e-5f, true);
    // 8-bit moments from the f32 ones (Lion8bit reuses the signed first moment).
    cuda::quantize_blockwise(m, m_codes, m_absmax, kOptimN, kQuantBlock, optim::QuantMap::signed_dynamic, kDev);
    cuda::quantize_blockwise(v, v_codes, v_absmax, kOptimN, kQuantBlock, optim::QuantMap::unsigned_dynamic, kDev);

    for (int gate = 0; gate < 2; ++gate) {
      cuda::AdamWHyper ah;
      ah.lr = 1e-3;
      ah.weight_decay = 0.1;
      ah.beta2 = 0.95;
      ah.skip_nonfinite = gate != 0;
      cuda::LionHyper lh;
      lh.lr = 1e-4;
      lh.weight_decay = 0.1;
      lh.skip_nonfinite = gate != 0;
      Result* r = &group[4 * gate];
      r[0].median_ms = median_ms(pad, [&](int i) {
        ah.step = 10 + i;
        cuda::adamw_step(p, g, m, v, kOptimN, ah, kDev);
      });
      r[1].median_ms = median_ms(pad, [&](int i) {
        ah.step = 10 + i;
        cuda::adamw8bit_step(p, g, m_codes, m_absmax, v_codes, v_absmax, kOptimN, kQuantBlock, ah, kDev);
      });
      r[2].median_ms = median_ms(pad, [&](int) { cuda::lion_step(p, g, m, kOptimN, lh, kDev); });
      r[3].median_ms = median_ms(
          pad, [&](int) { cuda::lion8bit_step(p, g, m_codes, m_absmax, kOptimN, kQuantBlock, lh, kDev); });
    }
  });
}

// ---- layer norm ----

void bench_layer_norm(std::vector<Result>& results, Pad& pad, DType dt) {
  constexpr std::int64_t N = kRows, C = kLnC;
  const double es = double(dtype_size(dt));
  const double fwd_bytes = 2.0 * N * C * es + 2.0 * C * es + 8.0 * N;
  const double bwd_bytes = 3.0 * N * C * es + 3.0 * C * es + 8.0 * N;
  const std::string dn = dtype_label(dt);
  std::vector<Result> planned = {plan("layer_norm_fwd", dn, 0, fwd_bytes), plan("layer_norm_bwd", dn, 0, bwd_bytes),
                                 plan("layer_norm_fwd+bwd", dn, 0, fwd_bytes + bwd_bytes)};
  run_group(results, planned, [&](std::vector<Result>& group) {
    const Device dev = Device::cuda(kDev);
    const auto& backend = detail::backend_for(dev);
    const std::size_t nc = N * C, bytes = nc * dtype_size(dt);
    const int sets = buffer_sets(double(4 * bytes + 8 * N));
    struct Set {
      Tensor x, out, dout, dx, mean, rstd;
    };
    std::vector<Set> s(sets);
    for (int i = 0; i < sets; ++i) {
      s[i] = {Tensor::empty({N, C}, dt, dev), Tensor::empty({N, C}, dt, dev), Tensor::empty({N, C}, dt, dev),
              Tensor::empty({N, C}, dt, dev), Tensor::empty({N}, DType::f32, dev), Tensor::empty({N}, DType::f32, dev)};
      upload_random(s[i].x.data_ptr(), dt, nc, 300 + i, 0.0625f, 2.0f);
      upload_random(s[i].dout.data_ptr(), dt, nc, 400 + i, 0.0625f, 2.0f);
    }
    const Tensor w = Tensor::empty({C}, dt, dev), b = Tensor::empty({C}, dt, dev);
    const Tensor dw = Tensor::empty({C}, dt, dev), db = Tensor::empty({C}, dt, dev);
    upload_random(w.data_ptr(), dt, C, 5, 0.5f, 1.5f);
    upload_random(b.data_ptr(), dt, C, 6, 0.0625f, 0.5f);
    auto fwd = [&](int i) {
      const Set& x = s[i % sets];
      backend.layer_norm_forward(x.out, x.mean, x.rstd, x.x, w, b, 1e-5);
    };
    auto bwd = [&](int i) {
      const Set& x = s[i % sets];
      backend.layer_norm_backward(x.dx, dw, db, x.dout, x.x, w, x.mean, x.rstd);
    };
    for (int i = 0; i < sets; ++i) fwd(i);
    group[0].median_ms = median_ms(pad, fwd);
    group[1].median_ms = median_ms(pad, bwd);
    group[2].median_ms = median_ms(pad, [&](int i) {
      fwd(i);
      bwd(i);
    });
  });
}

// ---- cross entropy ----

void bench_cross_entropy(std::vector<Result>& results, Pad& pad, DType dt) {
  constexpr std::int64_t N = kRows, V = kVocab;
  const double es = double(dtype_size(dt));
  const double fwd_bytes = 1.0 * N * V * es + 8.0 * N + 8.0 * N;         // logits, targets; losses, lse
  const double bwd_bytes = 2.0 * N * V * es + 8.0 * N + 4.0 * N + 4.0;   // logits, dlogits; targets, lse, dloss
  const std::string dn = dtype_label(dt);
  std::vector<Result> planned = {plan("cross_entropy_fwd", dn, 0, fwd_bytes),
                                 plan("cross_entropy_bwd", dn, 0, bwd_bytes),
                                 plan("cross_entropy_fwd+bwd", dn, 0, fwd_bytes + bwd_bytes)};
  run_group(results, planned, [&](std::vector<Result>& group) {
    DeviceMemory mem;
    const std::size_t nv = N * V, bytes = nv * dtype_size(dt);
    const int sets = buffer_sets(double(2 * bytes + 16 * N));
    struct Set {
      void *logits, *dlogits, *targets;
      float *losses, *lse;
    };
    std::vector<Set> s(sets);
    for (int i = 0; i < sets; ++i) {
      s[i] = {mem.get(bytes), mem.get(bytes), mem.get(N * sizeof(std::int64_t)), mem.get_f32(N), mem.get_f32(N)};
      upload_random(s[i].logits, dt, nv, 500 + i, 0.0625f, 4.0f);
      upload_targets(s[i].targets, N, V, 600 + i);
    }
    float* dloss = mem.get_f32(1);
    const float inv_n = 1.0f / float(N);
    cuda::copy(dloss, Device::cuda(kDev), &inv_n, Device::cpu(), sizeof(float));
    constexpr std::int64_t kIgnore = -100;
    auto fwd = [&](int i) {
      const Set& x = s[i % sets];
      cuda::cross_entropy_forward(x.losses, x.lse, x.logits, dt, x.targets, DType::i64, N, V, kIgnore, kDev);
    };
    auto bwd = [&](int i) {
      const Set& x = s[i % sets];
      cuda::cross_entropy_backward(x.dlogits, dloss, 0, x.logits, x.lse, dt, x.targets, DType::i64, N, V, kIgnore,
                                   kDev);
    };
    for (int i = 0; i < sets; ++i) fwd(i);
    group[0].median_ms = median_ms(pad, fwd);
    group[1].median_ms = median_ms(pad, bwd);
    group[2].median_ms = median_ms(pad, [&](int i) {
      fwd(i);
      bwd(i);
    });
  });
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) {
      out += ' ';
      continue;
    }
    out += ch;
  }
  return out;
}

std::string number_or_dash(double x, int digits) { return x > 0 ? fmt::format("{:.{}f}", x, digits) : "-"; }

}  // namespace

int main(int argc, char** argv) {
  if (!cuda::is_available()) {
    std::printf("no CUDA device: %s\n", cuda::unavailable_reason().c_str());
    return 0;
  }
  std::vector<Result> results;
  try {
    DeviceMemory pad_mem;
    Pad pad(pad_mem);
    for (DType dt : {DType::f32, DType::bf16}) bench_attention(results, pad, dt);
    bench_optim(results, pad);
    for (DType dt : {DType::f32, DType::bf16}) bench_layer_norm(results, pad, dt);
    for (DType dt : {DType::f32, DType::bf16}) bench_cross_entropy(results, pad, dt);
  } catch (const std::exception& e) {  // the pad itself failed: nothing can be timed
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }

  std::string table = "| case | dtype | ms | TFLOP/s | GB/s | notes |\n|---|---|---:|---:|---:|---|\n";
  for (const Result& r : results) {
    const std::string note =
        r.state_bytes_per_param > 0 ? fmt::format("state {:.3f} B/param", r.state_bytes_per_param) : "";
    if (!r.error.empty()) {
      table += fmt::format("| {} | {} | error | | | {} |\n", r.name, r.dtype, r.error);
      continue;
    }
    table += fmt::format("| {} | {} | {:.4f} | {} | {} | {} |\n", r.name, r.dtype, r.median_ms,
                         number_or_dash(r.tflops(), 1), number_or_dash(r.gbps(), 0), note);
  }
  std::printf(
      "memtrain CUDA kernels, median of %d (GPT-2 124M shapes): attention B=%ld H=%ld T=%ld D=%ld causal, fused QKV; "
      "optimizers n=%zu (8-bit block %ld; +gate = skip_nonfinite); layer_norm N=%ld C=%ld; cross_entropy N=%ld "
      "V=%ld\n\n%s",
      kReps, long(kAttnB), long(kAttnH), long(kAttnT), long(kAttnD), kOptimN, long(kQuantBlock), long(kRows),
      long(kLnC), long(kRows), long(kVocab), table.c_str());

  if (argc > 1) {
    std::string json = fmt::format("{{\n  \"tool\": \"memtrain cuda kernels\",\n  \"reps\": {},\n  \"warmup\": {},\n"
                                   "  \"l2_bytes_assumed\": {},\n  \"results\": [\n",
                                   kReps, kWarmup, kL2Bytes);
    for (std::size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      json += fmt::format(
          "    {{\"case\": \"{}\", \"dtype\": \"{}\", \"median_ms\": {:.6f}, \"flops\": {:.6g}, \"bytes\": {:.6g}, "
          "\"tflops\": {:.3f}, \"gbps\": {:.1f}, \"state_bytes_per_param\": {:.4f}, \"error\": {}}}{}\n",
          r.name, r.dtype, r.median_ms, r.flops, r.bytes, r.tflops(), r.gbps(), r.state_bytes_per_param,
          r.error.empty() ? std::string("null") : "\"" + json_escape(r.error) + "\"",
          i + 1 < results.size() ? "," : "");
    }
    json += "  ]\n}\n";
    std::FILE* f = std::fopen(argv[1], "w");
    if (f == nullptr || std::fputs(json.c_str(), f) < 0 || std::fclose(f) != 0) {
      std::fprintf(stderr, "cannot write %s\n", argv[1]);
      return 1;
    }
  }
  return 0;
}

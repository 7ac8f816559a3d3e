// cuda::attention_forward / attention_backward (src/cuda/attention.h) against the CPU kernel
// cpu::attention_forward / attention_backward run in f64 on the same inputs (already rounded to the device
// dtype), for causal and full attention, several (B, H, T, D) with T off the 64-row tiles, contiguous
// operands, head views of a fused QKV buffer, and operands not 16-byte aligned. Both kernel families are
// covered: f32 (CUDA cores), bf16 and f16 on tensor cores, bf16 forced onto the CUDA-core kernels, and the
// two bf16 families against each other. Outputs start as all-ones bytes (NaN in f32, bf16 and f16), so an
// element the kernels fail to write shows up, and elements outside an output's layout must keep them.
// Device tests skip with cuda::unavailable_reason() when no usable device exists; the argument checks run
// wherever CUDA is built (they throw before touching a device).
#include "cpu/attention.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/core/float_types.h"
#include "cuda/attention.h"
#include "cuda/device_ops.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

namespace memtrain {
namespace {

using cuda::HeadLayout;

// A block of cuda:0 memory from the allocator, returned on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t nbytes) : block_(Allocator::get(Device::cuda(0)).allocate(nbytes)) {}
  ~DeviceBuffer() { Allocator::get(Device::cuda(0)).deallocate(block_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* at(std::size_t byte_offset = 0) const { return static_cast<char*>(block_.ptr) + byte_offset; }

 private:
  Block block_;
};

// Host staging for n elements of dtype (f32, bf16 or f16), all bytes 0xff (NaN) until set.
class HostBuf {
 public:
  HostBuf(DType dtype, std::size_t n) : dtype_(dtype), bytes_(n * dtype_size(dtype), 0xff) {}
  std::size_t size() const { return bytes_.size() / dtype_size(dtype_); }
  std::size_t nbytes() const { return bytes_.size(); }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  void set(std::size_t i, double x) {
    if (dtype_ == DType::f32) {
      const float f = static_cast<float>(x);
      std::memcpy(&bytes_[i * 4], &f, 4);
    } else {
      const std::uint16_t b = dtype_ == DType::f16 ? Half::from_double(x).bits : BFloat16::from_double(x).bits;
      std::memcpy(&bytes_[i * 2], &b, 2);
    }
  }
  double get(std::size_t i) const {
    if (dtype_ == DType::f32) {
      float f;
      std::memcpy(&f, &bytes_[i * 4], 4);
      return f;
    }
    std::uint16_t b;
    std::memcpy(&b, &bytes_[i * 2], 2);
    return dtype_ == DType::f16 ? Half::from_bits(b).to_float() : BFloat16::from_bits(b).to_float();
  }
  bool poisoned(std::size_t i) const {
    const std::size_t es = dtype_size(dtype_);
    return std::all_of(bytes_.begin() + i * es, bytes_.begin() + (i + 1) * es, [](std::uint8_t c) { return c == 0xff; });
  }

 private:
  DType dtype_;
  std::vector<std::uint8_t> bytes_;
};

double round_to(DType dtype, double x) {
  switch (dtype) {
    case DType::f32: return static_cast<float>(x);
    case DType::f16: return Half::from_double(x).to_float();
    default: return BFloat16::from_double(x).to_float();
  }
}

struct Shape {
  std::int64_t B, H, T, D;
  std::size_t numel() const { return static_cast<std::size_t>(B * H * T * D); }
};

// Where one [B, H, T, D] operand sits in a buffer (offset and strides in elements).
struct Placement {
  HeadLayout layout;
  std::int64_t offset = 0;
};

// Visits every element (b, h, t, d) in contiguous [B, H, T, D] order: f(contiguous index, buffer index).
void for_each_element(const Shape& s, const Placement& p, const std::function<void(std::size_t, std::size_t)>& f) {
  std::size_t c = 0;
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t h = 0; h < s.H; ++h)
      for (std::int64_t t = 0; t < s.T; ++t)
        for (std::int64_t d = 0; d < s.D; ++d, ++c) {
          const std::int64_t i = p.offset + b * p.layout.batch + h * p.layout.head + t * p.layout.row + d;
          f(c, static_cast<std::size_t>(i));
        }
}

enum class Layout { contiguous, fused, unaligned };

// The buffers of one case: a "qkv" buffer holds three operands (q, k, v or dq, dk, dv), a "single" one
// holds out or dout.
//   contiguous: qkv = three contiguous [B, H, T, D] blocks one after another; single = one such block.
//   fused:      qkv = [B, T, 3, H, D], each operand a head view {3THD, D, 3HD} at offset 0, HD, 2HD (what a
//               fused QKV projection gives); single = [B, T, H, D] with each t-row padded by 8 elements,
//               {T (HD + 8), D, HD + 8}: the 8-element gaps are never written.
//   unaligned:  contiguous, but every operand starts one element late, so no row is 16-byte aligned (the
//               tensor-core kernels then load element by element instead of 16 bytes at a time).
struct Plan {
  std::size_t qkv_n = 0, single_n = 0;
  Placement qkv[3];
  Placement single;
};

Plan make_plan(const Shape& s, Layout layout) {
  Plan p;
  const std::int64_t HD = s.H * s.D;
  if (layout != Layout::fused) {
    const HeadLayout l{s.H * s.T * s.D, s.T * s.D, s.D};
    const std::int64_t shift = layout == Layout::unaligned ? 1 : 0;
    for (int i = 0; i < 3; ++i) p.qkv[i] = {l, i * static_cast<std::int64_t>(s.numel()) + shift};
    p.qkv_n = 3 * s.numel() + shift;
    p.single = {l, shift};
    p.single_n = s.numel() + shift;
  } else {
    const HeadLayout l{3 * s.T * HD, s.D, 3 * HD};
    for (int i = 0; i < 3; ++i) p.qkv[i] = {l, i * HD};
    p.qkv_n = 3 * s.numel();
    const std::int64_t rs = HD + 8;
    p.single = {HeadLayout{s.T * rs, s.D, rs}, 0};
    p.single_n = static_cast<std::size_t>(s.B * s.T * rs);
  }
  return p;
}

template <typename T>
void upload(void* dst, const T* src, std::size_t nbytes) {
  cuda::copy(dst, Device::cuda(0), src, Device::cpu(), nbytes);
}
void download(void* dst, const void* src, std::size_t nbytes) {
  cuda::copy(dst, Device::cpu(), src, Device::cuda(0), nbytes);
}

// ||got - ref|| / max(||ref||, 1e-3 sqrt(n)): normwise relative error, with a floor so that a reference
// that is zero in exact arithmetic (dq when T = 1) compares against rounding noise absolutely.
double normwise_error(const std::vector<double>& got, const std::vector<double>& ref) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    diff += (got[i] - ref[i]) * (got[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-3 * std::sqrt(static_cast<double>(ref.size())));
}

std::size_t count_nonfinite(const std::vector<double>& v) {
  return static_cast<std::size_t>(std::count_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }));
}

// Tolerances (normwise relative unless noted), and why:
//  f32   out 2e-5, grads 1e-4: f32 sums over T <= 4097 keys in a different order than the f64 reference,
//        relative error ~ sqrt(T) 2^-24 per sum; the gradients chain three such products and cancel in
//        dS = P (dP - delta).
//  bf16  out, grads 1e-2: the inputs are exact bf16 values in both runs and the device sums in f32, so the
//        error is the final rounding to bf16 (at most 2^-9 relative per element, ~1e-3 normwise); the
//        tensor-core kernels also round P and dS to bf16 before their GEMMs (2^-9 relative per element, random
//        in sign, so again ~1e-3 normwise, well inside 1e-2).
//  f16   as bf16, with 2^-11 per rounding instead of 2^-9.
//  lse   |err| <= 1e-5 (1 + |lse|) per element in both dtypes: always computed and stored in f32.
struct Tolerance {
  double out, grad;
};
Tolerance tolerance(DType dtype) { return dtype == DType::f32 ? Tolerance{2e-5, 1e-4} : Tolerance{1e-2, 1e-2}; }
// Tensor-core vs CUDA-core bf16 kernels on the same inputs: each is within ~4e-3 of the f64 reference
// (above), so they differ by at most about twice that.
constexpr double kKernelsTol = 1e-2;
constexpr double kLseTol = 1e-5;

struct Case {
  DType dtype;
  Shape s;
  bool causal;
  Layout layout;
  double scale = 0;  // 0: 1 / sqrt(D)
};

std::string describe(const Case& c) {
  const char* layout = c.layout == Layout::contiguous ? "contiguous" : c.layout == Layout::fused ? "fused-qkv" : "unaligned";
  return fmt::format("{} B={} H={} T={} D={} {} {} scale={} kernels={}", dtype_name(c.dtype), c.s.B, c.s.H, c.s.T,
                     c.s.D, c.causal ? "causal" : "full", layout, c.scale,
                     cuda::attention_kernels() == cuda::AttentionKernels::automatic ? "automatic" : "cuda-cores");
}

double scale_of(const Case& c) { return c.scale != 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.s.D)); }

// One case's inputs, rounded to the dtype so both sides see the same numbers, and the f64 CPU results.
struct Reference {
  std::vector<double> q, k, v, dout;  // inputs, contiguous [B, H, T, D]; scores have a spread of ~1.3
  std::vector<double> out, lse;       // the forward
  std::vector<double> out_in;         // out rounded to the dtype, as the device stores it: the backward's input
  std::vector<float> lse_in;          // lse rounded to f32: the backward's input
  std::vector<double> dq, dk, dv;     // the backward on out_in and lse_in
};

Reference make_reference(const Case& c, std::uint64_t seed) {
  const Shape& s = c.s;
  const std::size_t n = s.numel();
  const std::size_t rows = static_cast<std::size_t>(s.B * s.H * s.T);
  const double scale = scale_of(c);
  const int nthreads = omp_get_max_threads();
  Reference r;
  std::mt19937_64 rng(seed);
  auto random = [&](double lo, double hi) {
    std::uniform_real_distribution<double> dist(lo, hi);
    std::vector<double> v(n);
    for (double& x : v) x = round_to(c.dtype, dist(rng));
    return v;
  };
  r.q = random(-2, 2);
  r.k = random(-2, 2);
  r.v = random(-1, 1);
  r.dout = random(-1, 1);

  const cpu::HeadLayout lc{s.H * s.T * s.D, s.T * s.D, s.D};
  r.out.resize(n);
  r.lse.resize(rows);
  std::vector<double> ws(static_cast<std::size_t>(cpu::attention_forward_workspace(s.T, s.D, nthreads)));
  cpu::attention_forward<double>(r.out.data(), lc, r.lse.data(), r.q.data(), lc, r.k.data(), lc, r.v.data(), lc, s.B,
                                 s.H, s.T, s.D, scale, c.causal, ws.data(), nthreads);

  r.out_in.resize(n);
  for (std::size_t i = 0; i < n; ++i) r.out_in[i] = round_to(c.dtype, r.out[i]);
  r.lse_in.resize(rows);
  std::vector<double> lse_in(rows);
  for (std::size_t i = 0; i < rows; ++i) lse_in[i] = r.lse_in[i] = static_cast<float>(r.lse[i]);
  r.dq.resize(n);
  r.dk.resize(n);
  r.dv.resize(n);
  ws.assign(static_cast<std::size_t>(cpu::attention_backward_workspace(s.T, s.D, nthreads)), 0.0);
  cpu::attention_backward<double>(r.dq.data(), lc, r.dk.data(), lc, r.dv.data(), lc, r.dout.data(), lc, r.q.data(),
                                  lc, r.k.data(), lc, r.v.data(), lc, r.out_in.data(), lc, lse_in.data(), s.B, s.H,
                                  s.T, s.D, scale, c.causal, ws.data(), nthreads);
  return r;
}

// What the device produced for one case (under the current kernel setting), read back through the layouts in
// contiguous [B, H, T, D] order, plus the writes it made outside the layouts.
struct DeviceResult {
  std::vector<double> out, lse, grads[3];  // grads: dq, dk, dv
  std::size_t out_gap_writes = 0, grad_gap_writes = 0;
  bool deterministic = true;  // a second backward gave the same bytes
};

DeviceResult run_on_device(const Case& c, const Reference& ref) {
  const Shape& s = c.s;
  const std::size_t n = s.numel();
  const std::size_t rows = static_cast<std::size_t>(s.B * s.H * s.T);
  const double scale = scale_of(c);
  const std::size_t es = dtype_size(c.dtype);
  DeviceResult res;

  const Plan plan = make_plan(s, c.layout);
  HostBuf qkv(c.dtype, plan.qkv_n);
  const std::vector<double>* inputs[3] = {&ref.q, &ref.k, &ref.v};
  for (int i = 0; i < 3; ++i) for_each_element(s, plan.qkv[i], [&](std::size_t ci, std::size_t bi) { qkv.set(bi, (*inputs[i])[ci]); });
  DeviceBuffer d_qkv(qkv.nbytes()), d_out(plan.single_n * es), d_lse(rows * 4);
  upload(d_qkv.at(), qkv.data(), qkv.nbytes());
  const HostBuf poison_single(c.dtype, plan.single_n);
  const std::vector<std::uint8_t> poison_lse(rows * 4, 0xff);
  upload(d_out.at(), poison_single.data(), poison_single.nbytes());
  upload(d_lse.at(), poison_lse.data(), poison_lse.size());
  auto qkv_ptr = [&](const DeviceBuffer& buf, int i) { return buf.at(static_cast<std::size_t>(plan.qkv[i].offset) * es); };
  auto single_ptr = [&](const DeviceBuffer& buf) { return buf.at(static_cast<std::size_t>(plan.single.offset) * es); };

  // ---- forward ----
  cuda::attention_forward(single_ptr(d_out), plan.single.layout, static_cast<float*>(d_lse.at()), qkv_ptr(d_qkv, 0),
                          plan.qkv[0].layout, qkv_ptr(d_qkv, 1), plan.qkv[1].layout, qkv_ptr(d_qkv, 2),
                          plan.qkv[2].layout, s.B, s.H, s.T, s.D, scale, c.causal, c.dtype, 0);
  {
    HostBuf got_buf(c.dtype, plan.single_n);
    download(got_buf.data(), d_out.at(), got_buf.nbytes());
    res.out.resize(n);
    std::vector<char> covered(plan.single_n, 0);
    for_each_element(s, plan.single, [&](std::size_t ci, std::size_t bi) {
      res.out[ci] = got_buf.get(bi);
      covered[bi] = 1;
    });
    for (std::size_t i = 0; i < plan.single_n; ++i) res.out_gap_writes += !covered[i] && !got_buf.poisoned(i);
    std::vector<float> lse(rows);
    download(lse.data(), d_lse.at(), rows * 4);
    res.lse.assign(lse.begin(), lse.end());
  }

  // ---- backward, on the reference forward's out and lse (rounded as the device stores them) ----
  HostBuf out_buf(c.dtype, plan.single_n), dout_buf(c.dtype, plan.single_n);
  for_each_element(s, plan.single, [&](std::size_t ci, std::size_t bi) {
    out_buf.set(bi, ref.out_in[ci]);
    dout_buf.set(bi, ref.dout[ci]);
  });
  DeviceBuffer d_dout(dout_buf.nbytes()), d_grads(qkv.nbytes());
  upload(d_out.at(), out_buf.data(), out_buf.nbytes());
  upload(d_dout.at(), dout_buf.data(), dout_buf.nbytes());
  upload(d_lse.at(), ref.lse_in.data(), rows * 4);
  const HostBuf poison_qkv(c.dtype, plan.qkv_n);
  upload(d_grads.at(), poison_qkv.data(), poison_qkv.nbytes());

  auto backward = [&] {
    cuda::attention_backward(qkv_ptr(d_grads, 0), plan.qkv[0].layout, qkv_ptr(d_grads, 1), plan.qkv[1].layout,
                             qkv_ptr(d_grads, 2), plan.qkv[2].layout, single_ptr(d_dout), plan.single.layout,
                             qkv_ptr(d_qkv, 0), plan.qkv[0].layout, qkv_ptr(d_qkv, 1), plan.qkv[1].layout,
                             qkv_ptr(d_qkv, 2), plan.qkv[2].layout, single_ptr(d_out), plan.single.layout,
                             static_cast<const float*>(d_lse.at()), s.B, s.H, s.T, s.D, scale, c.causal, c.dtype, 0);
  };
  backward();
  HostBuf grads(c.dtype, plan.qkv_n);
  download(grads.data(), d_grads.at(), grads.nbytes());
  std::vector<char> covered(plan.qkv_n, 0);
  for (int i = 0; i < 3; ++i) {
    res.grads[i].resize(n);
    for_each_element(s, plan.qkv[i], [&](std::size_t ci, std::size_t bi) {
      res.grads[i][ci] = grads.get(bi);
      covered[bi] = 1;
    });
  }
  for (std::size_t i = 0; i < plan.qkv_n; ++i) res.grad_gap_writes += !covered[i] && !grads.poisoned(i);

  backward();
  HostBuf again(c.dtype, plan.qkv_n);
  download(again.data(), d_grads.at(), again.nbytes());
  res.deterministic = std::memcmp(again.data(), grads.data(), grads.nbytes()) == 0;
  return res;
}

// Rows whose lse is off by more than tol (1 + |ref|); worst |err| in *worst.
std::size_t lse_misses(const std::vector<double>& got, const std::vector<double>& ref, double tol, double* worst) {
  std::size_t bad = 0;
  *worst = 0;
  for (std::size_t r = 0; r < ref.size(); ++r) {
    const double err = std::abs(got[r] - ref[r]);
    if (!(err <= tol * (1 + std::abs(ref[r])))) ++bad;
    if (!(err <= *worst)) *worst = err;
  }
  return bad;
}

const char* const kGradNames[3] = {"dq", "dk", "dv"};

void check_case(const Case& c, std::uint64_t seed) {
  SCOPED_TRACE(describe(c));
  const Tolerance tol = tolerance(c.dtype);
  const Reference ref = make_reference(c, seed);
  const DeviceResult got = run_on_device(c, ref);

  EXPECT_EQ(got.out_gap_writes, 0u) << "out: elements outside the layout were written";
  EXPECT_EQ(count_nonfinite(got.out), 0u) << "out: unwritten (NaN) or non-finite elements";
  EXPECT_LE(normwise_error(got.out, ref.out), tol.out) << "out";
  double worst = 0;
  const std::size_t bad = lse_misses(got.lse, ref.lse, kLseTol, &worst);
  EXPECT_EQ(bad, 0u) << "lse: " << bad << " of " << ref.lse.size() << " rows off; worst |err| " << worst;

  const std::vector<double>* refs[3] = {&ref.dq, &ref.dk, &ref.dv};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(count_nonfinite(got.grads[i]), 0u) << kGradNames[i] << ": unwritten (NaN) or non-finite elements";
    EXPECT_LE(normwise_error(got.grads[i], *refs[i]), tol.grad) << kGradNames[i];
  }
  EXPECT_EQ(got.grad_gap_writes, 0u) << "dq/dk/dv: elements outside the layouts were written";
  EXPECT_TRUE(got.deterministic) << "backward is not deterministic";
}

// Sets the process-wide kernel choice for a scope and restores the previous one.
class KernelsSetting {
 public:
  explicit KernelsSetting(cuda::AttentionKernels k) : previous_(cuda::attention_kernels()) { cuda::set_attention_kernels(k); }
  ~KernelsSetting() { cuda::set_attention_kernels(previous_); }
  KernelsSetting(const KernelsSetting&) = delete;
  KernelsSetting& operator=(const KernelsSetting&) = delete;

 private:
  cuda::AttentionKernels previous_;
};

// The bf16 tensor-core kernels against the bf16 CUDA-core kernels on the same inputs: out, lse, dq, dk, dv.
void compare_kernels(const Case& c, std::uint64_t seed) {
  ASSERT_EQ(c.dtype, DType::bf16);
  const Reference ref = make_reference(c, seed);
  DeviceResult tc, cc;
  {
    KernelsSetting setting(cuda::AttentionKernels::automatic);
    SCOPED_TRACE(describe(c));
    ASSERT_TRUE(cuda::attention_uses_tensor_cores(c.dtype, c.s.D, 0));
    tc = run_on_device(c, ref);
  }
  {
    KernelsSetting setting(cuda::AttentionKernels::cuda_cores);
    SCOPED_TRACE(describe(c));
    ASSERT_FALSE(cuda::attention_uses_tensor_cores(c.dtype, c.s.D, 0));
    cc = run_on_device(c, ref);
  }
  SCOPED_TRACE(describe(c) + " tensor cores vs CUDA cores");
  EXPECT_EQ(count_nonfinite(tc.out) + count_nonfinite(cc.out), 0u) << "out: non-finite elements";
  EXPECT_LE(normwise_error(tc.out, cc.out), kKernelsTol) << "out";
  double worst = 0;
  const std::size_t bad = lse_misses(tc.lse, cc.lse, 2 * kLseTol, &worst);
  EXPECT_EQ(bad, 0u) << "lse: " << bad << " rows differ; worst |diff| " << worst;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(count_nonfinite(tc.grads[i]) + count_nonfinite(cc.grads[i]), 0u) << kGradNames[i] << ": non-finite";
    EXPECT_LE(normwise_error(tc.grads[i], cc.grads[i]), kKernelsTol) << kGradNames[i];
  }
}

void run_cases(DType dtype, const std::vector<Shape>& shapes,
               std::initializer_list<Layout> layouts = {Layout::contiguous, Layout::fused}) {
  std::uint64_t seed = 1;
  for (const Shape& s : shapes) {
    for (bool causal : {true, false}) {
      for (Layout layout : layouts) check_case({dtype, s, causal, layout}, seed++);
    }
  }
}

constexpr std::initializer_list<Layout> kAllLayouts = {Layout::contiguous, Layout::fused, Layout::unaligned};

// ---- device tests ----

TEST(CudaAttention, F32MatchesCpuReference) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  run_cases(DType::f32, {{1, 1, 1, 32}, {2, 3, 7, 64}, {1, 2, 127, 128}, {1, 1, 128, 32}, {2, 2, 1000, 64},
                         {1, 1, 1024, 32}, {1, 2, 200, 128}, {3, 1, 65, 64}});
}

// bf16 with the default setting: the tensor-core kernels (every device these builds target is sm_80+).
TEST(CudaAttention, Bf16MatchesCpuReferenceOnRoundedInputs) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  run_cases(DType::bf16, {{1, 1, 1, 64}, {2, 3, 7, 32}, {1, 2, 127, 128}, {2, 2, 1000, 64}, {1, 1, 1024, 128}});
}

// The tensor-core kernels on the shapes that stress their tiling: T = 1, 17 (one partial tile), 64 (exactly
// one), 100 (a full and a partial one), 1024 (many; causal skipping), D = 64 and 128 (32- and 64-row steps),
// several B * H, all three layouts (the unaligned one takes the element-wise loads).
TEST(CudaAttention, Bf16TensorCoresMatchCpuReference) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  KernelsSetting setting(cuda::AttentionKernels::automatic);
  ASSERT_TRUE(cuda::attention_uses_tensor_cores(DType::bf16, 64, 0));
  run_cases(DType::bf16,
            {{1, 1, 1, 64}, {2, 3, 17, 64}, {1, 2, 64, 128}, {2, 2, 100, 128}, {3, 1, 100, 64}, {1, 3, 1024, 64},
             {2, 1, 1024, 128}},
            kAllLayouts);
}

TEST(CudaAttention, F16TensorCoresMatchCpuReference) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  ASSERT_TRUE(cuda::attention_uses_tensor_cores(DType::f16, 64, 0));
  run_cases(DType::f16,
            {{1, 1, 1, 32}, {2, 3, 17, 64}, {1, 2, 64, 128}, {2, 2, 100, 128}, {2, 2, 100, 32}, {1, 2, 1024, 64},
             {1, 1, 1024, 128}},
            kAllLayouts);
  check_case({DType::f16, {1, 2, 300, 64}, false, Layout::fused, 0.5}, 301);
}

// bf16 forced onto the CUDA-core kernels: they stay correct (and remain the fallback below sm_80).
TEST(CudaAttention, Bf16CudaCoreKernelsMatchCpuReference) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  KernelsSetting setting(cuda::AttentionKernels::cuda_cores);
  ASSERT_FALSE(cuda::attention_uses_tensor_cores(DType::bf16, 64, 0));
  run_cases(DType::bf16, {{1, 1, 1, 64}, {2, 3, 17, 32}, {1, 2, 100, 128}, {1, 2, 1024, 64}});
}

TEST(CudaAttention, Bf16TensorCoresMatchCudaCoreKernels) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  std::uint64_t seed = 401;
  for (const Shape& s : std::vector<Shape>{{1, 1, 1, 64}, {2, 3, 17, 128}, {1, 2, 100, 64}, {2, 4, 1024, 64},
                                           {1, 2, 1024, 128}, {2, 2, 77, 32}}) {
    for (bool causal : {true, false}) compare_kernels({DType::bf16, s, causal, Layout::fused}, seed++);
  }
}

// f32 always runs on CUDA cores, f16 always on tensor cores, bf16 as set (sm_80+ assumed, as above).
TEST(CudaAttention, KernelChoiceFollowsDtypeAndSetting) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (std::int64_t D : {32, 64, 128}) {
    SCOPED_TRACE(fmt::format("D={}", D));
    {
      KernelsSetting setting(cuda::AttentionKernels::automatic);
      EXPECT_FALSE(cuda::attention_uses_tensor_cores(DType::f32, D, 0));
      EXPECT_TRUE(cuda::attention_uses_tensor_cores(DType::bf16, D, 0));
      EXPECT_TRUE(cuda::attention_uses_tensor_cores(DType::f16, D, 0));
    }
    KernelsSetting setting(cuda::AttentionKernels::cuda_cores);
    EXPECT_FALSE(cuda::attention_uses_tensor_cores(DType::f32, D, 0));
    EXPECT_FALSE(cuda::attention_uses_tensor_cores(DType::bf16, D, 0));
    EXPECT_TRUE(cuda::attention_uses_tensor_cores(DType::f16, D, 0));
  }
}

TEST(CudaAttention, LongSequenceAndOtherScale) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  check_case({DType::f32, {1, 1, 4097, 32}, true, Layout::contiguous}, 101);
  check_case({DType::bf16, {1, 1, 4097, 64}, true, Layout::fused}, 102);
  check_case({DType::bf16, {1, 2, 300, 128}, false, Layout::fused, 0.5}, 105);
  check_case({DType::f32, {1, 2, 300, 64}, false, Layout::fused, 0.5}, 103);
  check_case({DType::f32, {2, 1, 70, 128}, true, Layout::contiguous, 0.05}, 104);
}

// B * H in the thousands: the flat head index is split into (batch, head) with the right strides.
TEST(CudaAttention, ManyHeads) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  check_case({DType::f32, {64, 48, 5, 32}, true, Layout::fused}, 201);
  check_case({DType::bf16, {40, 64, 3, 64}, false, Layout::contiguous}, 202);
  check_case({DType::f16, {30, 70, 9, 128}, true, Layout::fused}, 203);
}

// ---- argument checks: before any device work, so they run wherever CUDA is built ----

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no exception)";
}

// The kernel setting is a plain value, with or without CUDA.
TEST(CudaAttentionArgs, KernelSettingIsKept) {
  KernelsSetting outer(cuda::AttentionKernels::cuda_cores);
  EXPECT_EQ(cuda::attention_kernels(), cuda::AttentionKernels::cuda_cores);
  {
    KernelsSetting inner(cuda::AttentionKernels::automatic);
    EXPECT_EQ(cuda::attention_kernels(), cuda::AttentionKernels::automatic);
  }
  EXPECT_EQ(cuda::attention_kernels(), cuda::AttentionKernels::cuda_cores);
}

TEST(CudaAttentionArgs, RejectsBadArgumentsWithAClearMessage) {
  float dummy[64] = {};
  float* p = dummy;
  const HeadLayout l{4 * 64, 64, 64};  // B, H = 1; T = 4; D = 32 or 64 (row stride 64 covers both)
  auto fwd = [&](std::int64_t D, DType dtype, HeadLayout lo = {4 * 64, 64, 64}, std::int64_t T = 4,
                 bool null_q = false, double scale = 0.125) {
    const void* q = null_q ? nullptr : p;
    return message_of([&] { cuda::attention_forward(p, lo, p, q, l, p, l, p, l, 1, 1, T, D, scale, true, dtype, 0); });
  };
  if (!cuda::built_with_cuda()) {
    EXPECT_EQ(fwd(64, DType::f32), "cuda::attention_forward: memtrain was built without CUDA");
    EXPECT_EQ(message_of([&] {
                cuda::attention_backward(p, l, p, l, p, l, p, l, p, l, p, l, p, l, p, l, p, 1, 1, 4, 64, 0.125, true,
                                         DType::f32, 0);
              }),
              "cuda::attention_backward: memtrain was built without CUDA");
    EXPECT_EQ(message_of([] { cuda::attention_uses_tensor_cores(DType::bf16, 64, 0); }),
              "cuda::attention_uses_tensor_cores: memtrain was built without CUDA");
    return;
  }
  auto has = [](const std::string& what, const std::string& part) {
    return what.rfind("cuda::attention_", 0) == 0 && what.find(part) != std::string::npos;
  };
  EXPECT_PRED2(has, fwd(48, DType::f32), "head dim D=48 is not supported (32, 64, 128)");
  EXPECT_PRED2(has, fwd(256, DType::bf16), "head dim D=256 is not supported");
  EXPECT_PRED2(has, fwd(64, DType::f64), "dtype f64 is not supported (f32, bf16, f16)");
  EXPECT_PRED2(has, fwd(48, DType::f16), "head dim D=48 is not supported (32, 64, 128)");
  EXPECT_PRED2(has, fwd(64, DType::f32, HeadLayout{4 * 64, 64, 32}), "out row stride 32 is less than D=64");
  EXPECT_PRED2(has, fwd(64, DType::f32, HeadLayout{-1, 64, 64}), "out has a negative stride");
  EXPECT_PRED2(has, fwd(64, DType::f32, l, -3), "negative size B=1 H=1 T=-3");
  EXPECT_PRED2(has, fwd(64, DType::f32, l, std::int64_t{1} << 31), "larger than 2^30");
  EXPECT_PRED2(has, fwd(64, DType::f32, l, 4, true), "q is a null pointer");
  EXPECT_PRED2(has, fwd(64, DType::f32, l, 4, false, std::nan("")), "is not finite");
  EXPECT_PRED2(has,
               message_of([&] {
                 cuda::attention_backward(p, l, nullptr, l, p, l, p, l, p, l, p, l, p, l, p, l, p, 1, 1, 4, 64, 0.125,
                                          false, DType::f32, 0);
               }),
               "dk is a null pointer");
  EXPECT_PRED2(has,
               message_of([&] {
                 cuda::attention_backward(p, l, p, l, p, HeadLayout{256, 64, 8}, p, l, p, l, p, l, p, l, p, l, p, 1, 1,
                                          4, 32, 0.125, false, DType::f32, 0);
               }),
               "dv row stride 8 is less than D=32");
  EXPECT_PRED2(has,
               message_of([&] {
                 cuda::attention_backward(p, l, p, l, p, l, p, l, p, l, p, l, p, l, p, l, p, 1, 1, 4, 100, 0.125,
                                          false, DType::bf16, 0);
               }),
               "cuda::attention_backward: head dim D=100 is not supported");
  // Nothing to do: no pointer is looked at and no device is needed.
  EXPECT_NO_THROW(cuda::attention_forward(nullptr, l, nullptr, nullptr, l, nullptr, l, nullptr, l, 0, 4, 16, 64, 0.1,
                                          true, DType::f32, 0));
  EXPECT_NO_THROW(cuda::attention_backward(nullptr, l, nullptr, l, nullptr, l, nullptr, l, nullptr, l, nullptr, l,
                                           nullptr, l, nullptr, l, nullptr, 2, 4, 0, 64, 0.1, true, DType::bf16, 0));
  // Valid arguments without a device: the message says why.
  if (!cuda::is_available()) {
    const std::string what = fwd(64, DType::f32);
    EXPECT_EQ(what.rfind("cuda::attention_forward: ", 0), 0u) << what;
    EXPECT_NE(what.find(cuda::unavailable_reason()), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace memtrain

// Strided copies and dtype conversions of CUDA tensors (src/cuda/strided.h and Tensor::copy_, fill_,
// contiguous(), to(dtype), to(device) on cuda:0) against the same operations on the CPU.
// Tolerance: none. Copies move bits, and conversions follow the CPU's rules bit for bit (cuda::cast for
// floating dtypes, cpu::convert itself for integer/bool ones), so every result must equal the CPU's byte
// for byte. Destinations are views into a base filled with 0xFF, and the whole base is compared, so an
// element the kernel misses (still 0xFF) or a write outside the view shows up; fresh results (contiguous(),
// to()) come from a device cache filled with 0xFF first.
// The one exception is the autograd case through layer_norm, whose CUDA and CPU kernels sum in different
// orders: out normwise 2e-5, gradients 1e-4 (as tests/test_cuda_ops.cpp, same reason).
// Argument errors of cuda::strided_copy run in every CUDA build (they throw before touching a device);
// everything else needs a device and skips without one.
#include "memtrain/core/error.h"
#include "memtrain/core/tensor.h"
#include "cuda/device_ops.h"
#include "cuda/strided.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/nn.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace memtrain {
namespace {

#define SKIP_WITHOUT_DEVICE()                                              \
  do {                                                                     \
    if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason(); \
  } while (0)

const Device kCuda = Device::cuda(0);
constexpr DType kAllDtypes[] = {DType::f64, DType::f32, DType::f16, DType::bf16, DType::f8_e4m3, DType::f8_e5m2,
                                DType::i8,  DType::u8,  DType::i32, DType::i64,  DType::boolean};

using ViewFn = std::function<Tensor(const Tensor&)>;
const ViewFn kWhole = [](const Tensor& t) { return t; };

std::string name_of(DType dtype, const Shape& shape) { return std::string(dtype_name(dtype)) + " " + shape_str(shape); }

// ---- inputs ----

// Random bytes: any bit pattern (NaNs included), fine for copies, which move bits.
Tensor random_bytes(const Shape& shape, DType dtype, std::uint64_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  std::mt19937_64 rng(seed);
  auto* p = static_cast<std::uint8_t*>(t.data_ptr());
  for (std::size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<std::uint8_t>(rng());
  return t;
}

// Values for conversions: normal(0, 30^2) with every ~16th element a special (NaN, +-Inf, -0, a value
// below every subnormal, f16 / fp8 / f32 overflow, ties), rounded to `dtype` by the CPU rules.
Tensor random_values(const Shape& shape, DType dtype, std::uint64_t seed) {
  static const double kSpecials[] = {std::numeric_limits<double>::quiet_NaN(),
                                     std::numeric_limits<double>::infinity(),
                                     -std::numeric_limits<double>::infinity(),
                                     -0.0,
                                     1e-40,
                                     -3e-42,
                                     65520.0,
                                     -70000.0,
                                     500.0,
                                     3.5e38,
                                     1e300,
                                     1.0 + 1.0 / 256.0,
                                     -2.5,
                                     1e10};
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, 30.0);
  std::vector<double> v(static_cast<std::size_t>(shape_numel(shape)));
  for (double& x : v) x = rng() % 16 == 0 ? kSpecials[rng() % std::size(kSpecials)] : dist(rng);
  return from_buffer(v.data(), shape, DType::f64, dtype);
}

// A CPU tensor of `shape` whose bytes are all 0xFF (NaN for the float types).
Tensor poisoned(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  std::memset(t.data_ptr(), 0xFF, t.nbytes());
  return t;
}

// Leaves the next device allocations of these byte sizes 0xFF-filled: allocate, fill, free to the cache.
void poison_device_cache(const std::vector<std::size_t>& sizes) {
  std::vector<Tensor> hold;
  for (std::size_t n : sizes) {
    for (int copy = 0; copy < 4 && n > 0; ++copy) {
      Tensor t = Tensor::empty({static_cast<std::int64_t>(n)}, DType::u8, kCuda);
      t.fill_(255.0);
      hold.push_back(t);
    }
  }
}

// ---- comparing ----

// Every byte of the tensor's whole storage (not only its view), copied to the host.
std::vector<std::uint8_t> storage_bytes(const Tensor& t) {
  std::vector<std::uint8_t> out(t.storage()->nbytes());
  if (!out.empty()) cuda::copy(out.data(), Device::cpu(), t.storage()->data(), t.device(), out.size());
  return out;
}

// The view's elements, row-major, as bytes (to the host, made contiguous there).
std::vector<std::uint8_t> view_bytes(const Tensor& t) {
  const Tensor h = t.detach().to(Device::cpu()).contiguous();
  const auto* p = static_cast<const std::uint8_t*>(h.data_ptr());
  return std::vector<std::uint8_t>(p, p + h.nbytes());
}

void expect_same_bytes(const std::vector<std::uint8_t>& got, const std::vector<std::uint8_t>& want,
                       const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " bytes differ, first at byte " << first
                     << " (got 0x" << std::hex << (bad ? +got[first] : 0) << ", want 0x" << (bad ? +want[first] : 0)
                     << std::dec << ")";
}

// A result of the CUDA path equals the CPU one: same shape, dtype, device kind, elements.
void expect_same_tensor(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  EXPECT_TRUE(got.device().is_cuda()) << what << " is on " << got.device().str();
  EXPECT_EQ(shape_str(got.shape()), shape_str(want.shape())) << what;
  EXPECT_EQ(got.dtype(), want.dtype()) << what;
  expect_same_bytes(view_bytes(got), view_bytes(want), what);
}

// dst_view(dst base, 0xFF) .copy_( src_view(src base) ) on the CPU and on cuda:0; the whole destination
// bases must match byte for byte. The source holds random bytes when no conversion happens, else values.
void check_copy(const std::string& what, const Shape& dst_base, DType dst_dtype, const ViewFn& dst_view,
                const Shape& src_base, DType src_dtype, const ViewFn& src_view, std::uint64_t seed) {
  SCOPED_TRACE(what);
  const Tensor src_cpu =
      src_dtype == dst_dtype ? random_bytes(src_base, src_dtype, seed) : random_values(src_base, src_dtype, seed);
  const Tensor dst_cpu = poisoned(dst_base, dst_dtype);
  const Tensor src_dev = src_cpu.to(kCuda), dst_dev = dst_cpu.to(kCuda);
  dst_view(dst_cpu).copy_(src_view(src_cpu));
  dst_view(dst_dev).copy_(src_view(src_dev));
  expect_same_bytes(storage_bytes(dst_dev), storage_bytes(dst_cpu), "destination storage");
  expect_same_bytes(storage_bytes(src_dev), storage_bytes(src_cpu), "source storage (unchanged)");
}

// Same dtype on both sides.
void check_copy(const std::string& what, DType dtype, const Shape& dst_base, const ViewFn& dst_view,
                const Shape& src_base, const ViewFn& src_view, std::uint64_t seed) {
  check_copy(what, dst_base, dtype, dst_view, src_base, dtype, src_view, seed);
}

ViewFn transposed() {
  return [](const Tensor& t) { return t.transpose(0, 1); };
}
ViewFn permuted(const Shape& dims) {
  return [dims](const Tensor& t) { return t.permute(dims); };
}

// Expects f to throw memtrain::Error whose message contains every needle.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "expected memtrain::Error mentioning " << needles.front();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << msg << "' lacks '" << n << "'";
  }
}

// ---- argument errors (no device needed) ----

TEST(CudaStridedArgs, BadArgumentsThrowBeforeTheDevice) {
  const std::int64_t shape[] = {3, 4}, strides[] = {4, 1};
  float buf[12] = {};
  if (!cuda::built_with_cuda()) {
    expect_error([&] { cuda::strided_copy(buf, strides, buf, strides, shape, 2, 4, 0); },
                 {"cuda::strided_copy", "built without CUDA"});
    return;
  }
  // Host pointers are fine here: every call throws before anything is enqueued.
  expect_error([&] { cuda::strided_copy(buf, strides, buf + 1, strides, shape, 2, 3, 0); },
               {"cuda::strided_copy", "element size 3"});
  expect_error([&] { cuda::strided_copy(buf, strides, buf + 1, strides, shape, -1, 4, 0); },
               {"cuda::strided_copy", "negative rank"});
  expect_error([&] { cuda::strided_copy(buf, strides, buf + 1, strides, nullptr, 2, 4, 0); },
               {"cuda::strided_copy", "null shape or strides"});
  const std::int64_t negative[] = {3, -4};
  expect_error([&] { cuda::strided_copy(buf, strides, buf + 1, strides, negative, 2, 4, 0); },
               {"cuda::strided_copy", "negative extent -4"});
  expect_error([&] { cuda::strided_copy(nullptr, strides, buf, strides, shape, 2, 4, 0); },
               {"cuda::strided_copy", "null pointer"});
  const std::int64_t huge_shape[] = {std::int64_t{1} << 40, 4}, huge_strides[] = {std::int64_t{1} << 30, 1};
  expect_error([&] { cuda::strided_copy(buf, huge_strides, buf + 1, strides, huge_shape, 2, 4, 0); },
               {"cuda::strided_copy", "overflows 64-bit offsets"});
  // An empty extent is nothing to do: no pointer is needed and no device is touched.
  const std::int64_t empty[] = {3, 0};
  EXPECT_NO_THROW(cuda::strided_copy(nullptr, strides, nullptr, strides, empty, 2, 4, 0));
}

// ---- copies of one dtype ----

TEST(CudaStridedCopy, TransposesMatchCpu) {
  SKIP_WITHOUT_DEVICE();
  const std::vector<Shape> shapes = {{1, 1}, {3, 5}, {127, 33}, {64, 64}, {1000, 3}, {4097, 2}, {4097, 1000}};
  std::uint64_t seed = 10;
  for (DType dtype : {DType::f32, DType::bf16, DType::f64, DType::u8}) {
    for (const Shape& s : shapes) {
      const Shape t = {s[1], s[0]};
      check_copy("contiguous <- transposed " + name_of(dtype, s), dtype, t, kWhole, s, transposed(), ++seed);
      check_copy("transposed <- contiguous " + name_of(dtype, s), dtype, s, transposed(), t, kWhole, ++seed);
      check_copy("transposed <- transposed " + name_of(dtype, s), dtype, s, transposed(), s, transposed(), ++seed);
    }
  }
}

TEST(CudaStridedCopy, SlicesWithOffsetsMatchCpu) {
  SKIP_WITHOUT_DEVICE();
  std::uint64_t seed = 20;
  for (DType dtype : {DType::f32, DType::f16, DType::i64, DType::i8}) {
    // [5, 64] out of [7, 130]: offset 2 rows + 3 columns, every other column.
    const ViewFn src = [](const Tensor& t) { return t.slice(0, 2, 7).slice(1, 3, 130, 2); };
    check_copy("contiguous <- stepped slice " + name_of(dtype, {5, 64}), dtype, {5, 64}, kWhole, {7, 130}, src, ++seed);
    // Into [5, 64] of [10, 129]: every other row, odd columns.
    const ViewFn dst = [](const Tensor& t) { return t.slice(0, 0, 10, 2).slice(1, 1, 129, 2); };
    check_copy("stepped slice <- contiguous " + name_of(dtype, {5, 64}), dtype, {10, 129}, dst, {5, 64}, kWhole,
               ++seed);
    check_copy("stepped slice <- stepped slice " + name_of(dtype, {5, 64}), dtype, {10, 129}, dst, {7, 130}, src,
               ++seed);
    // 1-D: every third element from offset 2, and a narrow of a row-major block (one contiguous run).
    const ViewFn every3 = [](const Tensor& t) { return t.slice(0, 2, 3 * 4097, 3); };
    check_copy("1-D step 3 " + std::string(dtype_name(dtype)), dtype, {4097}, kWhole, {3 * 4097}, every3, ++seed);
    const ViewFn rows = [](const Tensor& t) { return t.narrow(0, 3, 100); };
    check_copy("row narrow " + std::string(dtype_name(dtype)), dtype, {127, 33}, rows, {200, 33}, rows, ++seed);
    // select drops a dim and keeps an offset.
    const ViewFn column = [](const Tensor& t) { return t.select(1, 7); };
    check_copy("column select " + std::string(dtype_name(dtype)), dtype, {1000}, kWhole, {1000, 9}, column, ++seed);
  }
}

TEST(CudaStridedCopy, ExpandedSourcesMatchCpu) {
  SKIP_WITHOUT_DEVICE();
  struct Case {
    Shape base, to;
  };
  const std::vector<Case> cases = {{{1, 5}, {127, 5}},     {{3, 1, 4}, {3, 6, 4}}, {{}, {1000}},
                                   {{4097, 1}, {4097, 3}}, {{1}, {2, 3, 5}},       {{1, 1}, {1, 1}}};
  std::uint64_t seed = 30;
  for (DType dtype : {DType::f32, DType::bf16, DType::u8, DType::f64}) {
    for (const Case& c : cases) {
      const Shape to = c.to;
      const ViewFn expand = [to](const Tensor& t) { return t.expand(to); };
      check_copy("contiguous <- expanded " + shape_str(c.base) + " to " + name_of(dtype, to), dtype, to, kWhole, c.base,
                 expand, ++seed);
      // Into a transposed destination when 2-D or more.
      if (to.size() >= 2) {
        Shape dst_base = to;
        std::swap(dst_base[0], dst_base[1]);
        check_copy("transposed <- expanded " + name_of(dtype, to), dtype, dst_base, transposed(), c.base, expand,
                   ++seed);
      }
    }
  }
}

TEST(CudaStridedCopy, PermutationsMatchCpu) {
  SKIP_WITHOUT_DEVICE();
  std::uint64_t seed = 40;
  for (DType dtype : {DType::f32, DType::bf16}) {
    Shape p3 = {0, 1, 2};
    do {
      const Shape out = {Shape{3, 5, 7}[p3[0]], Shape{3, 5, 7}[p3[1]], Shape{3, 5, 7}[p3[2]]};
      check_copy("3-D permute " + shape_str(p3) + " " + std::string(dtype_name(dtype)), dtype, out, kWhole, {3, 5, 7},
                 permuted(p3), ++seed);
    } while (std::next_permutation(p3.begin(), p3.end()));
    const Shape base4 = {2, 3, 4, 5};
    Shape p4 = {0, 1, 2, 3};
    do {
      Shape out(4);
      for (int i = 0; i < 4; ++i) out[i] = base4[p4[i]];
      check_copy("4-D permute " + shape_str(p4) + " " + std::string(dtype_name(dtype)), dtype, out, kWhole, base4,
                 permuted(p4), ++seed);
    } while (std::next_permutation(p4.begin(), p4.end()));
    // A permuted destination from a differently permuted source, and a bigger odd-sized case.
    check_copy("permuted <- permuted", dtype, {5, 4, 2, 3}, permuted({2, 3, 1, 0}), {4, 3, 5, 2},
               permuted({3, 1, 0, 2}), ++seed);
    check_copy("4-D permute [17, 33, 9, 65]", dtype, {65, 9, 17, 33}, kWhole, {17, 33, 9, 65}, permuted({3, 2, 0, 1}),
               ++seed);
  }
}

TEST(CudaStridedCopy, NarrowOfEveryDtypeSize) {
  SKIP_WITHOUT_DEVICE();
  std::uint64_t seed = 50;
  const ViewFn src = [](const Tensor& t) { return t.narrow(1, 3, 30); };
  const ViewFn dst = [](const Tensor& t) { return t.narrow(0, 1, 5).narrow(1, 2, 30); };
  for (DType dtype : kAllDtypes) {
    check_copy("contiguous <- narrow " + std::string(dtype_name(dtype)), dtype, {5, 30}, kWhole, {5, 37}, src, ++seed);
    check_copy("narrow <- contiguous " + std::string(dtype_name(dtype)), dtype, {6, 40}, dst, {5, 30}, kWhole, ++seed);
    check_copy("narrow <- narrow " + std::string(dtype_name(dtype)), dtype, {6, 40}, dst, {5, 37}, src, ++seed);
    check_copy(
        "narrow <- transposed narrow " + std::string(dtype_name(dtype)), dtype, {6, 40}, dst, {37, 5},
        [](const Tensor& t) { return t.narrow(0, 4, 30).transpose(0, 1); }, ++seed);
  }
}

TEST(CudaStridedCopy, ZeroDimsAndMoreThanEightDims) {
  SKIP_WITHOUT_DEVICE();
  std::uint64_t seed = 60;
  // A 0-d tensor, and a 0-d view into a bigger storage.
  check_copy("0-d", DType::f32, {}, kWhole, {}, kWhole, ++seed);
  check_copy(
      "0-d select", DType::i64, {4}, [](const Tensor& t) { return t.select(0, 2); }, {3},
      [](const Tensor& t) { return t.select(0, 1); }, ++seed);
  // 10 dims with size-1 dims (they drop out, leaving 8 for the kernel), and 9 / 10 dims that cannot merge
  // (the host loops over the dims past the kernel's 8).
  const Shape nine(9, 2), ten(10, 2), ten_ones = {2, 1, 3, 2, 1, 2, 3, 2, 2, 3};
  Shape reverse9(9), reverse10(10), rotate10(10), ten_ones_reversed(10);
  for (int i = 0; i < 9; ++i) reverse9[i] = 8 - i;
  for (int i = 0; i < 10; ++i) {
    reverse10[i] = 9 - i;
    rotate10[i] = (i + 1) % 10;
    ten_ones_reversed[i] = ten_ones[9 - i];
  }
  for (DType dtype : {DType::f32, DType::u8}) {
    check_copy("9-D contiguous", dtype, nine, kWhole, nine, kWhole, ++seed);
    check_copy("9-D reversed", dtype, nine, kWhole, nine, permuted(reverse9), ++seed);
    check_copy("10-D with ones reversed", dtype, ten_ones_reversed, kWhole, ten_ones, permuted(reverse10), ++seed);
    check_copy("10-D reversed <- rotated", dtype, ten, permuted(reverse10), ten, permuted(rotate10), ++seed);
  }
}

TEST(CudaStridedCopy, OverlappingViewsCopyFromASnapshot) {
  SKIP_WITHOUT_DEVICE();
  // Shift every row left by one column inside the same storage, and transpose a square matrix in place.
  // CUDA copies from a snapshot of the source; the reference is the CPU copy from an explicit clone.
  struct Case {
    std::string what;
    Shape base;
    ViewFn dst, src;
  };
  const std::vector<Case> cases = {
      {"shift left",
       {64, 65},
       [](const Tensor& t) { return t.narrow(1, 0, 64); },
       [](const Tensor& t) { return t.narrow(1, 1, 64); }},
      {"shift right",
       {33, 130},
       [](const Tensor& t) { return t.narrow(1, 2, 128); },
       [](const Tensor& t) { return t.narrow(1, 0, 128); }},
      {"in-place transpose", {127, 127}, kWhole, transposed()},
      {"same view", {5, 7}, kWhole, kWhole},
  };
  std::uint64_t seed = 70;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const Tensor base_cpu = random_bytes(c.base, DType::f32, ++seed);
    const Tensor base_dev = base_cpu.to(kCuda);
    c.dst(base_cpu).copy_(c.src(base_cpu).clone());
    c.dst(base_dev).copy_(c.src(base_dev));
    expect_same_bytes(storage_bytes(base_dev), storage_bytes(base_cpu), "storage");
  }
}

TEST(CudaStridedCopy, RawEntryPointTakesNegativeStrides) {
  SKIP_WITHOUT_DEVICE();
  // Tensors never have negative strides, but the raw entry point takes them: reverse the rows and the
  // columns of a [37, 129] i32 matrix into a contiguous one.
  const std::int64_t R = 37, C = 129;
  const Tensor src_cpu = random_bytes({R, C}, DType::i32, 80);
  const Tensor src_dev = src_cpu.to(kCuda);
  const Tensor dst_dev = poisoned({R, C}, DType::i32).to(kCuda);
  const std::int64_t shape[] = {R, C}, dst_strides[] = {C, 1}, src_strides[] = {-C, -1};
  const auto* last = static_cast<const std::int32_t*>(src_dev.data_ptr()) + (R * C - 1);
  cuda::strided_copy(dst_dev.data_ptr(), dst_strides, last, src_strides, shape, 2, 4, 0);
  const std::vector<std::uint8_t> got = storage_bytes(dst_dev);
  std::vector<std::int32_t> want(static_cast<std::size_t>(R * C));
  const auto* s = src_cpu.data<std::int32_t>();
  for (std::int64_t i = 0; i < R * C; ++i) want[static_cast<std::size_t>(i)] = s[R * C - 1 - i];
  std::vector<std::uint8_t> want_bytes(got.size());
  std::memcpy(want_bytes.data(), want.data(), want_bytes.size());
  expect_same_bytes(got, want_bytes, "reversed matrix");
}

// ---- dtype conversions ----

TEST(CudaStridedConvert, CopyConvertsLikeCpu) {
  SKIP_WITHOUT_DEVICE();
  struct Pair {
    DType from, to;
  };
  // Floating pairs convert on the device (cuda::cast); pairs with an integer or bool go through the host.
  const std::vector<Pair> pairs = {
      {DType::f32, DType::bf16},    {DType::bf16, DType::f32},     {DType::f32, DType::f16},
      {DType::f16, DType::f32},     {DType::bf16, DType::f16},     {DType::f64, DType::f32},
      {DType::f32, DType::f8_e4m3}, {DType::f8_e5m2, DType::bf16}, {DType::i32, DType::f32},
      {DType::f32, DType::i64},     {DType::boolean, DType::bf16}, {DType::u8, DType::i32}};
  const std::vector<Shape> shapes = {{1, 1}, {3, 5}, {127, 33}, {1000, 3}, {4097, 2}};
  std::uint64_t seed = 100;
  for (const Pair& p : pairs) {
    for (const Shape& s : shapes) {
      const Shape t = {s[1], s[0]};
      const std::string tag =
          std::string(dtype_name(p.from)) + " -> " + std::string(dtype_name(p.to)) + " " + shape_str(s);
      check_copy("contiguous <- contiguous " + tag, s, p.to, kWhole, s, p.from, kWhole, ++seed);
      check_copy("contiguous <- transposed " + tag, t, p.to, kWhole, s, p.from, transposed(), ++seed);
      check_copy("transposed <- contiguous " + tag, s, p.to, transposed(), t, p.from, kWhole, ++seed);
      const ViewFn cols = [](const Tensor& x) { return x.slice(1, 1, x.size(1)); };
      check_copy("column slice <- transposed " + tag, {t[0], t[1] + 1}, p.to, cols, s, p.from, transposed(), ++seed);
    }
  }
}

TEST(CudaStridedConvert, ToDtypeMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  std::uint64_t seed = 200;
  for (const Shape& s : std::vector<Shape>{{7}, {127, 33}, {4097, 3}}) {
    for (DType from : {DType::f32, DType::bf16, DType::i32}) {
      const Tensor x_cpu = random_values(s, from, ++seed);
      const Tensor x_dev = x_cpu.to(kCuda);
      for (DType to : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i32, DType::boolean}) {
        const std::string tag =
            std::string(dtype_name(from)) + ".to(" + std::string(dtype_name(to)) + ") " + shape_str(s);
        poison_device_cache({static_cast<std::size_t>(shape_numel(s)) * dtype_size(to)});
        const Tensor y = x_dev.to(to);
        expect_same_tensor(y, x_cpu.to(to), tag);
        EXPECT_TRUE(y.is_contiguous()) << tag;
        if (s.size() == 2) {
          poison_device_cache({static_cast<std::size_t>(shape_numel(s)) * dtype_size(to)});
          expect_same_tensor(x_dev.t().to(to), x_cpu.t().to(to), "transposed " + tag);
        }
      }
    }
  }
}

// ---- contiguous(), clone(), fill_, across devices ----

TEST(CudaStridedContiguous, TransposedViewBecomesContiguous) {
  SKIP_WITHOUT_DEVICE();
  std::uint64_t seed = 300;
  for (DType dtype : {DType::f32, DType::bf16, DType::i64}) {
    for (const Shape& s : std::vector<Shape>{{1, 1}, {3, 5}, {127, 33}, {4097, 1000}}) {
      const std::string tag = name_of(dtype, s);
      const Tensor x_cpu = random_bytes(s, dtype, ++seed);
      const Tensor x_dev = x_cpu.to(kCuda);
      poison_device_cache({x_cpu.nbytes()});
      const Tensor y = x_dev.t().contiguous();
      EXPECT_TRUE(y.is_contiguous()) << tag;
      EXPECT_EQ(s[0] == 1 || s[1] == 1, y.shares_storage_with(x_dev)) << tag;  // already contiguous: the same view
      expect_same_tensor(y, x_cpu.t().contiguous(), "t().contiguous() " + tag);
      poison_device_cache({x_cpu.nbytes()});
      const Tensor c = x_dev.narrow(1, s[1] / 2, s[1] - s[1] / 2).clone();
      expect_same_tensor(c, x_cpu.narrow(1, s[1] / 2, s[1] - s[1] / 2).clone(), "narrow clone " + tag);
      EXPECT_TRUE(x_dev.contiguous().shares_storage_with(x_dev)) << tag;
    }
  }
}

TEST(CudaStridedFill, NonContiguousViewsMatchCpu) {
  SKIP_WITHOUT_DEVICE();
  struct Case {
    std::string what;
    Shape base;
    ViewFn view;
  };
  const std::vector<Case> cases = {
      {"transposed slice", {33, 127}, [](const Tensor& t) { return t.slice(1, 1, 127, 3).t(); }},
      {"stepped rows", {10, 1000}, [](const Tensor& t) { return t.slice(0, 1, 10, 2); }},
      {"column", {4097, 3}, [](const Tensor& t) { return t.select(1, 2); }},
      {"expanded",
       {1, 5},
       [](const Tensor& t) {
         return t.expand({7, 5});
       }},
      {"permuted narrow",
       {4, 6, 9},
       [](const Tensor& t) {
         return t.narrow(2, 1, 7).permute({2, 0, 1});
       }},
  };
  std::uint64_t seed = 400;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::i64, DType::u8, DType::f8_e4m3}) {
    for (const Case& c : cases) {
      for (double value : {-1.5, 3.0e5, 0.0}) {
        const std::string tag = c.what + " " + std::string(dtype_name(dtype)) + " = " + std::to_string(value);
        SCOPED_TRACE(tag);
        const Tensor base_cpu = random_bytes(c.base, dtype, ++seed);
        const Tensor base_dev = base_cpu.to(kCuda);
        c.view(base_cpu).fill_(value);
        c.view(base_dev).fill_(value);
        expect_same_bytes(storage_bytes(base_dev), storage_bytes(base_cpu), "storage");
      }
    }
  }
}

TEST(CudaStridedCrossDevice, NonContiguousBothWays) {
  SKIP_WITHOUT_DEVICE();
  const Shape s = {127, 33}, t = {33, 127};
  // Columns 1.. of a wider matrix: a non-contiguous destination on either device.
  const ViewFn cols = [](const Tensor& x) { return x.slice(1, 1, x.size(1)); };
  std::uint64_t seed = 500;
  for (DType from : {DType::f32, DType::bf16, DType::i32}) {
    for (DType to : {DType::f32, DType::bf16, DType::i64}) {
      const std::string tag = std::string(dtype_name(from)) + " -> " + std::string(dtype_name(to));
      SCOPED_TRACE(tag);
      // host transposed -> device column slice, and device transposed -> host column slice.
      const Tensor src_cpu = from == to ? random_bytes(s, from, ++seed) : random_values(s, from, ++seed);
      const Tensor src_dev = src_cpu.to(kCuda);
      const Tensor want = poisoned({t[0], t[1] + 1}, to);
      cols(want).copy_(src_cpu.t());
      const Tensor to_dev = poisoned({t[0], t[1] + 1}, to).to(kCuda);
      cols(to_dev).copy_(src_cpu.t());
      expect_same_bytes(storage_bytes(to_dev), storage_bytes(want), "cpu -> cuda");
      const Tensor to_host = poisoned({t[0], t[1] + 1}, to);
      cols(to_host).copy_(src_dev.t());
      expect_same_bytes(storage_bytes(to_host), storage_bytes(want), "cuda -> cpu");
    }
  }
  // to(Device) of a non-contiguous device view.
  const Tensor x_cpu = random_bytes(s, DType::f32, ++seed);
  const Tensor back = x_cpu.to(kCuda).t().to(Device::cpu());
  EXPECT_TRUE(back.device().is_cpu());
  expect_same_bytes(view_bytes(back), view_bytes(x_cpu.t()), "to(cpu) of a transposed view");
}

// ---- autograd ----

// Normal(0, 1) f32 values on the CPU.
Tensor random_normal(const Shape& shape, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (float& x : v) x = dist(rng);
  return from_buffer(v.data(), shape, DType::f32, DType::f32);
}

// ||got - want|| / ||want|| <= tol, got on the device, want on the CPU, both f32.
void expect_normwise(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << ": no CUDA result";
  ASSERT_TRUE(want.defined()) << what << ": no CPU result";
  EXPECT_TRUE(got.device().is_cuda()) << what;
  ASSERT_EQ(shape_str(got.shape()), shape_str(want.shape())) << what;
  const Tensor g = got.detach().to(Device::cpu()).to(DType::f64).contiguous();
  const Tensor w = want.detach().to(DType::f64).contiguous();
  double diff2 = 0, ref2 = 0;
  for (std::int64_t i = 0; i < g.numel(); ++i) {
    const double a = g.data<double>()[i], b = w.data<double>()[i];
    diff2 += (a - b) * (a - b);
    ref2 += b * b;
  }
  EXPECT_LE(std::sqrt(diff2 / ref2), tol) << what;  // NaN fails too
}

TEST(CudaStridedAutograd, TransposedViewGradientMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  std::uint64_t seed = 600;
  for (const Shape& shape : std::vector<Shape>{{4, 6}, {33, 127}}) {
    SCOPED_TRACE("x " + shape_str(shape));
    const Tensor x0 = random_normal(shape, ++seed);
    const Tensor weight0 = random_normal({shape[0]}, ++seed), bias0 = random_normal({shape[0]}, ++seed);
    const Tensor w = random_normal({shape[1], shape[0]}, ++seed);
    {
      SCOPED_TRACE("x.t().contiguous(): the leaf's gradient is w^T, cloned from a transposed view");
      Tensor xc = x0.detach().set_requires_grad(true), xd = x0.to(kCuda).set_requires_grad(true);
      xc.t().contiguous().backward(w);
      poison_device_cache({x0.nbytes()});
      xd.t().contiguous().backward(w.to(kCuda));
      expect_same_tensor(xd.grad(), xc.grad(), "x.grad");
      EXPECT_TRUE(xd.grad().is_contiguous());
    }
    {
      SCOPED_TRACE("x.to(bf16).t().contiguous(): to(dtype) backward converts the gradient back on the device");
      Tensor xc = x0.detach().set_requires_grad(true), xd = x0.to(kCuda).set_requires_grad(true);
      const Tensor wb = w.to(DType::bf16);
      xc.to(DType::bf16).t().contiguous().backward(wb);
      xd.to(DType::bf16).t().contiguous().backward(wb.to(kCuda));
      expect_same_tensor(xd.grad(), xc.grad(), "x.grad");
      EXPECT_EQ(xd.grad().dtype(), DType::f32);
    }
    {
      SCOPED_TRACE("layer_norm(x.t().contiguous(), weight, bias)");
      Tensor xc = x0.detach().set_requires_grad(true), xd = x0.to(kCuda).set_requires_grad(true);
      Tensor wc = weight0.detach().set_requires_grad(true), wd = weight0.to(kCuda).set_requires_grad(true);
      Tensor bc = bias0.detach().set_requires_grad(true), bd = bias0.to(kCuda).set_requires_grad(true);
      const Tensor yc = ops::layer_norm(xc.transpose(0, 1).contiguous(), wc, bc, 1e-5);
      const Tensor yd = ops::layer_norm(xd.transpose(0, 1).contiguous(), wd, bd, 1e-5);
      expect_normwise(yd, yc, 2e-5, "y");
      yc.backward(w);
      poison_device_cache({x0.nbytes(), weight0.nbytes()});
      yd.backward(w.to(kCuda));
      expect_normwise(xd.grad(), xc.grad(), 1e-4, "x.grad");
      expect_normwise(wd.grad(), wc.grad(), 1e-4, "weight.grad");
      expect_normwise(bd.grad(), bc.grad(), 1e-4, "bias.grad");
    }
  }
}

}  // namespace
}  // namespace memtrain

namespace memtrain {
namespace {

// add/mul take strided CUDA operands (packed first), and a leaf accumulates gradients that arrive as
// transposed views: the second backward adds a strided gradient into the first.
TEST(CudaStridedAutograd, StridedOperandsAndAccumulatedTransposedGradients) {
  SKIP_WITHOUT_DEVICE();
  const Tensor a = random_normal({5, 7}, 700), b = random_normal({7, 5}, 701);
  const Tensor ad = a.to(kCuda), bd = b.to(kCuda);
  expect_same_tensor(ops::add(ad, bd.t()), ops::add(a, b.t()), "add(a, b^T)");
  expect_same_tensor(ops::mul(ad.t(), bd), ops::mul(a.t(), b), "mul(a^T, b)");
  Tensor acc = a.clone(), accd = ad.clone();
  ops::add_(acc, b.t());
  ops::add_(accd, bd.t());
  expect_same_tensor(accd, acc, "add_(acc, b^T)");

  Tensor xc = a.detach().set_requires_grad(true), xd = ad.detach().set_requires_grad(true);
  const Tensor w1 = random_normal({7, 5}, 702), w2 = random_normal({7, 5}, 703);
  xc.t().contiguous().backward(w1);
  xc.t().contiguous().backward(w2);
  xd.t().contiguous().backward(w1.to(kCuda));
  xd.t().contiguous().backward(w2.to(kCuda));
  expect_same_tensor(xd.grad(), xc.grad(), "x.grad after two backward passes");
}

}  // namespace
}  // namespace memtrain

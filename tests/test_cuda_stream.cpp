// CUDA streams and events (src/cuda/stream.h): events time work, Stream::wait orders work
// across streams, StreamGuard nests and sends memtrain's launches to its stream, ops run on a
// non-default stream match the CPU, and the device allocator keeps freed blocks on their own stream.
// Tolerances: f32 ops compare normwise (||cuda - cpu|| / ||cpu||) at 1e-5 (add: exact in both; matmul and
// attention: f32 with different summation orders, a few ulps). Everything but the first test needs a
// device and skips without one; the first runs everywhere.
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/core/tensor.h"
#include "cuda/device_ops.h"
#include "cuda/stream.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/linalg.h"
#include "memtrain/ops/nn.h"

#include "cuda_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace memtrain {
namespace {

#define SKIP_WITHOUT_DEVICE()                                              \
  do {                                                                     \
    if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason(); \
  } while (0)

// The message of the Error f throws ("(no error)" when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(CudaStream, CreatingWithoutAUsableDeviceThrowsNamingCuda) {
  EXPECT_TRUE(cuda::default_stream_is_current(0));
  // Without CUDA or a device: device 0; with devices: an index past the last one.
  const int device = cuda::is_available() ? cuda::device_count() : 0;
  const std::string stream_msg = error_of([&] { cuda::Stream s(device); });
  EXPECT_NE(stream_msg.find("cuda::Stream"), std::string::npos) << stream_msg;
  const std::string event_msg = error_of([&] { cuda::Event e(device); });
  EXPECT_NE(event_msg.find("cuda::Event"), std::string::npos) << event_msg;
  if (!cuda::built_with_cuda()) EXPECT_NE(stream_msg.find("built without CUDA"), std::string::npos) << stream_msg;
}

// ---- with a device ----

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

Tensor random_tensor(const Shape& shape, std::uint64_t seed) {
  const auto v = random_floats(static_cast<std::size_t>(shape_numel(shape)), seed);
  return from_buffer(v.data(), shape, DType::f32, DType::f32);
}

// ||got - want|| / ||want|| over f32 tensors of one shape (both copied to the CPU here).
double normwise_error(const Tensor& got, const Tensor& want) {
  const Tensor g = got.to(Device::cpu()).contiguous(), w = want.to(Device::cpu()).contiguous();
  EXPECT_EQ(g.shape(), w.shape());
  double diff = 0, norm = 0;
  for (std::int64_t i = 0; i < w.numel(); ++i) {
    const double a = g.data<float>()[i], b = w.data<float>()[i];
    if (std::isnan(a)) return INFINITY;
    diff += (a - b) * (a - b);
    norm += b * b;
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

// Keeps the current stream of cuda:0 busy for a while (tens of milliseconds on an H200): repeated
// in-place adds over a 256 MiB buffer.
void busy_work(float* x, std::size_t n, int reps) {
  for (int i = 0; i < reps; ++i) cuda::add(x, x, x, DType::f32, n, 0);
}

TEST(CudaStream, EventsTimeWorkOnAStream) {
  SKIP_WITHOUT_DEVICE();
  constexpr std::size_t n = std::size_t{64} << 20;  // 256 MiB of f32
  test_support::DeviceBuffer x(n * sizeof(float));
  cuda::fill(x.get(), DType::f32, n, 0.0, 0);
  cuda::Stream stream(0);
  cuda::Event start(0), end(0);
  start.record(stream);
  {
    cuda::StreamGuard guard(stream);
    busy_work(x.at<float>(), n, 20);
  }
  end.record(stream);
  end.synchronize();
  EXPECT_TRUE(end.query());
  EXPECT_TRUE(stream.query());
  const float ms = cuda::Event::elapsed_ms(start, end);
  EXPECT_GT(ms, 0.0f);
  EXPECT_LT(ms, 60'000.0f);
  // Event::record() with no stream marks the current stream: the legacy one here.
  cuda::Event after(0);
  after.record();
  after.synchronize();
  EXPECT_TRUE(after.query());
}

// Work enqueued under a StreamGuard goes to its stream: right after enqueueing ~tens of ms of work there
// the stream is still busy (had the launches gone to the legacy stream, the stream would be idle).
TEST(CudaStream, LaunchesUnderAGuardGoToItsStream) {
  SKIP_WITHOUT_DEVICE();
  constexpr std::size_t n = std::size_t{64} << 20;
  test_support::DeviceBuffer x(n * sizeof(float));
  cuda::fill(x.get(), DType::f32, n, 0.0, 0);
  cuda::synchronize(0);
  cuda::Stream stream(0);
  EXPECT_TRUE(stream.query());
  {
    cuda::StreamGuard guard(stream);
    busy_work(x.at<float>(), n, 200);
  }
  EXPECT_FALSE(stream.query()) << "200 adds over 256 MiB finished before the host could ask";
  stream.synchronize();
  EXPECT_TRUE(stream.query());
}

// A's long chain doubles x; B waits on an event recorded after it and then overwrites x and derives y.
// Without the wait, A's doubling (enqueued first) could still be running when B's fill lands.
TEST(CudaStream, WaitOrdersWorkOnAnotherStream) {
  SKIP_WITHOUT_DEVICE();
  constexpr std::size_t n = std::size_t{64} << 20;
  test_support::DeviceBuffer x(n * sizeof(float)), y(n * sizeof(float));
  cuda::fill(x.get(), DType::f32, n, 1.0, 0);
  cuda::fill(y.get(), DType::f32, n, NAN, 0);  // poisoned: every element must be written
  cuda::synchronize(0);
  cuda::Stream a(0), b(0);
  cuda::Event a_done(0);
  {
    cuda::StreamGuard guard(a);
    busy_work(x.at<float>(), n, 100);  // x = 2^100 when A finishes
    a_done.record();
  }
  b.wait(a_done);
  {
    cuda::StreamGuard guard(b);
    cuda::fill(x.get(), DType::f32, n, 3.0, 0);
    cuda::add(x.get(), x.get(), y.get(), DType::f32, n, 0);
  }
  b.synchronize();
  EXPECT_TRUE(a_done.query());  // B ran after it, so it has completed
  const auto xs = test_support::download<float>(x.get(), n);
  const auto ys = test_support::download<float>(y.get(), n);
  EXPECT_EQ(std::count(xs.begin(), xs.end(), 3.0f), static_cast<long>(n));
  EXPECT_EQ(std::count(ys.begin(), ys.end(), 6.0f), static_cast<long>(n));
}

TEST(CudaStream, GuardsNestAndRestore) {
  SKIP_WITHOUT_DEVICE();
  cuda::Stream a(0), b(0);
  Allocator& alloc = test_support::device_allocator();
  // The allocator records the stream current at allocation: a view of what the guards made current.
  auto current = [&] {
    const Block blk = alloc.allocate(512);
    alloc.deallocate(blk);
    return blk.stream;
  };
  const auto key_a = reinterpret_cast<std::uintptr_t>(a.handle());
  const auto key_b = reinterpret_cast<std::uintptr_t>(b.handle());
  EXPECT_TRUE(cuda::default_stream_is_current(0));
  EXPECT_EQ(current(), 0u);
  {
    cuda::StreamGuard ga(a);
    EXPECT_FALSE(cuda::default_stream_is_current(0));
    EXPECT_EQ(current(), key_a);
    {
      cuda::StreamGuard gb(b);
      EXPECT_EQ(current(), key_b);
      {
        cuda::StreamGuard ga2(a);
        EXPECT_EQ(current(), key_a);
      }
      EXPECT_EQ(current(), key_b);
    }
    EXPECT_EQ(current(), key_a);
  }
  EXPECT_TRUE(cuda::default_stream_is_current(0));
  EXPECT_EQ(current(), 0u);
  // Moving a stream keeps its handle; the moved-from one is empty and its destructor does nothing.
  cuda::Stream moved(std::move(a));
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(moved.handle()), key_a);
  EXPECT_EQ(a.handle(), nullptr);
}

TEST(CudaStream, OpsOnANonDefaultStreamMatchTheCpu) {
  SKIP_WITHOUT_DEVICE();
  const Device gpu = Device::cuda(0);
  const Tensor a = random_tensor({67, 129}, 1), b = random_tensor({67, 129}, 2);
  const Tensor m1 = random_tensor({33, 70}, 3), m2 = random_tensor({70, 45}, 4);
  const Tensor q = random_tensor({2, 3, 37, 64}, 5), k = random_tensor({2, 3, 37, 64}, 6),
               v = random_tensor({2, 3, 37, 64}, 7);
  const Tensor da = a.to(gpu), db = b.to(gpu), dm1 = m1.to(gpu), dm2 = m2.to(gpu), dq = q.to(gpu), dk = k.to(gpu),
               dv = v.to(gpu);
  cuda::Stream stream(0);
  Tensor sum, prod, att;
  {
    cuda::StreamGuard guard(stream);
    sum = ops::add(da, db);
    prod = ops::matmul(dm1, dm2);
    att = ops::scaled_dot_product_attention(dq, dk, dv, /*causal=*/true);
  }
  stream.synchronize();
  EXPECT_EQ(normwise_error(sum, ops::add(a, b)), 0.0);
  EXPECT_LE(normwise_error(prod, ops::matmul(m1, m2)), 1e-5);
  EXPECT_LE(normwise_error(att, ops::scaled_dot_product_attention(q, k, v, true)), 1e-5);
}

// A block freed on stream A is not handed to a request on stream B (B's request gets other memory).
TEST(CudaStream, AllocatorKeepsFreedBlocksOnTheirStream) {
  SKIP_WITHOUT_DEVICE();
  Allocator& alloc = test_support::device_allocator();
  cuda::Stream a(0), b(0);
  for (const std::size_t n : {std::size_t{4096}, std::size_t{8} << 20}) {
    Block on_a;
    {
      cuda::StreamGuard guard(a);
      on_a = alloc.allocate(n);
      cuda::fill(on_a.ptr, DType::u8, n, 7.0, 0);
      alloc.deallocate(on_a);  // A's fill may still be running: the block must not go to B
    }
    Block on_b;
    {
      cuda::StreamGuard guard(b);
      on_b = alloc.allocate(n);
    }
    const auto* pa = static_cast<const char*>(on_a.ptr);
    const auto* pb = static_cast<const char*>(on_b.ptr);
    EXPECT_TRUE(pb + on_b.class_bytes <= pa || pa + on_a.class_bytes <= pb) << n << " bytes: B got A's block";
    alloc.deallocate(on_b);
  }
  a.synchronize();
  b.synchronize();
}

}  // namespace
}  // namespace memtrain

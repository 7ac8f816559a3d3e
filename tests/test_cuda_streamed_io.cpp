// Streamed checkpoint files on a device: a device tensor is saved, and a file tensor read into a device tensor,
// through the bounded host staging buffer (io::kStagingBytes), never through a whole host copy. Skips without
// a usable CUDA device.
#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/cuda/cuda.h"
#include "memtrain/io/safetensors.h"

#include "temp_dir.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace mt = memtrain;
using mt::Device;
using mt::Tensor;

namespace {

#define SKIP_WITHOUT_CUDA()                                                        \
  do {                                                                             \
    if (!mt::cuda::is_available())                                                 \
      GTEST_SKIP() << "no usable CUDA device: " << mt::cuda::unavailable_reason(); \
  } while (0)

constexpr std::size_t kMiB = std::size_t{1} << 20;

mt::Allocator& host() { return mt::Allocator::get(Device::cpu()); }

std::size_t host_peak_growth(const std::function<void()>& run) {
  const std::size_t before = host().stats().live_bytes;
  host().reset_peak();
  run();
  return host().stats().peak_bytes - before;
}

std::vector<float> values(const Tensor& t) {
  const Tensor c = t.to(Device::cpu()).to(mt::DType::f32).contiguous();
  return std::vector<float>(c.data<float>(), c.data<float>() + c.numel());
}

TEST(CudaStreamedIo, SaveStagesADeviceTensorThroughTheBoundedBuffer) {
  SKIP_WITHOUT_CUDA();
  mt::test_support::TempDir dir;
  mt::manual_seed(8);
  const Tensor on_host = mt::randn({3072, 4096});  // 48 MiB
  const Tensor on_device = on_host.to(Device::cuda(0));
  const std::string path = dir.file("d.safetensors");
  const std::size_t growth = host_peak_growth([&] { mt::io::save_safetensors(path, {{"w", on_device}}); });
  EXPECT_LE(growth, mt::io::kStagingBytes + kMiB) << "the save copied the device tensor to the host whole";
  EXPECT_EQ(values(mt::io::SafetensorsFile(path).read("w")), values(on_host));
}

TEST(CudaStreamedIo, ReadIntoADeviceTensorConvertsInPieces) {
  SKIP_WITHOUT_CUDA();
  mt::test_support::TempDir dir;
  mt::manual_seed(9);
  const Tensor w = mt::randn({3072, 4096});
  const std::string path = dir.file("h.safetensors");
  mt::io::save_safetensors(path, {{"w", w}});
  const mt::io::SafetensorsFile file(path);
  Tensor dst = mt::zeros({3072, 4096}, mt::DType::bf16, Device::cuda(0));
  // A piece's bytes in the staging buffer, and its conversion to bf16 on the host before it crosses.
  const std::size_t growth = host_peak_growth([&] { file.read_into("w", dst); });
  EXPECT_LE(growth, mt::io::kStagingBytes * 3 / 2 + kMiB);
  EXPECT_EQ(values(dst), values(w.to(mt::DType::bf16)));
}

}  // namespace

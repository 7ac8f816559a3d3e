// The meta device: tensors with shape, dtype and accounted storage but no data. What runs on it must
// allocate, per memory category, exactly what the same code allocates on the CPU (src/meta/). The ops' cases
// are in test_meta_*.cpp, the norms' in test_norm.cpp.
#include <gtest/gtest.h>

#include "meta_footprint.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/core/tensor.h"
#include "memtrain/ops/reduce.h"

#include <array>
#include <functional>
#include <string>

namespace memtrain {
namespace {

using test_support::expect_same_footprint;
using test_support::Footprint;

TEST(MetaDevice, AccountsBytesWithoutData) {
  Allocator& meta = Allocator::get(Device::meta());
  const std::size_t cpu_before = memory_stats().live_bytes, meta_before = meta.stats().live_bytes;
  {
    CategoryGuard category(MemoryCategory::activations);
    // 4 GiB of bf16: no host memory could be spent on it unnoticed.
    const Tensor big = Tensor::empty({1 << 16, 1 << 15}, DType::bf16, Device::meta());
    EXPECT_EQ(big.device(), Device::meta());
    EXPECT_EQ(meta.stats().live_bytes - meta_before, std::size_t{1} << 32);
    EXPECT_EQ(meta.stats()[MemoryCategory::activations].live_bytes >= (std::size_t{1} << 32), true);
    EXPECT_EQ(memory_stats().live_bytes, cpu_before) << "a meta tensor must not touch the CPU allocator";
  }
  EXPECT_EQ(meta.stats().live_bytes, meta_before);
  EXPECT_EQ(Device::meta().str(), "meta");
}

TEST(MetaDevice, RefusesDataAndReadsAsZeros) {
  const Tensor t = full({3, 4}, 2.5, DType::f32, Device::meta());
  try {
    (void)t.data_ptr();
    ADD_FAILURE() << "data_ptr of a meta tensor must throw";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("data_ptr"), std::string::npos) << m;
    EXPECT_NE(m.find("meta"), std::string::npos) << m;
    EXPECT_NE(m.find("[3, 4]"), std::string::npos) << m;
  }
  // The documented answer for data-dependent branches: zeros.
  EXPECT_EQ(t.narrow(0, 1, 1).narrow(1, 2, 1).reshape({}).item(), 0.0);
  const Tensor host = t.to(Device::cpu());
  ASSERT_EQ(host.device(), Device::cpu());
  for (std::int64_t i = 0; i < host.numel(); ++i) EXPECT_EQ(host.data<float>()[i], 0.0f) << i;
  EXPECT_EQ(t.to_string().find("values"), std::string::npos) << t.to_string();
  // CPU -> meta -> CPU keeps the shape and dtype.
  const Tensor back = randn({5}, DType::bf16).to(Device::meta()).to(Device::cpu());
  EXPECT_EQ(back.shape(), (Shape{5}));
  EXPECT_EQ(back.dtype(), DType::bf16);
}

TEST(MetaDevice, TensorCoreMatchesCpuBytes) {
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    expect_same_footprint("factories and copies " + std::string(dtype_name(dtype)), [&](Device dev) {
      CategoryGuard category(MemoryCategory::activations);
      const Tensor a = randn({37, 19}, dtype, dev);
      const Tensor b = rand({19, 37}, DType::f32, dev);
      const Tensor c = zeros({7}, dtype, dev);
      Tensor strided = a.t().to(DType::f32);  // a transposed view converted: packs, then converts
      CategoryGuard work(MemoryCategory::workspace);
      const Tensor d = a.t().contiguous();
      Tensor(b).copy_(a.t());  // a dtype change through a view
      const Tensor e = ones({2, 3}, DType::i64, dev);
      strided.fill_(1.0);
    });
  }
}

}  // namespace
}  // namespace memtrain

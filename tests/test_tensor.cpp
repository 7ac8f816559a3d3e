// Tensor core: factories, layout, views sharing storage, copies across dtypes, item, printing, bad input.
#include "memtrain/memtrain.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace memtrain;

namespace {

std::vector<double> values(const Tensor& t) {
  const Tensor c = t.detach().contiguous().to(DType::f64);
  return std::vector<double>(c.data<double>(), c.data<double>() + c.numel());
}

TEST(Tensor, FactoriesFillWhatTheySay) {
  EXPECT_EQ(values(zeros({2, 2})), (std::vector<double>{0, 0, 0, 0}));
  EXPECT_EQ(values(ones({3}, DType::bf16)), (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(values(full({2}, 2.5, DType::f16)), (std::vector<double>{2.5, 2.5}));
  EXPECT_EQ(values(arange(0, 5, 2, DType::i32)), (std::vector<double>{0, 2, 4}));
  EXPECT_EQ(arange(10).numel(), 10);
  EXPECT_EQ(values(tensor({1.f, 2.f, 3.f, 4.f}, {2, 2}).t()), (std::vector<double>{1, 3, 2, 4}));
  const std::int32_t raw[3] = {7, -1, 3};
  EXPECT_EQ(values(from_buffer(raw, {3}, DType::i32, DType::f32)), (std::vector<double>{7, -1, 3}));
}

TEST(Tensor, ContiguousStridesAndNumel) {
  Tensor t = zeros({2, 3, 4});
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_FALSE(t.transpose(0, 2).is_contiguous());
  EXPECT_EQ(zeros({}).numel(), 1);
  EXPECT_EQ(zeros({0, 3}).numel(), 0);
}

TEST(Tensor, ViewsShareStorageAndSeeWrites) {
  Tensor t = arange(0, 12).reshape({3, 4});
  Tensor tt = t.t();
  EXPECT_TRUE(tt.shares_storage_with(t));
  EXPECT_EQ(tt.shape(), (Shape{4, 3}));
  EXPECT_EQ(values(tt.select(0, 1)), (std::vector<double>{1, 5, 9}));
  Tensor col = t.slice(1, 1, 4, 2);  // columns 1 and 3
  EXPECT_EQ(values(col), (std::vector<double>{1, 3, 5, 7, 9, 11}));
  col.fill_(-1);
  EXPECT_EQ(values(t.select(0, 0)), (std::vector<double>{0, -1, 2, -1}));
  EXPECT_EQ(values(t.narrow(0, 2, 1).squeeze(0)), (std::vector<double>{8, -1, 10, -1}));
  Tensor e = tensor({1.f, 2.f}, {2, 1}).expand({2, 3});
  EXPECT_EQ(e.strides()[1], 0);
  EXPECT_EQ(values(e), (std::vector<double>{1, 1, 1, 2, 2, 2}));
  EXPECT_EQ(t.unsqueeze(1).shape(), (Shape{3, 1, 4}));
  EXPECT_EQ(t.permute({1, 0}).shape(), (Shape{4, 3}));
  EXPECT_EQ(t.view({2, -1}).shape(), (Shape{2, 6}));
  EXPECT_EQ(t.flatten().shape(), (Shape{12}));
}

TEST(Tensor, ReshapeCopiesOnlyWhenItMust) {
  Tensor t = arange(0, 6).reshape({2, 3});
  EXPECT_TRUE(t.reshape({3, 2}).shares_storage_with(t));
  Tensor tt = t.t();  // [3, 2] non-contiguous
  EXPECT_THROW(tt.view({6}), Error);
  Tensor flat = tt.reshape({6});
  EXPECT_FALSE(flat.shares_storage_with(t));
  EXPECT_EQ(values(flat), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  // A transposed view of a slice whose dims stay contiguous among themselves can still be viewed.
  Tensor big = arange(0, 24).reshape({2, 3, 4});
  EXPECT_TRUE(big.slice(0, 1, 2).view({3, 4}).shares_storage_with(big));
}

TEST(Tensor, ConvertsBetweenDtypes) {
  Tensor f = tensor({1.5f, -2.25f, 3.0f}, {3});
  EXPECT_EQ(values(f.to(DType::bf16)), (std::vector<double>{1.5, -2.25, 3}));
  EXPECT_EQ(values(f.to(DType::i32)), (std::vector<double>{1, -2, 3}));
  EXPECT_EQ(values(f.t().to(DType::f64)), (std::vector<double>{1.5, -2.25, 3}));
  Tensor strided = arange(0, 6).reshape({2, 3}).t();
  EXPECT_EQ(values(strided.to(DType::f16)), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  Tensor dst = zeros({3, 2}, DType::f64);
  dst.copy_(strided);
  EXPECT_EQ(values(dst), (std::vector<double>{0, 3, 1, 4, 2, 5}));
}

TEST(Tensor, ItemAndPrinting) {
  EXPECT_DOUBLE_EQ(full({1}, 3.25).item(), 3.25);
  EXPECT_EQ(full({}, 7, DType::i64).item<std::int64_t>(), 7);
  EXPECT_THROW(zeros({2}).item(), Error);
  const std::string s = arange(0, 3).to_string();
  EXPECT_NE(s.find("shape=[3]"), std::string::npos) << s;
  EXPECT_NE(s.find("f32"), std::string::npos) << s;
  EXPECT_NE(s.find("0, 1, 2"), std::string::npos) << s;
  const std::string big = arange(0, 100).to_string();
  EXPECT_NE(big.find("..."), std::string::npos) << big;
}

TEST(Tensor, CloneIsIndependent) {
  Tensor a = ones({4});
  Tensor b = a.clone();
  b.fill_(2);
  EXPECT_EQ(values(a), (std::vector<double>{1, 1, 1, 1}));
  EXPECT_FALSE(a.shares_storage_with(b));
}

TEST(Tensor, BadViewsThrowNamingTheOpAndShapes) {
  Tensor t = zeros({2, 3});
  auto expect_error = [](auto&& fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([&] { t.view({4, 2}); }, "view: shape [4, 2] is invalid for 6 elements");
  expect_error([&] { t.transpose(0, 2); }, "transpose");
  expect_error([&] { t.narrow(1, 2, 2); }, "narrow");
  expect_error([&] { t.expand({3, 3}); }, "expand: cannot expand [2, 3] to [3, 3]");
  expect_error([&] { t.permute({0, 0}); }, "permute");
  expect_error([&] { t.select(0, 5); }, "select");
  // A view past the end of its storage is refused before anything reads it.
  expect_error([&] { Tensor::make_view(t.storage(), {2, 4}, {4, 1}, 0, DType::f32); }, "past the storage");
  expect_error([&] { Tensor::make_view(t.storage(), {6}, {1}, 1, DType::f32); }, "past the storage");
  EXPECT_NO_THROW(Tensor::make_view(t.storage(), {3}, {1}, 0, DType::f64));
  expect_error([&] { Tensor().shape(); }, "undefined tensor");
  expect_error([&] { zeros({2}).copy_(zeros({3})); }, "copy_: shape mismatch");
}

}  // namespace

namespace {

TEST(Tensor, MixingDevicesThrowsNamingTheOp) {
  if (!cuda::is_available()) {
    // Without a device, asking for CUDA memory is the error, and it says why.
    try {
      zeros({2}, DType::f32, Device::cuda(0));
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
    }
    return;
  }
  Tensor a = ones({4}), b = ones({4}, DType::f32, Device::cuda(0));
  try {
    ops::add(a, b);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device mismatch"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops::matmul(ones({2, 2}), ones({2, 2}, DType::f32, Device::cuda(0))), Error);
  // Round trip through the device keeps the values.
  Tensor back = arange(0, 5).to(Device::cuda(0)).to(Device::cpu());
  EXPECT_EQ(values(back), (std::vector<double>{0, 1, 2, 3, 4}));
}

}  // namespace

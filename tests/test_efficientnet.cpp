// The EfficientNet example's parts (nn/efficientnet.h, nn/resize.h): B0's published sizes from the scaling
// rules, squeeze-and-excitation and MBConv gradients against central finite differences in float64, what each
// SiLU keeps for the backward (through the allocator's accounting), and the resize weights against the values
// PyTorch's F.interpolate(mode="bilinear", antialias=True) uses, derived by hand in the comments.
#include <gtest/gtest.h>

#include "op_test_util.h"

#include "memtrain/autograd/engine.h"
#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/nn/efficientnet.h"
#include "memtrain/nn/resize.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/reduce.h"

#include <cmath>
#include <functional>
#include <vector>

namespace memtrain {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::normal;
using testing::values_of;

// ---- sizes --------------------------------------------------------------------------------------------

// torchvision's efficientnet_b0 (ImageNet: 3 channels, 224x224, 1000 classes, head 1280) has 5,288,548
// parameters; its SE squeezes to a quarter of the block's input channels, its convolutions have no bias.
TEST(EfficientNet, B0AtImageNetSizeHasTorchvisionsParameterCount) {
  nn::EfficientNetConfig c;
  c.in_channels = 3;
  c.image_size = 224;
  c.num_classes = 1000;
  c.width_mult = 1.0;
  c.depth_mult = 1.0;
  c.stem_stride = 2;
  c.head_channels = 1280;
  manual_seed(1);
  const nn::EfficientNet b0(c);
  EXPECT_EQ(b0.num_parameters(), 5288548);
  EXPECT_EQ(b0.num_blocks(), 16);
}

// B1 (depth 1.1) has 23 blocks; B3 (width 1.2) has stage widths 40 24 32 48 96 136 232 384 (stem first), from
// B0's 32 16 24 40 80 112 192 320 rounded to multiples of 8 (torchvision's _make_divisible).
TEST(EfficientNet, WidthAndDepthRoundingGiveB1AndB3) {
  nn::EfficientNetConfig b1;
  b1.depth_mult = 1.1;
  std::int64_t blocks = 0;
  for (const auto& s : b1.stages) blocks += b1.scaled_repeats(s.repeats);
  EXPECT_EQ(blocks, 23);
  nn::EfficientNetConfig b3;
  b3.width_mult = 1.2;
  std::vector<std::int64_t> widths{b3.scaled_channels(b3.stem_channels)};
  for (const auto& s : b3.stages) widths.push_back(b3.scaled_channels(s.channels));
  EXPECT_EQ(widths, (std::vector<std::int64_t>{40, 24, 32, 48, 96, 136, 232, 384}));
}

// At 28x28 (stem stride 1) the strides of stages 2 and 3 halve 28 -> 14 -> 7; those of stages 4 and 6 would take
// the 7x7 map below min_feature_size 7, so they are dropped. Logits come out [B, classes] at any input size.
TEST(EfficientNet, SmallImagesKeepAFeatureMapAndAnySizeGivesLogits) {
  manual_seed(2);
  nn::EfficientNet net;  // the Fashion-MNIST default
  const std::string d = net.describe();
  EXPECT_NE(d.find("stage 3: 1 x MBConv6 k5 s2 16 -> 24, 7x7"), std::string::npos) << d;
  EXPECT_NE(d.find("stage 4: 2 x MBConv6 k3 s1 24 -> 40, 7x7"), std::string::npos) << d;
  EXPECT_NE(d.find("stage 6: 2 x MBConv6 k5 s1 56 -> 96, 7x7"), std::string::npos) << d;
  EXPECT_EQ(net.num_blocks(), 10);
  autograd::NoGradGuard no_grad;
  for (const std::int64_t side : {28, 20}) EXPECT_EQ(net.forward(randn({2, 1, side, side})).shape(), (Shape{2, 10}));
}

TEST(EfficientNet, RefusesBadConfigurationsNamingTheField) {
  nn::EfficientNetConfig c;
  c.stages[1].kernel = 4;
  expect_error([&] { c.validate(); }, {"EfficientNetConfig", "stage 2", "odd kernel"});
  c = {};
  c.se_ratio = 0;
  expect_error([&] { c.validate(); }, {"EfficientNetConfig", "se_ratio"});
  c = {};
  c.image_size = 2;
  expect_error([&] { c.validate(); }, {"EfficientNetConfig", "min_feature_size"});
  expect_error([] { nn::silu_kind_from_name("both"); }, {"silu_kind_from_name", "both"});
  expect_error([] { nn::Conv2d(6, 4, 3, 1, 1, false, DType::f32, 4); }, {"nn::Conv2d", "groups 4"});
  manual_seed(3);
  nn::EfficientNet net;
  expect_error([&] { net.forward(randn({2, 1, 3, 3})); }, {"nn::EfficientNet", "[2, 1, 3, 3]"});
}

// ---- gradients ----------------------------------------------------------------------------------------

// L = sum(y * w) for fixed random w; every parameter element's and input element's dL/d against central
// differences (eps 1e-6, float64), perturbing the module's own storage.
void expect_module_gradients(nn::Module& m, Tensor x, const std::function<Tensor(const Tensor&)>& f) {
  x = x.detach().clone().set_requires_grad(true);
  const Tensor w = normal(f(x).shape(), 99);
  auto loss = [&](const Tensor& in) { return ops::sum(ops::mul(f(in), w)).item(); };
  m.zero_grad();
  ops::sum(ops::mul(f(x), w)).backward();
  std::vector<Tensor> targets = m.parameters();
  targets.push_back(x);
  constexpr double eps = 1e-6;
  for (std::size_t t = 0; t < targets.size(); ++t) {
    Tensor p = targets[t];
    const std::vector<double> analytic = values_of(p.grad());
    std::vector<double> numeric(analytic.size());
    autograd::NoGradGuard no_grad;
    double* data = p.data<double>();
    for (std::size_t i = 0; i < numeric.size(); ++i) {
      const double v = data[i];
      data[i] = v + eps;
      const double up = loss(x);
      data[i] = v - eps;
      const double down = loss(x);
      data[i] = v;
      numeric[i] = (up - down) / (2 * eps);
    }
    expect_close(analytic, numeric, 1e-5, 1e-6, "tensor " + std::to_string(t));
  }
}

TEST(EfficientNet, SqueezeExciteGradientsMatchFiniteDifferences) {
  manual_seed(4);
  nn::SqueezeExcite se(6, 2, nn::SiluKind::saves_input, DType::f64);
  expect_module_gradients(se, normal({2, 6, 3, 4}, 5), [&](const Tensor& x) { return se.forward(x); });
}

// With a residual (stride 1, in == out, expanded) and without (stride 2, a 5x5 depthwise kernel, no expansion);
// batch norm in training mode, so the gradients go through the batch statistics too.
TEST(EfficientNet, MBConvGradientsMatchFiniteDifferences) {
  for (const auto kind : {nn::SiluKind::saves_input, nn::SiluKind::saves_output}) {
    manual_seed(6);
    nn::MBConv residual(4, 4, 2, 3, 1, 1, kind, DType::f64);
    ASSERT_TRUE(residual.has_residual());
    expect_module_gradients(residual, normal({2, 4, 5, 5}, 7), [&](const Tensor& x) { return residual.forward(x); });
    nn::MBConv strided(3, 5, 1, 5, 2, 1, kind, DType::f64);
    ASSERT_FALSE(strided.has_residual());
    expect_module_gradients(strided, normal({2, 3, 6, 5}, 8), [&](const Tensor& x) { return strided.forward(x); });
  }
}

// ---- what SiLU keeps ------------------------------------------------------------------------------------

// Bytes the graph of y = silu(x) holds beyond x: y itself, plus sigmoid(x) for the composed form.
std::size_t bytes_held(nn::SiluKind kind, const Tensor& x) {
  Allocator& a = Allocator::get(Device::cpu());
  const std::size_t before = a.stats().live_bytes;
  const Tensor y = nn::silu(x, kind);
  return a.stats().live_bytes - before;
}

TEST(EfficientNet, SiluSavesOnlyItsInputAndTheComposedFormKeepsSigmoidToo) {
  const Tensor x = randn({64, 33}).set_requires_grad(true);
  const std::size_t one = 64 * 33 * sizeof(float);
  EXPECT_EQ(bytes_held(nn::SiluKind::saves_input, x), one);       // y; x is saved, already live
  EXPECT_EQ(bytes_held(nn::SiluKind::saves_output, x), 2 * one);  // y and sigmoid(x)
  // Both give the same values and gradients.
  const Tensor a = nn::silu(x, nn::SiluKind::saves_input), b = nn::silu(x, nn::SiluKind::saves_output);
  expect_close(values_of(a), values_of(b), 1e-6, 1e-7, "silu");
  ops::sum(a).backward();
  const Tensor ga = x.grad().clone();
  autograd::zero_grad({x});
  ops::sum(b).backward();
  expect_close(values_of(ga), values_of(x.grad()), 1e-6, 1e-7, "silu gradient");
}

// On the whole network: one SiLU tensor fewer kept per activation, so the step's activation peak drops.
TEST(EfficientNet, InputOnlySiluLowersTheActivationPeak) {
  auto peak = [](nn::SiluKind kind) {
    nn::EfficientNetConfig c;
    c.silu = kind;
    manual_seed(9);
    nn::EfficientNet net(c);
    const Tensor x = randn({8, 1, 28, 28}), y = zeros({8}, DType::i64);
    Allocator& a = Allocator::get(Device::cpu());
    a.reset_peak();
    std::size_t p = 0;
    {
      CategoryGuard acts(MemoryCategory::activations);
      const Tensor loss = net.loss(x, y);
      p = a.stats()[MemoryCategory::activations].peak_bytes;
      loss.backward();
    }
    return p;
  };
  const std::size_t input_only = peak(nn::SiluKind::saves_input), with_output = peak(nn::SiluKind::saves_output);
  EXPECT_LT(input_only, with_output);
  EXPECT_LT(static_cast<double>(input_only), 0.9 * static_cast<double>(with_output));
}

// ---- resize -----------------------------------------------------------------------------------------------

// Halving: centre (o + 0.5) * 2, support 2, so pixels 2o-1 .. 2o+2 at distances 1.5, 0.5, 0.5, 1.5 get
// tri(0.75) = 0.25 and tri(0.25) = 0.75, normalised by 2: 0.125 0.375 0.375 0.125 (0.375 0.375 0.125 renormalised
// at the first row, which has no pixel -1). Doubling is plain half-pixel bilinear: 0.75/0.25, edge clamped.
TEST(Resize, WeightsAreAntialiasedBilinearWithHalfPixelCentres) {
  const std::vector<double> half = nn::resize_weights(8, 4);
  expect_close(std::vector<double>(half.begin() + 8, half.begin() + 16), {0, 0.125, 0.375, 0.375, 0.125, 0, 0, 0},
               1e-15, 1e-15, "row 1 of 8 -> 4");
  expect_close(std::vector<double>(half.begin(), half.begin() + 8),
               {0.375 / 0.875, 0.375 / 0.875, 0.125 / 0.875, 0, 0, 0, 0, 0}, 1e-15, 1e-15, "row 0 of 8 -> 4");
  const std::vector<double> twice = nn::resize_weights(3, 6);
  expect_close(twice, {1, 0, 0,  0.75, 0.25, 0,  0.25, 0.75, 0,  0, 0.75, 0.25,  0, 0.25, 0.75,  0, 0, 1}, 1e-15,
               1e-15, "3 -> 6");
  const std::vector<double> same = nn::resize_weights(5, 5);
  for (std::int64_t o = 0; o < 5; ++o)
    for (std::int64_t i = 0; i < 5; ++i) EXPECT_EQ(same[o * 5 + i], o == i ? 1.0 : 0.0);
}

// resize_images applies the weights along H and W: against a direct float64 sum over both axes.
TEST(Resize, ImagesAreTheSeparableSumAndRefuseBadInput) {
  const Tensor x = normal({2, 3, 7, 9}, 10);
  const Tensor y = nn::resize_images(x, 4, 6);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 4, 6}));
  const std::vector<double> wh = nn::resize_weights(7, 4), ww = nn::resize_weights(9, 6), xv = values_of(x);
  std::vector<double> ref;
  for (std::int64_t img = 0; img < 6; ++img)
    for (std::int64_t oh = 0; oh < 4; ++oh)
      for (std::int64_t ow = 0; ow < 6; ++ow) {
        double s = 0;
        for (std::int64_t ih = 0; ih < 7; ++ih)
          for (std::int64_t iw = 0; iw < 9; ++iw) s += wh[oh * 7 + ih] * ww[ow * 9 + iw] * xv[(img * 7 + ih) * 9 + iw];
        ref.push_back(s);
      }
  expect_close(values_of(y), ref, 1e-13, 1e-13, "resize 7x9 -> 4x6");
  EXPECT_EQ(nn::resize_images(x, 7, 9).data_ptr(), x.data_ptr());  // same size: x itself
  expect_error([&] { nn::resize_images(x, 0, 3); }, {"nn::resize_images", "0x3"});
  expect_error([] { nn::resize_images(zeros({2, 3, 4}), 2, 2); }, {"nn::resize_images", "[2, 3, 4]"});
}

}  // namespace
}  // namespace memtrain

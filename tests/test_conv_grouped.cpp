// Grouped and depthwise conv2d (Cin / groups == 1 takes the CPU's direct-loop path, src/cpu/conv.h; other groups
// the im2col path). Forward against a naive float64 loop written here; gradients by central finite differences in
// float64 (gradcheck.h); f32 within a stated bound of f64; the depthwise path bit-identical at 1 and 2 threads (each
// output element is summed by one thread in a fixed order) and close to the im2col path on the same shapes;
// PyTorch's float64 results from tests/fixtures/conv_grouped (scripts/make_conv_grouped_fixture.py); and the
// workspace the CPU backend allocates equal to conv2d_*_workspace, which the meta backend predicts from.
#include "gradcheck.h"
#include "op_test_util.h"

#include "cpu/conv.h"

#include "memtrain/core/allocator.h"
#include "memtrain/ops/nn.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace memtrain {
namespace {

using testing::expect_close;
using testing::expect_gradients_match;
using testing::normal;
using testing::values_of;

struct Case {
  std::int64_t B, Cin, H, W, Cout, K, stride, pad, groups;
  bool bias;
  std::string name() const {
    return "B" + std::to_string(B) + " Cin" + std::to_string(Cin) + " " + std::to_string(H) + "x" + std::to_string(W) +
           " Cout" + std::to_string(Cout) + " k" + std::to_string(K) + " s" + std::to_string(stride) + " p" +
           std::to_string(pad) + " g" + std::to_string(groups) + (bias ? " bias" : "");
  }
  cpu::Conv2dShape shape() const {
    return {B, Cin, H, W, Cout, K, K, stride, pad, groups, cpu::conv_out_size(H, K, stride, pad),
            cpu::conv_out_size(W, K, stride, pad)};
  }
};

// Channel layouts: depthwise (multiplier 1 and 2), then grouped with 2 input channels per group (groups 2, 4).
struct Channels {
  std::int64_t Cin, Cout, groups;
};
constexpr Channels kChannels[] = {{4, 4, 4}, {3, 6, 3}, {4, 6, 2}, {8, 8, 4}};

// Every kernel (3, 5) x stride (1, 2) x padding (0, 1, 2) x channel layout, on odd spatial sizes, bias on every
// other case.
std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (std::int64_t K : {3, 5})
    for (std::int64_t stride : {1, 2})
      for (std::int64_t pad : {0, 1, 2})
        for (const Channels& c : kChannels)
          cases.push_back({2, c.Cin, 7, 9, c.Cout, K, stride, pad, c.groups, cases.size() % 2 == 0});
  return cases;
}

// Direct convolution in float64: y[n, co, oh, ow] = b[co] + sum over the group's input channels and taps.
std::vector<double> naive_conv2d(const std::vector<double>& x, const std::vector<double>& w,
                                 const std::vector<double>& b, const Case& c) {
  const cpu::Conv2dShape s = c.shape();
  const std::int64_t cin_g = c.Cin / c.groups, cout_g = c.Cout / c.groups;
  std::vector<double> y(static_cast<std::size_t>(c.B * c.Cout * s.OH * s.OW));
  for (std::int64_t n = 0; n < c.B; ++n)
    for (std::int64_t co = 0; co < c.Cout; ++co)
      for (std::int64_t oh = 0; oh < s.OH; ++oh)
        for (std::int64_t ow = 0; ow < s.OW; ++ow) {
          double acc = b.empty() ? 0.0 : b[co];
          for (std::int64_t ci = 0; ci < cin_g; ++ci)
            for (std::int64_t kh = 0; kh < c.K; ++kh)
              for (std::int64_t kw = 0; kw < c.K; ++kw) {
                const std::int64_t ih = oh * c.stride - c.pad + kh, iw = ow * c.stride - c.pad + kw;
                if (ih < 0 || ih >= c.H || iw < 0 || iw >= c.W) continue;
                acc += x[((n * c.Cin + co / cout_g * cin_g + ci) * c.H + ih) * c.W + iw] *
                       w[((co * cin_g + ci) * c.K + kh) * c.K + kw];
              }
          y[((n * c.Cout + co) * s.OH + oh) * s.OW + ow] = acc;
        }
  return y;
}

struct Inputs {
  Tensor x, w, b;
};
Inputs make_inputs(const Case& c, std::uint64_t seed) {
  return {normal({c.B, c.Cin, c.H, c.W}, seed), normal({c.Cout, c.Cin / c.groups, c.K, c.K}, seed + 1),
          c.bias ? normal({c.Cout}, seed + 2) : Tensor()};
}

TEST(ConvGrouped, ForwardMatchesNaiveLoop) {
  for (const Case& c : all_cases()) {
    const Inputs in = make_inputs(c, 100);
    const std::vector<double> ref =
        naive_conv2d(values_of(in.x), values_of(in.w), c.bias ? values_of(in.b) : std::vector<double>{}, c);
    const Tensor y = ops::conv2d(in.x, in.w, in.b, c.stride, c.pad, c.groups);
    ASSERT_EQ(y.shape(), (Shape{c.B, c.Cout, c.shape().OH, c.shape().OW})) << c.name();
    expect_close(values_of(y), ref, 1e-12, 1e-12, c.name() + " f64");
  }
}

// One case per kernel, stride and padding, over the four channel layouts; sizes kept small since each element
// of x, w and b costs two forward passes.
TEST(ConvGrouped, GradientsMatchFiniteDifferences) {
  const std::vector<Case> cases = all_cases();
  for (std::size_t i = 0; i < cases.size(); i += 5) {
    const Case& c = cases[i];
    const Inputs in = make_inputs(c, 200 + i);
    std::vector<Tensor> args{in.x.clone().set_requires_grad(true), in.w.clone().set_requires_grad(true)};
    if (c.bias) args.push_back(in.b.clone().set_requires_grad(true));
    SCOPED_TRACE(c.name());
    expect_gradients_match(
        [&c](const std::vector<Tensor>& a) {
          return ops::conv2d(a[0], a[1], a.size() > 2 ? a[2] : Tensor(), c.stride, c.pad, c.groups);
        },
        args);
  }
}

struct Grads {
  std::vector<double> y, dx, dw, db;
};
// y, and the gradients of sum(y * dy), for fresh leaf copies of x, w, b in dtype (so no call sees another's .grad).
Grads run(const Case& c, const Inputs& in, const Tensor& dy, DType dtype) {
  const Tensor x = in.x.to(dtype).clone().set_requires_grad(true), w = in.w.to(dtype).clone().set_requires_grad(true);
  const Tensor b = c.bias ? in.b.to(dtype).clone().set_requires_grad(true) : Tensor();
  const Tensor y = ops::conv2d(x, w, b, c.stride, c.pad, c.groups);
  y.backward(dy.to(dtype));
  return {values_of(y), values_of(x.grad()), values_of(w.grad()), c.bias ? values_of(b.grad()) : std::vector<double>{}};
}

// f32 sums of at most B*OH*OW = 198 products of N(0, 1) values (dw): rounding stays well within 1e-4 absolute.
TEST(ConvGrouped, Float32WithinBoundOfFloat64) {
  for (const Case& c : all_cases()) {
    const Inputs in = make_inputs(c, 300);
    const Tensor dy = normal({c.B, c.Cout, c.shape().OH, c.shape().OW}, 303);
    const Grads g64 = run(c, in, dy, DType::f64), g32 = run(c, in, dy, DType::f32);
    expect_close(g32.y, g64.y, 1e-5, 1e-4, c.name() + " y");
    expect_close(g32.dx, g64.dx, 1e-5, 1e-4, c.name() + " dx");
    expect_close(g32.dw, g64.dw, 1e-5, 1e-4, c.name() + " dw");
    expect_close(g32.db, g64.db, 1e-5, 1e-4, c.name() + " db");
  }
}

class Threads {
 public:
  explicit Threads(int t) : saved_(omp_get_max_threads()) { omp_set_num_threads(t); }
  ~Threads() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

void expect_same_bits(const std::vector<double>& a, const std::vector<double>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(std::bit_cast<std::uint64_t>(a[i]), std::bit_cast<std::uint64_t>(b[i])) << what << " at " << i;
}

// Depthwise: every output element is summed by one thread in a fixed order, so the thread count changes no bit.
// (The im2col path sums per-thread dW partials, so for it only the same thread count repeats bit for bit.)
TEST(ConvGrouped, DepthwiseIsBitIdenticalAcrossThreadCounts) {
  for (const Case& c : all_cases()) {
    if (c.Cin != c.groups) continue;
    const Inputs in = make_inputs(c, 400);
    const Tensor dy = normal({c.B, c.Cout, c.shape().OH, c.shape().OW}, 403);
    for (DType dtype : {DType::f32, DType::f64}) {
      Grads one, two;
      {
        Threads t(1);
        one = run(c, in, dy, dtype);
      }
      {
        Threads t(2);
        two = run(c, in, dy, dtype);
      }
      const std::string what = c.name() + " " + std::string(dtype_name(dtype));
      expect_same_bits(one.y, two.y, what + " y");
      expect_same_bits(one.dx, two.dx, what + " dx");
      expect_same_bits(one.dw, two.dw, what + " dw");
      expect_same_bits(one.db, two.db, what + " db");
    }
  }
}

// The direct loops against the general im2col + GEMM path on the same depthwise shapes (f64, 2 threads).
TEST(ConvGrouped, DepthwiseMatchesIm2colPath) {
  for (const Case& c : all_cases()) {
    if (c.Cin != c.groups) continue;
    const cpu::Conv2dShape s = c.shape();
    const Inputs in = make_inputs(c, 500);
    const std::vector<double> x = values_of(in.x), w = values_of(in.w);
    const std::vector<double> b = c.bias ? values_of(in.b) : std::vector<double>(c.Cout, 0.0);
    const std::vector<double> dy = values_of(normal({c.B, c.Cout, s.OH, s.OW}, 503));
    const int nt = 2;
    std::vector<double> ws(static_cast<std::size_t>(std::max<std::int64_t>(
        {cpu::conv2d_forward_workspace(s, nt), cpu::conv2d_backward_workspace(s, nt),
         cpu::conv2d_forward_workspace(s, nt, cpu::ConvPath::im2col),
         cpu::conv2d_backward_workspace(s, nt, cpu::ConvPath::im2col), 1})));
    std::vector<double> y1(dy.size()), y2(dy.size()), dx1(x.size()), dx2(x.size()), dw1(w.size()), dw2(w.size()),
        db1(b.size()), db2(b.size());
    cpu::conv2d_forward<double>(y1.data(), x.data(), w.data(), b.data(), s, ws.data(), nt);
    cpu::conv2d_forward<double>(y2.data(), x.data(), w.data(), b.data(), s, ws.data(), nt, cpu::ConvPath::im2col);
    cpu::conv2d_backward<double>(dx1.data(), dw1.data(), db1.data(), dy.data(), x.data(), w.data(), s, ws.data(), nt);
    cpu::conv2d_backward<double>(dx2.data(), dw2.data(), db2.data(), dy.data(), x.data(), w.data(), s, ws.data(), nt,
                                 cpu::ConvPath::im2col);
    expect_close(y1, y2, 1e-12, 1e-12, c.name() + " y");
    expect_close(dx1, dx2, 1e-12, 1e-12, c.name() + " dx");
    expect_close(dw1, dw2, 1e-12, 1e-12, c.name() + " dw");
    expect_close(db1, db2, 0, 0, c.name() + " db");  // the same loop on both paths
  }
}

// ---- PyTorch fixture ----

struct TorchCase {
  Case c;
  std::map<std::string, std::vector<double>> t;  // x w b dy y dx dw db
};

std::vector<TorchCase> load_torch_fixture() {
  const std::string path = std::string(MEMTRAIN_FIXTURES_DIR) + "/conv_grouped/torch_conv2d.txt";
  std::ifstream in(path);
  EXPECT_TRUE(in) << "missing " << path << " (scripts/make_conv_grouped_fixture.py)";
  std::vector<TorchCase> cases;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::string tag;
    ss >> tag;
    if (tag.empty() || tag[0] == '#') continue;
    if (tag == "case") {
      std::string name;
      int bias = 0;
      Case c{};
      ss >> name >> c.B >> c.Cin >> c.H >> c.W >> c.Cout >> c.K >> c.stride >> c.pad >> c.groups >> bias;
      c.bias = bias != 0;
      cases.push_back({c, {}});
    } else {
      std::vector<double> v;
      std::string tok;
      while (ss >> tok) v.push_back(std::stod(tok));  // shortest round-trip repr: exact
      cases.back().t[tag] = std::move(v);
    }
  }
  return cases;
}

// Against torch.nn.functional.conv2d in float64: the sums differ only in order, so 1e-10 is ample.
TEST(ConvGrouped, MatchesTorchFixture) {
  const std::vector<TorchCase> cases = load_torch_fixture();
  ASSERT_EQ(cases.size(), 4u);
  for (const TorchCase& tc : cases) {
    const Case& c = tc.c;
    const cpu::Conv2dShape s = c.shape();
    const Inputs in{tensor(tc.t.at("x"), {c.B, c.Cin, c.H, c.W}),
                    tensor(tc.t.at("w"), {c.Cout, c.Cin / c.groups, c.K, c.K}),
                    c.bias ? tensor(tc.t.at("b"), {c.Cout}) : Tensor()};
    const Grads g = run(c, in, tensor(tc.t.at("dy"), {c.B, c.Cout, s.OH, s.OW}), DType::f64);
    expect_close(g.y, tc.t.at("y"), 1e-10, 1e-10, c.name() + " y");
    expect_close(g.dx, tc.t.at("dx"), 1e-10, 1e-10, c.name() + " dx");
    expect_close(g.dw, tc.t.at("dw"), 1e-10, 1e-10, c.name() + " dw");
    if (c.bias) expect_close(g.db, tc.t.at("db"), 1e-10, 1e-10, c.name() + " db");
  }
}

// ---- workspace ----

// The workspace the CPU backend allocates for a depthwise conv is what conv2d_*_workspace say (at least one
// element: the backend never allocates an empty buffer); the meta backend's prediction rests on these.
TEST(ConvGrouped, DepthwiseWorkspaceIsWhatTheSizeFunctionsSay) {
  for (const Case& c : {Case{2, 6, 9, 11, 6, 3, 1, 1, 6, true}, Case{2, 4, 11, 9, 8, 5, 2, 2, 4, false}}) {
    const cpu::Conv2dShape s = c.shape();
    const int nt = omp_get_max_threads();
    const Inputs in = make_inputs(c, 600);
    const Tensor x = in.x.to(DType::f32).clone().set_requires_grad(true);
    const Tensor w = in.w.to(DType::f32).clone().set_requires_grad(true);
    const Tensor b = c.bias ? in.b.to(DType::f32).clone().set_requires_grad(true) : Tensor();
    Allocator& alloc = Allocator::get(Device::cpu());
    auto workspace_peak = [&](auto f) {
      alloc.reset_peak();
      const std::size_t base = alloc.stats()[MemoryCategory::workspace].live_bytes;
      f();
      return alloc.stats()[MemoryCategory::workspace].peak_bytes - base;
    };
    Tensor y;
    const std::size_t fwd = workspace_peak([&] { y = ops::conv2d(x, w, b, c.stride, c.pad, c.groups); });
    const std::size_t bwd = workspace_peak([&] { y.backward(ops::ones_like(y)); });
    const auto bytes = [](std::int64_t elems) {
      return static_cast<std::size_t>(std::max<std::int64_t>(elems, 1)) * sizeof(float);
    };
    // Per-thread scratch of a few planes, far below the im2col path's column buffers.
    EXPECT_LT(cpu::conv2d_forward_workspace(s, nt), cpu::conv2d_forward_workspace(s, nt, cpu::ConvPath::im2col))
        << c.name();
    EXPECT_EQ(fwd, bytes(cpu::conv2d_forward_workspace(s, nt))) << c.name();
    EXPECT_EQ(bwd, bytes(cpu::conv2d_backward_workspace(s, nt))) << c.name();
  }
}

}  // namespace
}  // namespace memtrain

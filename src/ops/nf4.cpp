// NF4 frozen weights (memtrain/ops/nf4.h): the front-ends that check operands and allocate the storage, and
// nf4_linear, which never holds W in full precision: W is dequantised a tile of rows at a time into a workspace
// buffer and each tile goes through the backend's gemm_f32 (cpu::gemm_f32 on the CPU, cuBLAS on CUDA, nothing on
// meta). bf16 inputs get a bf16 tile (the autocast rounding of W): the forward multiplies it by the backend's bf16
// matmul (f32 accumulation, one rounding; native bf16 units where the CPU has them).
//
// Backward: dx = dy W walks the same tiles and must sum over them, so a bf16 tile is widened to f32 (exact) and
// the tiles accumulate in one f32 buffer: a bf16 GEMM with f32 accumulation over all of out, rounded once, as a
// dense bf16 linear's backward is. W is frozen, so nothing of x is saved.
#include "memtrain/ops/nf4.h"

#include "core/backend.h"
#include "core/nf4_table.h"
#include "memtrain/autograd/node.h"
#include "memtrain/core/allocator.h"
#include "memtrain/ops/dispatch_modes.h"
#include "memtrain/ops/elementwise.h"
#include "ops/op_utils.h"

#include <algorithm>
#include <numeric>

namespace memtrain::ops {

namespace {

constexpr std::int64_t kTileRowsTarget = 256;  // 256 x 768 f32 = 768 KiB of workspace

void check_weight(const char* op, const Nf4Weight& w) {
  MT_CHECK(w.codes.defined() && w.shape.size() == 2 && w.codes.numel() * 2 == w.shape[0] * w.shape[1], op,
           "not a quantised [out, in] weight (codes {}, shape {})",
           w.codes.defined() ? shape_str(w.codes.shape()) : std::string("undefined"), shape_str(w.shape));
}

// The backend's dequantiser over rows [r0, r0 + rows) of W into tile (dense, x's dtype, >= rows * in elements);
// returns the [rows, in] f32 view the GEMM reads (the widened copy in wide when tile is bf16).
Tensor dequantize_rows(const Nf4Weight& w, std::int64_t r0, std::int64_t rows, const Tensor& tile, const Tensor& wide) {
  const std::int64_t in = w.shape[1];
  const Tensor t = tile.narrow(0, 0, rows * in);
  ::memtrain::detail::backend_for(tile.device())
      .nf4_dequantize(t, w.codes, w.absmax_codes, w.absmax_scales, w.absmax_mean, r0 * in);
  if (!wide.defined()) return t.reshape({rows, in});
  Tensor f = wide.narrow(0, 0, rows * in);
  f.copy_(t);
  return f.reshape({rows, in});
}

// The tile buffers: the dequantised rows in dtype, and their f32 widening when dtype is bf16.
struct Tiles {
  std::int64_t rows;
  Tensor tile, wide;
  Tiles(const Nf4Weight& w, DType dtype, Device device, bool widen)
      : rows(std::min(detail::nf4_tile_rows(w.shape[1], kTileRowsTarget), w.shape[0])) {
    tile = ::memtrain::detail::workspace_on(device, rows * w.shape[1], dtype);
    if (widen && dtype != DType::f32) wide = ::memtrain::detail::workspace_on(device, rows * w.shape[1], DType::f32);
  }
};

// y [N, out] = x [N, in] W^T, no autograd.
Tensor forward(const Tensor& x, const Nf4Weight& w) {
  const auto& backend = ::memtrain::detail::backend_for(x.device());
  const std::int64_t N = x.size(0), out = w.shape[0];
  Tensor y = Tensor::empty({N, out}, x.dtype(), x.device());  // (N, out), in the caller's category
  CategoryGuard workspace(MemoryCategory::workspace);
  const bool narrow = x.dtype() != DType::f32;
  const Tiles tiles(w, x.dtype(), x.device(), false);
  const Tensor y_tile = narrow ? ::memtrain::detail::workspace_on(x.device(), N * tiles.rows, x.dtype()) : Tensor();
  for (std::int64_t r0 = 0; r0 < out; r0 += tiles.rows) {
    const std::int64_t r = std::min(tiles.rows, out - r0);
    const Tensor wt = dequantize_rows(w, r0, r, tiles.tile, tiles.wide);  // (r, in)
    if (!narrow) {
      backend.gemm_f32(y.narrow(1, r0, r), x, wt, false, true, 1.0, 0.0);
    } else {
      const Tensor yt = y_tile.narrow(0, 0, N * r).reshape({N, r});  // matmul writes a dense output
      backend.matmul(yt, x, wt.t());
      y.narrow(1, r0, r).copy_(yt);
    }
  }
  return y;
}

// dx [N, in] = dy [N, out] W, no autograd; f32 accumulation over the tiles.
Tensor backward_x(const Tensor& dy, const Nf4Weight& w) {
  const auto& backend = ::memtrain::detail::backend_for(dy.device());
  const std::int64_t N = dy.size(0), out = w.shape[0], in = w.shape[1];
  Tensor dx = Tensor::empty({N, in}, dy.dtype(), dy.device());
  CategoryGuard workspace(MemoryCategory::workspace);
  const bool narrow = dy.dtype() != DType::f32;
  const Tensor dyf = narrow ? dy.to(DType::f32) : ::memtrain::detail::dense(dy);  // (N, out)
  const Tensor acc = narrow ? ::memtrain::detail::workspace_on(dy.device(), N * in, DType::f32).reshape({N, in}) : dx;
  const Tiles tiles(w, dy.dtype(), dy.device(), true);
  for (std::int64_t r0 = 0; r0 < out; r0 += tiles.rows) {
    const std::int64_t r = std::min(tiles.rows, out - r0);
    const Tensor wt = dequantize_rows(w, r0, r, tiles.tile, tiles.wide);  // (r, in)
    backend.gemm_f32(acc, dyf.narrow(1, r0, r), wt, false, false, 1.0, r0 == 0 ? 0.0 : 1.0);
  }
  if (narrow) dx.copy_(acc);
  return dx;
}

}  // namespace

const std::array<float, 16>& nf4_levels() { return ::memtrain::detail::kNf4Levels; }

std::int64_t Nf4Weight::bytes() const {
  std::int64_t total = 0;
  for (const Tensor* t : {&codes, &absmax_codes, &absmax_scales})
    if (t->defined()) total += static_cast<std::int64_t>(t->nbytes());
  return total;
}

std::int64_t detail::nf4_tile_rows(std::int64_t in, std::int64_t target) {
  const std::int64_t step = kNf4BlockSize / std::gcd(in, kNf4BlockSize);  // rows whose elements fill whole blocks
  return std::max<std::int64_t>(1, (target + step - 1) / step) * step;
}

Nf4Weight nf4_quantize(const Tensor& w) {
  constexpr const char* op = "nf4_quantize";
  detail::check_defined(op, w);
  MT_CHECK(w.dim() == 2, op, "the weight must be a 2-D [out, in] matrix, got {}", shape_str(w.shape()));
  detail::check_floating(op, w);
  const std::int64_t n = w.numel();
  MT_CHECK(n > 0 && n % kNf4BlockSize == 0, op,
           "weight {} has {} elements, not a positive multiple of the block size {} (blocks run over the flattened "
           "matrix; pad the matrix or keep it unquantised)",
           shape_str(w.shape()), n, kNf4BlockSize);
  const Tensor wd = ::memtrain::detail::dense(w);
  Nf4Weight q;
  q.shape = w.shape();
  const std::int64_t blocks = n / kNf4BlockSize;
  {
    CategoryGuard parameters(MemoryCategory::parameters);
    q.codes = Tensor::empty({n / 2}, DType::u8, w.device());
    q.absmax_codes = Tensor::empty({blocks}, DType::u8, w.device());
    q.absmax_scales =
        Tensor::empty({(blocks + kNf4AbsmaxBlockSize - 1) / kNf4AbsmaxBlockSize}, DType::f32, w.device());
  }
  q.absmax_mean = ::memtrain::detail::backend_for(w.device()).nf4_quantize(q.codes, q.absmax_codes, q.absmax_scales, wd);
  return q;
}

Tensor nf4_dequantize(const Nf4Weight& q, DType dtype) {
  check_weight("nf4_dequantize", q);
  MT_CHECK(dtype == DType::f32 || dtype == DType::bf16, "nf4_dequantize", "dtype must be f32 or bf16, got {}",
           dtype_name(dtype));
  Tensor out = Tensor::empty(q.shape, dtype, q.codes.device());
  ::memtrain::detail::backend_for(out.device())
      .nf4_dequantize(out, q.codes, q.absmax_codes, q.absmax_scales, q.absmax_mean, 0);
  return out;
}

Tensor nf4_linear(const Tensor& x, const Nf4Weight& w, const Tensor& bias) {
  constexpr const char* op = "nf4_linear";
  detail::check_defined(op, x);
  check_weight(op, w);
  if (auto c = detail::cast_mode_to_compute(x, bias)) return nf4_linear((*c)[0], w, (*c)[1]);
  MT_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16, op, "x must be f32 or bf16, got {}",
           dtype_name(x.dtype()));
  MT_CHECK(x.dim() >= 1 && x.size(-1) == w.shape[1], op, "input {} does not match weight {} ([out, in])",
           shape_str(x.shape()), shape_str(w.shape));
  MT_CHECK(x.device() == w.codes.device(), op, "x is on {}, the weight on {}", x.device().str(),
           w.codes.device().str());
  Shape out_shape = x.shape();
  out_shape.back() = w.shape[0];
  const Tensor x2 = x.reshape({-1, w.shape[1]});  // (N, in)
  const double flops = 2.0 * static_cast<double>(x2.size(0)) * static_cast<double>(w.shape[0] * w.shape[1]);
  Tensor y = detail::compute_or_replay(op, flops, [&] {
               return std::vector<Tensor>{forward(::memtrain::detail::dense(x2), w)};
             })[0];
  if (autograd::needs_grad({&x2})) {
    autograd::record(op, {x2}, {y}, [w](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{backward_x(g[0], w)};  // (N, in)
    });
  }
  if (bias.defined()) {
    MT_CHECK(bias.dim() == 1 && bias.size(0) == w.shape[0], op, "bias {} does not match weight {}",
             shape_str(bias.shape()), shape_str(w.shape));
    y = add(y, bias);
  }
  return y.reshape(out_shape);
}

}  // namespace memtrain::ops

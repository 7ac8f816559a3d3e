// The CUDA backend's entries for the nn ops of src/ops/nn_*.cpp (embedding, softmax, losses, dropout) over the
// raw launchers of cuda/nn.h. Each entry checks what its kernels take (f32, bf16 or f16, contiguous,
// one dtype), naming the op; index operands are copied to the host once to be range-checked like the CPU's.
#include "cuda/cuda_backend_entries.h"

#include "core/operand_checks.h"
#include "core/pool_shape.h"
#include "cuda/conv.h"
#include "cuda/nn.h"
#include "cuda/nn_spatial.h"

#include <cstdint>
#include <limits>

namespace memtrain::cuda {

namespace nd = ::memtrain::detail;

namespace {

// A small contiguous device vector in another dtype, converted on the host (no device cast is used here):
// e.g. per-row losses f32 <-> bf16. No copy when it already has the dtype.
inline Tensor convert_via_host(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  return t.detach().to(Device::cpu()).to(dtype).to(t.device());
}

// Rows of a contiguous array reduced over its last dim: the product of the other dims (1 for a scalar).
std::int64_t rows_of(const Tensor& t) {
  std::int64_t n = 1;
  for (std::int64_t d = 0; d + 1 < t.dim(); ++d) n *= t.size(d);
  return n;
}

}  // namespace

// ---- embedding ----

void CudaBackend::embedding_forward(const Tensor& out, const Tensor& weight, const Tensor& indices) const {
  const char* op = "embedding";
  nd::check_cuda_data(op, "weight", weight);
  const std::int64_t V = weight.size(0), C = weight.size(1);
  const Tensor host = nd::index_to_host(op, "indices", indices);  // checks indices is contiguous
  nd::dispatch_index(host.dtype(), [&](auto izero) {
    using I = decltype(izero);
    nd::check_index_range(op, "index", host.data<I>(), host.numel(), V, false, 0, indices.shape());
  });
  cuda::embedding_forward(out.data_ptr(), weight.data_ptr(), indices.data_ptr(), weight.dtype(), indices.dtype(),
                          indices.numel(), V, C, weight.device().index);
}

void CudaBackend::embedding_backward(const Tensor& dweight, const Tensor& dout, const Tensor& indices,
                                     bool accumulate) const {
  const char* op = "embedding_backward";
  MT_CHECK(dout.dtype() == dweight.dtype(), op, "output gradient {} {} on {} is not supported yet: expected {}",
           dtype_name(dout.dtype()), shape_str(dout.shape()), dout.device().str(), dtype_name(dweight.dtype()));
  nd::check_cuda_data(op, "output gradient", dout);
  if (!accumulate) fill(dweight, 0.0);  // the kernel adds into it
  cuda::embedding_backward(dweight.data_ptr(), dout.data_ptr(), indices.data_ptr(), dweight.dtype(), indices.dtype(),
                           indices.numel(), dweight.size(0), dweight.size(1), dout.device().index);
}

// ---- dropout ----

void CudaBackend::dropout_forward(const Tensor& out, const Tensor& x, double p, const RngState& state) const {
  nd::check_cuda_data("dropout", "input", x);
  cuda::dropout_forward(out.data_ptr(), x.data_ptr(), x.dtype(), static_cast<std::size_t>(x.numel()), p, state,
                        x.device().index);
}

void CudaBackend::dropout_backward(const Tensor& dx, const Tensor& dout, double p, const RngState& state) const {
  const char* op = "dropout_backward";
  MT_CHECK(dout.dtype() == dx.dtype(), op, "output gradient {} {} on {} is not supported yet: expected {}",
           dtype_name(dout.dtype()), shape_str(dout.shape()), dout.device().str(), dtype_name(dx.dtype()));
  nd::check_cuda_data(op, "output gradient", dout);
  cuda::dropout_backward(dx.data_ptr(), dout.data_ptr(), dout.dtype(), static_cast<std::size_t>(dout.numel()), p,
                         state, dout.device().index);
}

// ---- pooling ----

namespace {

// An operand of the pooling kernels: dtype `dtype` (f32, bf16 or f16), packed contiguous when it is not.
Tensor pool_operand(const char* op, const char* what, const Tensor& t, DType dtype) {
  MT_CHECK(t.dtype() == dtype, op, "{} {} {} does not have the input's dtype {}", what, dtype_name(t.dtype()),
           shape_str(t.shape()), dtype_name(dtype));
  const Tensor c = t.detach().contiguous();
  nd::check_cuda_data(op, what, c);
  return c;
}

}  // namespace

void CudaBackend::pool2d_forward(const Tensor& out, const Tensor& x, std::int64_t kernel, std::int64_t stride,
                                 std::int64_t padding, bool is_max) const {
  const char* op = is_max ? "max_pool2d" : "avg_pool2d";
  const Tensor xc = pool_operand(op, "input", x, x.dtype());
  const Pool2dShape s = ::memtrain::detail::pool2d_shape<Pool2dShape>(x, out, kernel, stride, padding);
  if (is_max) {
    cuda::max_pool2d_forward(out.data_ptr(), xc.data_ptr(), x.dtype(), s, x.device().index);
  } else {
    cuda::avg_pool2d_forward(out.data_ptr(), xc.data_ptr(), x.dtype(), s, x.device().index);
  }
}

void CudaBackend::pool2d_backward(const Tensor& dx, const Tensor& dout, const Tensor& x, std::int64_t kernel,
                                  std::int64_t stride, std::int64_t padding, bool is_max) const {
  const char* op = is_max ? "max_pool2d" : "avg_pool2d";
  const Tensor g = pool_operand(op, "output gradient", dout, dx.dtype());
  const Pool2dShape s = ::memtrain::detail::pool2d_shape<Pool2dShape>(dx, dout, kernel, stride, padding);
  if (is_max) {
    nd::check_same_device(op, "input", x, "output gradient", g);
    const Tensor xc = pool_operand(op, "input", x, dx.dtype());
    cuda::max_pool2d_backward(dx.data_ptr(), g.data_ptr(), xc.data_ptr(), dx.dtype(), s, g.device().index);
  } else {
    cuda::avg_pool2d_backward(dx.data_ptr(), g.data_ptr(), dx.dtype(), s, g.device().index);
  }
}

// ---- conv2d ----

namespace {

Conv2dShape conv_shape(const Shape& x, const Shape& w, std::int64_t stride, std::int64_t padding, std::int64_t groups) {
  const auto out_size = [&](std::int64_t in, std::int64_t k) { return (in + 2 * padding - k) / stride + 1; };
  return {x[0], x[1], x[2], x[3], w[0], w[2], w[3], stride, padding, groups, out_size(x[2], w[2]), out_size(x[3], w[3])};
}

// An operand of the conv kernels: the dtype of `ref` (f32, bf16 or f16), packed contiguous when it is not.
Tensor conv_operand(const char* op, const char* what, const Tensor& t, const Tensor& ref) {
  nd::check_same_device(op, "input", ref, what, t);
  nd::check_cuda_same_dtype(op, what, t, "input", ref);
  const Tensor c = t.detach().contiguous();
  nd::check_cuda_data(op, what, c);
  return c;
}

}  // namespace

void CudaBackend::conv2d_forward(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                                 std::int64_t stride, std::int64_t padding, std::int64_t groups) const {
  const char* op = "conv2d";
  MT_CHECK(nd::is_cuda_kernel_dtype(x.dtype()), op,
           "input of dtype {} on {} is not supported yet: the CUDA kernels take f32, bf16 or f16", dtype_name(x.dtype()),
           x.device().str());
  const Tensor xc = conv_operand(op, "input", x, x), wc = conv_operand(op, "weight", weight, x);
  const Tensor bc = bias.defined() ? conv_operand(op, "bias", bias, x) : Tensor();
  cuda::conv2d_forward(out.data_ptr(), xc.data_ptr(), wc.data_ptr(), ptr_or_null(bc), x.dtype(),
                       conv_shape(x.shape(), weight.shape(), stride, padding, groups), x.device().index);
}

void CudaBackend::conv2d_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dout,
                                  const Tensor& x, const Tensor& weight, const Shape& x_shape, const Shape& w_shape,
                                  std::int64_t stride, std::int64_t padding, std::int64_t groups) const {
  const char* op = "conv2d_backward";
  const bool want_dx = dx.defined(), want_dw = dw.defined();
  // A saved tensor holds the forward's dtype and device (none is saved when only db is wanted).
  const Tensor& ref = want_dw ? x : (want_dx ? weight : dout);
  const Tensor g = conv_operand(op, "output gradient", dout, ref);
  const Tensor xc = want_dw ? conv_operand(op, "input", x, ref) : Tensor();
  const Tensor wc = want_dx ? conv_operand(op, "weight", weight, ref) : Tensor();
  cuda::conv2d_backward(out_or_null(dx), out_or_null(dw), out_or_null(db), g.data_ptr(), ptr_or_null(xc),
                        ptr_or_null(wc), g.dtype(), conv_shape(x_shape, w_shape, stride, padding, groups),
                        g.device().index);
}

// ---- softmax ----

// The kernels reduce over the last dim of a contiguous array: another dim (or a strided operand) is first
// moved there by a transposed copy, and the result moved back into place.
void CudaBackend::softmax_forward(const Tensor& out, const Tensor& x, std::int64_t dim, bool log) const {
  const char* op = log ? "log_softmax" : "softmax";
  const std::int64_t last = x.dim() - 1;
  const bool moved = x.dim() > 0 && (dim != last || !x.is_contiguous());
  const Tensor xt = moved ? x.detach().transpose(dim, last).contiguous() : x;
  nd::check_cuda_data(op, "input", xt);
  const Tensor y = moved ? Tensor::empty(xt.shape(), xt.dtype(), xt.device()) : out;
  const std::int64_t C = xt.dim() == 0 ? 1 : xt.size(-1), N = rows_of(xt);
  if (log) {
    cuda::log_softmax_forward(y.data_ptr(), xt.data_ptr(), xt.dtype(), N, C, xt.device().index);
  } else {
    cuda::softmax_forward(y.data_ptr(), xt.data_ptr(), xt.dtype(), N, C, xt.device().index);
  }
  if (moved) copy(out, y.transpose(dim, last));
}

void CudaBackend::softmax_backward(const Tensor& dx, const Tensor& dout, const Tensor& out, std::int64_t dim,
                                   bool log) const {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  nd::check_cuda_same_dtype(op, "output gradient", dout, "output", out);
  const std::int64_t last = out.dim() - 1;
  const bool moved = out.dim() > 0 && dim != last;
  const Tensor y = moved ? out.detach().transpose(dim, last).contiguous() : out;
  // The gradient may arrive as a strided view: the kernel reads it packed.
  const Tensor g = moved ? dout.detach().transpose(dim, last).contiguous() : dout.contiguous();
  nd::check_cuda_data(op, "output gradient", g);
  const Tensor d = moved ? Tensor::empty(y.shape(), y.dtype(), y.device()) : dx;
  const std::int64_t C = y.dim() == 0 ? 1 : y.size(-1), N = rows_of(y);
  if (log) {
    cuda::log_softmax_backward(d.data_ptr(), g.data_ptr(), y.data_ptr(), y.dtype(), N, C, y.device().index);
  } else {
    cuda::softmax_backward(d.data_ptr(), g.data_ptr(), y.data_ptr(), y.dtype(), N, C, y.device().index);
  }
  if (moved) copy(dx, d.transpose(dim, last));
}

// ---- cross_entropy ----

// The per-row losses and lse are f32; the targets (and, for a scalar result, the [N] losses) are copied to the
// host, where they are range-checked, counted and summed in double exactly like the CPU path.
DType CudaBackend::loss_stats_dtype(DType) const { return DType::f32; }

std::int64_t CudaBackend::cross_entropy_forward(const Tensor& out, const Tensor& lse, const Tensor& logits,
                                                const Tensor& targets, std::int64_t ignore_index, bool mean) const {
  const char* op = "cross_entropy";
  nd::check_cuda_data(op, "logits", logits);
  const std::int64_t N = logits.size(0), V = logits.size(1);
  const Tensor t = targets.detach();
  const std::int64_t count = nd::count_checked_targets(op, nd::index_to_host(op, "targets", t), V, ignore_index,
                                                       targets.shape());  // index_to_host checks t is contiguous
  const bool per_row = out.dim() == 1;
  const Tensor losses =
      per_row && out.dtype() == DType::f32 ? out : Tensor::empty({N}, DType::f32, logits.device());
  cuda::cross_entropy_forward(losses.data<float>(), lse.data<float>(), logits.data_ptr(), logits.dtype(), t.data_ptr(),
                              t.dtype(), N, V, ignore_index, logits.device().index);
  if (per_row) {
    if (!losses.shares_storage_with(out)) copy(out, convert_via_host(losses, out.dtype()));
    return count;
  }
  // Summed in double on the host, in row order (a copy of [N] floats from the device).
  const Tensor host = losses.to(Device::cpu());
  double total = 0;
  for (std::int64_t i = 0; i < N; ++i) total += static_cast<double>(host.data<float>()[i]);
  fill(out, !mean ? total : count > 0 ? total / static_cast<double>(count) : std::numeric_limits<double>::quiet_NaN());
  return count;
}

// The loss gradient becomes the f32 dloss vector (stride 1) or scale (stride 0) the kernel reads; for a scalar
// loss the scale is formed on the host in f32, as the CPU path does.
void CudaBackend::cross_entropy_backward(const Tensor& dlogits, const Tensor& dloss, const Tensor& logits,
                                         const Tensor& targets, const Tensor& lse, std::int64_t ignore_index,
                                         bool per_row, std::int64_t divisor) const {
  const char* op = "cross_entropy_backward";
  const Tensor& g = dloss;
  const Device dev = logits.device();
  const std::int64_t N = logits.size(0), V = logits.size(1);
  Tensor dl;  // f32 on dev
  std::int64_t stride = 0;
  if (per_row) {
    MT_CHECK(g.dim() == 1 && g.size(0) == N, op, "loss gradient {} does not match {} rows", shape_str(g.shape()), N);
    if (g.dtype() == DType::f32) {
      dl = g;  // any stride: the kernel reads dloss[n * stride]
      stride = N > 1 ? g.stride(0) : 0;
    } else if (N > 0 && g.stride(0) == 0) {  // an expanded scalar, e.g. from sum()'s backward
      dl = full({1}, static_cast<double>(static_cast<float>(g.detach().select(0, 0).item())), DType::f32, dev);
    } else {
      MT_CHECK(g.is_contiguous(), op, "a non-contiguous {} loss gradient {} with strides {} on {} is not supported yet",
               dtype_name(g.dtype()), shape_str(g.shape()), shape_str(g.strides()), dev.str());
      dl = convert_via_host(g, DType::f32);
      stride = 1;
    }
  } else {
    MT_CHECK(g.numel() == 1, op, "loss gradient {} is not a scalar", shape_str(g.shape()));
    auto scale = static_cast<float>(g.item());
    scale /= static_cast<float>(divisor);
    dl = full({1}, static_cast<double>(scale), DType::f32, dev);
  }
  cuda::cross_entropy_backward(dlogits.data_ptr(), dl.data<float>(), stride, logits.data_ptr(), lse.data<float>(),
                               logits.dtype(), targets.data_ptr(), targets.dtype(), N, V, ignore_index, dev.index);
}

}  // namespace memtrain::cuda

// The CUDA backend's FP8, loss-scaler and batch-norm entries (src/cuda/cuda_backend_entries.h) over the raw
// launchers of cuda/convert.h, cuda.h, reduce.h and nn_spatial.h, called with the arguments the amp
// and ops front-ends passed them before these entries existed. Host results (an amax, a finiteness verdict)
// come back through one small device buffer, counted as workspace, whose read waits for the kernels.
#include "cuda/cuda_backend_entries.h"

#include "memtrain/core/allocator.h"
#include "cuda/convert.h"
#include "cuda/device_ops.h"
#include "cuda/nn_spatial.h"
#include "cuda/reduce.h"

#include <cmath>
#include <cstdint>
#include <map>

namespace memtrain::cuda {
namespace {

using Fp8Counts = ::memtrain::detail::Backend::Fp8Counts;

std::size_t count(const Tensor& t) { return static_cast<std::size_t>(t.numel()); }

// x as a (rows, cols) matrix: cols is the last dim.
std::int64_t matrix_rows(const Tensor& x) {
  std::int64_t rows = 1;
  for (std::int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  return rows;
}

// One device f32 that a kernel writes an amax into (0 when n == 0): a transient, so workspace.
Tensor device_float(Device device) {
  CategoryGuard workspace(MemoryCategory::workspace);
  return Tensor::empty({1}, DType::f32, device);
}

// The host copy of a device float; the copy waits for the kernel that writes it.
float read_back(const Tensor& f) { return static_cast<float>(f.item()); }

// Contiguous f32/bf16/f16 gradients are unscaled where they live: multiplied by 1 / scale (the unary entry,
// as ops::mul_ did), then checked by their max |g| (cuda::amax: NaN when any element is NaN, Inf when any is
// Inf), one float per gradient read back in one copy.
bool unscale_on_device(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

}  // namespace

// ---- FP8 ----

float CudaBackend::amax(const Tensor& x) const {
  const Tensor out = device_float(x.device());
  cuda::amax(x.data_ptr(), x.dtype(), count(x), out.data<float>(), x.device().index);
  return read_back(out);
}

// The kernels count nothing (a host copy just to count would hide a device round trip in the step).
Fp8Counts CudaBackend::quantize_fp8(const Tensor& codes, const Tensor& x, float scale, float* amax_out) const {
  if (amax_out == nullptr) {
    cuda::quantize_fp8(x.data_ptr(), x.dtype(), scale, codes.data_ptr(), codes.dtype(), count(x), nullptr,
                       x.device().index);
    return {};
  }
  const Tensor amax_dev = device_float(x.device());
  cuda::quantize_fp8(x.data_ptr(), x.dtype(), scale, codes.data_ptr(), codes.dtype(), count(x),
                     amax_dev.data<float>(), x.device().index);
  *amax_out = read_back(amax_dev);
  return {};
}

void CudaBackend::dequantize_fp8(const Tensor& out, const Tensor& codes, float inv_scale) const {
  cuda::dequantize_fp8(codes.data_ptr(), codes.dtype(), inv_scale, out.data_ptr(), out.dtype(), count(codes),
                       codes.device().index);
}

Fp8Counts CudaBackend::quantize_fp8_blockwise(const Tensor& codes, const Tensor& inv_scales, const Tensor& x,
                                              Fp8Tiling tiling) const {
  cuda::quantize_fp8_blockwise(x.data_ptr(), x.dtype(), codes.data_ptr(), codes.dtype(), inv_scales.data<float>(),
                               matrix_rows(x), x.size(-1), tiling, x.device().index);
  return {};
}

void CudaBackend::dequantize_fp8_blockwise(const Tensor& out, const Tensor& codes, const Tensor& inv_scales,
                                           Fp8Tiling tiling) const {
  cuda::dequantize_fp8_blockwise(codes.data_ptr(), codes.dtype(), inv_scales.data<const float>(), out.data_ptr(),
                                 out.dtype(), matrix_rows(codes), codes.size(-1), tiling, codes.device().index);
}

// cuda::sum_dim over the rows of an f32 copy (exact), accumulated in f64 in a fixed order and rounded once to f32:
// the CPU's f64 sums in another order. A bf16 out then rounds a second time, from f32, which can land one bf16 ulp
// away from the CPU's single rounding.
void CudaBackend::column_sums(const Tensor& out, const Tensor& g) const {
  const Tensor g32 = [&] {
    CategoryGuard workspace(MemoryCategory::workspace);
    return g.to(DType::f32);
  }();
  const Tensor sums = [&] {
    if (out.dtype() == DType::f32) return out;
    CategoryGuard workspace(MemoryCategory::workspace);
    return Tensor::empty({g.size(1)}, DType::f32, g.device());
  }();
  cuda::sum_dim(g32.data_ptr(), sums.data_ptr(), DType::f32, 1, g.size(0), g.size(1), g.device().index);
  if (out.dtype() != DType::f32) {
    Tensor dst = out;  // a handle: copy_ writes the caller's storage
    dst.copy_(sums);
  }
}

// ---- the loss scaler ----

// Gradients the kernels cannot take (f64, strided, empty) are unscaled on the CPU through a host copy, in list
// order; the others on the device afterwards, their finiteness read back in one copy.
bool CudaBackend::unscale_grads(const std::vector<Tensor>& grads, double scale) const {
  bool found_inf = false;
  std::vector<Tensor> on_device;
  for (const Tensor& g : grads) {
    if (g.is_contiguous() && unscale_on_device(g.dtype()) && g.numel() > 0) {
      on_device.push_back(g);
      continue;
    }
    CategoryGuard category(MemoryCategory::workspace);
    const Tensor work = g.to(Device::cpu()).contiguous();
    found_inf |= ::memtrain::detail::backend_for(Device::cpu()).unscale_grads({work}, scale);
    Tensor target = g;
    target.copy_(work);
  }
  if (on_device.empty()) return found_inf;
  const Device device = on_device.front().device();
  CategoryGuard category(MemoryCategory::workspace);
  const Tensor amaxes = Tensor::empty({static_cast<std::int64_t>(on_device.size())}, DType::f32, device);
  for (std::size_t i = 0; i < on_device.size(); ++i) {
    const Tensor& g = on_device[i];
    unary(g, g.detach(), UnaryOp::mul_scalar, 1.0 / scale, 0.0);
    cuda::amax(g.data_ptr(), g.dtype(), count(g), amaxes.data<float>() + i, device.index);
  }
  const Tensor host = amaxes.to(Device::cpu());
  for (std::size_t i = 0; i < on_device.size(); ++i) found_inf |= !std::isfinite(host.data<float>()[i]);
  return found_inf;
}

// ---- batch norm: the fused kernels of cuda/nn_spatial.h ----

bool CudaBackend::has_batch_norm_kernels() const { return true; }

void CudaBackend::batch_norm_forward(const Tensor& y, const Tensor& save_mean, const Tensor& save_invstd,
                                     const Tensor& running_mean, const Tensor& running_var, const Tensor& x,
                                     const Tensor& weight, const Tensor& bias, bool training, double momentum,
                                     double eps) const {
  check_nn_operands("batch_norm", x,
                    {{"weight", &weight}, {"bias", &bias}, {"running_mean", &running_mean},
                     {"running_var", &running_var}});
  const std::int64_t B = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  cuda::batch_norm_forward(y.data_ptr(), save_mean.data<float>(), save_invstd.data<float>(), out_or_null(running_mean),
                           out_or_null(running_var), x.data_ptr(), ptr_or_null(weight), ptr_or_null(bias), x.dtype(),
                           B, C, HW, training, momentum, eps, x.device().index);
}

void CudaBackend::batch_norm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dout,
                                      const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                                      const Tensor& save_invstd, bool training) const {
  check_nn_operands("batch_norm_backward", x, {{"output gradient", &dout}});
  const std::int64_t B = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  cuda::batch_norm_backward(dx.data_ptr(), out_or_null(dw), out_or_null(db), dout.data_ptr(), x.data_ptr(),
                            ptr_or_null(weight), save_mean.data<float>(), save_invstd.data<float>(), x.dtype(), B, C,
                            HW, training, x.device().index);
}

}  // namespace memtrain::cuda

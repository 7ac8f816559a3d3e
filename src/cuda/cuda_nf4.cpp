// The CUDA backend's NF4 entries (src/cuda/cuda_backend_entries.h). Quantising runs once per weight, so it is the
// CPU quantiser on a host copy (both devices then store the same bits); dequantising is nf4.cu's kernel.
#include "cuda/cuda_backend_entries.h"

#include "core/nf4_table.h"
#include "core/quant_codebook.h"
#include "cuda/cuda_common.h"
#include "kernels/nf4.cuh"
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"

namespace memtrain::cuda {

float CudaBackend::nf4_quantize(const Tensor& codes, const Tensor& absmax_codes, const Tensor& absmax_scales,
                                const Tensor& w) const {
  CategoryGuard workspace(MemoryCategory::workspace);
  const Tensor host_w = w.detach().to(Device::cpu());
  const Tensor hc = Tensor::empty(codes.shape(), DType::u8), hac = Tensor::empty(absmax_codes.shape(), DType::u8),
               has = Tensor::empty(absmax_scales.shape(), DType::f32);
  const float mean = ::memtrain::detail::backend_for(Device::cpu()).nf4_quantize(hc, hac, has, host_w);
  Tensor(codes).copy_(hc);
  Tensor(absmax_codes).copy_(hac);
  Tensor(absmax_scales).copy_(has);
  return mean;
}

void CudaBackend::nf4_dequantize(const Tensor& out, const Tensor& codes, const Tensor& absmax_codes,
                                 const Tensor& absmax_scales, float absmax_mean, std::int64_t start) const {
  constexpr const char* op = "cuda::nf4_dequantize";
  MT_CHECK((out.dtype() == DType::f32 || out.dtype() == DType::bf16) && out.is_contiguous(), op,
           "out must be contiguous f32 or bf16, got {}", dtype_name(out.dtype()));
  Nf4Tables tables{};
  for (int i = 0; i < 16; ++i) tables.levels[i] = ::memtrain::detail::kNf4Levels[static_cast<std::size_t>(i)];
  const float* values = ::memtrain::detail::quant_codebook(QuantMap::signed_dynamic).values;
  for (int i = 0; i < 256; ++i) tables.absmax_map[i] = values[i];
  const int device = out.device().index;
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  MT_CUDA_CHECK(op, launch_nf4_dequantize, codes.data<const std::uint8_t>(), absmax_codes.data<const std::uint8_t>(),
                absmax_scales.data<const float>(), tables, absmax_mean, start / 64, out.numel() / 64, out.data_ptr(),
                out.dtype() == DType::bf16, detail::launch_stream());
}

}  // namespace memtrain::cuda

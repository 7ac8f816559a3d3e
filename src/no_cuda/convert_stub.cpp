// The entry points of memtrain/cuda/convert.h in a build without CUDA: each throws
// "cuda::<name>: memtrain was built without CUDA".
#include "memtrain/cuda/convert.h"

#include "memtrain/core/error.h"

namespace memtrain::cuda {

namespace {
[[noreturn]] void not_built(const char* op) { ::memtrain::detail::throw_error(op, "memtrain was built without CUDA"); }
}  // namespace

void cast(const void*, DType, void*, DType, std::size_t, int) { not_built("cuda::cast"); }
void quantize_fp8(const void*, DType, float, void*, DType, std::size_t, float*, int) {
  not_built("cuda::quantize_fp8");
}
void quantize_fp8(const void*, DType, const float*, void*, DType, std::size_t, float*, int) {
  not_built("cuda::quantize_fp8");
}
void dequantize_fp8(const void*, DType, float, void*, DType, std::size_t, int) { not_built("cuda::dequantize_fp8"); }
void dequantize_fp8(const void*, DType, const float*, void*, DType, std::size_t, int) {
  not_built("cuda::dequantize_fp8");
}
void quantize_fp8_blockwise(const void*, DType, void*, DType, float*, std::int64_t, std::int64_t, Fp8Tiling, int) {
  not_built("cuda::quantize_fp8_blockwise");
}
void dequantize_fp8_blockwise(const void*, DType, const float*, void*, DType, std::int64_t, std::int64_t, Fp8Tiling,
                              int) {
  not_built("cuda::dequantize_fp8_blockwise");
}
void amax(const void*, DType, std::size_t, float*, int) { not_built("cuda::amax"); }
void sum(const void*, DType, std::size_t, float*, int) { not_built("cuda::sum"); }
void sum_rows(const void*, DType, std::int64_t, std::int64_t, float*, int) { not_built("cuda::sum_rows"); }

}  // namespace memtrain::cuda

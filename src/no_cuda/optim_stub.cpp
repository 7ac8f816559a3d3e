// The CUDA optimizer entry points (memtrain/cuda/optim.h) in a build without CUDA: each throws
// "cuda::<name>: memtrain was built without CUDA".
#include "memtrain/cuda/optim.h"

#include "memtrain/core/error.h"

namespace memtrain::cuda {

namespace {
[[noreturn]] void not_built(const char* op) { ::memtrain::detail::throw_error(op, "memtrain was built without CUDA"); }
}  // namespace

void sgd_step(float*, const float*, float*, std::size_t, const SgdHyper&, int) { not_built("cuda::sgd_step"); }
void adamw_step(float*, const float*, float*, float*, std::size_t, const AdamWHyper&, int) {
  not_built("cuda::adamw_step");
}
void lion_step(float*, const float*, float*, std::size_t, const LionHyper&, int) { not_built("cuda::lion_step"); }
void adamw8bit_step(float*, const float*, std::uint8_t*, float*, std::uint8_t*, float*, std::size_t, std::int64_t,
                    const AdamWHyper&, int) {
  not_built("cuda::adamw8bit_step");
}
void lion8bit_step(float*, const float*, std::uint8_t*, float*, std::size_t, std::int64_t, const LionHyper&, int) {
  not_built("cuda::lion8bit_step");
}
void quantize_blockwise(const float*, std::uint8_t*, float*, std::size_t, std::int64_t, optim::QuantMap, int) {
  not_built("cuda::quantize_blockwise");
}
void dequantize_blockwise(const std::uint8_t*, const float*, float*, std::size_t, std::int64_t, optim::QuantMap, int) {
  not_built("cuda::dequantize_blockwise");
}
bool grad_is_finite(const float*, std::size_t, int) { not_built("cuda::grad_is_finite"); }

}  // namespace memtrain::cuda

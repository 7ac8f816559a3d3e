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
std::size_t adafactor_workspace_bytes(std::size_t, std::int64_t, std::int64_t, std::int64_t) {
  not_built("cuda::adafactor_workspace_bytes");
}
void adafactor_factored_step(float*, const float*, float*, float*, float*, std::int64_t, std::int64_t, std::int64_t,
                             const AdafactorHyper&, void*, int) {
  not_built("cuda::adafactor_factored_step");
}
void adafactor_vector_step(float*, const float*, float*, float*, std::size_t, const AdafactorHyper&, void*, int) {
  not_built("cuda::adafactor_vector_step");
}
void orthonormalize_columns(float*, std::int64_t, std::int64_t, int) { not_built("cuda::orthonormalize_columns"); }
void top_singular_vectors(const float*, std::int64_t, std::int64_t, std::int64_t, float*, float*, int) {
  not_built("cuda::top_singular_vectors");
}
void transpose(const float*, std::int64_t, std::int64_t, float*, int) { not_built("cuda::transpose"); }

}  // namespace memtrain::cuda

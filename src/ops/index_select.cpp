// index_select: the slices of x at `indices` along one dim. Floating x goes through embedding, a row gather
// with a scatter-add backward that every backend has: the dim is moved to the front (transpose, then a
// copy only when that is not already contiguous), x is read as [n, rest] rows, gathered, and moved back.
// So the backward (repeated indices accumulate) and the meta accounting are embedding's. Integer and bool
// x (dataset code: token ids, labels) have no gradient; their slices are copied one by one.
#include "memtrain/ops/dispatch_modes.h"
#include "memtrain/ops/nn.h"
#include "memtrain/ops/shape.h"
#include "ops/nn_common.h"

namespace memtrain::ops {

namespace {

// Throws naming the index, its position, the dim and its size, when an index lies outside [0, n). `host`:
// the indices, contiguous on the CPU (a meta tensor's read as zeros there, so only an empty dim fails).
void check_range(const char* op, const Tensor& host, std::int64_t d, const Tensor& x) {
  const std::int64_t n = x.size(d);
  ::memtrain::detail::dispatch_index(host.dtype(), [&](auto izero) {
    using I = decltype(izero);
    const I* idx = host.data<I>();
    for (std::int64_t k = 0; k < host.numel(); ++k) {
      const auto v = static_cast<std::int64_t>(idx[k]);
      MT_CHECK(v >= 0 && v < n, op, "index {} at position {} is out of range for dim {} of size {} (input {})", v,
               k, d, n, shape_str(x.shape()));
    }
  });
}

}  // namespace

Tensor index_select(const Tensor& x, std::int64_t dim, const Tensor& indices) {
  const char* op = "index_select";
  detail::check_defined(op, x);
  detail::check_index(op, "indices", indices);
  detail::check_same_device(op, "input", x, "indices", indices);
  MT_CHECK(x.dim() >= 1, op, "needs an input of rank >= 1, got shape {}", shape_str(x.shape()));
  MT_CHECK(indices.dim() == 1, op, "indices must be 1-D, got {}", shape_str(indices.shape()));
  const std::int64_t d = detail::wrap_dim(op, dim, x.shape());
  // Checked here, so the message names this op and the dim (embedding would name itself). On CUDA this
  // copies the (small) index vector to the host and waits for it, as cross_entropy's check does.
  const Tensor host = indices.detach().contiguous().to(Device::cpu());
  check_range(op, host, d, x);
  const std::int64_t k = indices.size(0);

  if (!is_floating(x.dtype())) {
    Shape shape = x.shape();
    shape[static_cast<std::size_t>(d)] = k;
    const Tensor out = Tensor::empty(shape, x.dtype(), x.device());
    const Tensor src = x.detach();
    ::memtrain::detail::dispatch_index(host.dtype(), [&](auto izero) {
      using I = decltype(izero);
      const I* idx = host.data<I>();
      for (std::int64_t j = 0; j < k; ++j) out.select(d, j).copy_(src.select(d, static_cast<std::int64_t>(idx[j])));
    });
    return out;
  }

  // A data-movement op keeps x's dtype: embedding's autocast rule (output in the compute dtype) must not apply.
  CastModeGuard no_cast(nullptr);
  const Tensor moved = d == 0 ? x : x.transpose(0, d);  // (n, ...)
  const std::int64_t n = moved.size(0);
  const std::int64_t rest = shape_numel(Shape(moved.shape().begin() + 1, moved.shape().end()));
  const Tensor rows = embedding(moved.reshape({n, rest}), indices);  // (k, rest)
  Shape moved_shape = moved.shape();
  moved_shape[0] = k;
  const Tensor out = rows.view(moved_shape);  // (k, ...)
  return d == 0 ? out : out.transpose(0, d).contiguous();
}

}  // namespace memtrain::ops

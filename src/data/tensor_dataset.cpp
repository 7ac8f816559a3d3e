// TensorDataset: rows of two in-memory tensors gathered into batches by plain byte copies (any dtype; the
// rows of a contiguous [N, ...] tensor are consecutive, equal-sized runs of bytes).
#include "memtrain/data/tensor_dataset.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"

#include <cstring>

namespace memtrain::data {

namespace {

constexpr const char* kWhere = "TensorDataset";

// t detached, on the CPU, contiguous: what collate reads from (a copy only when t is not that already).
Tensor host_rows(const Tensor& t) {
  CategoryGuard guard(MemoryCategory::data);
  return t.detach().to(Device::cpu()).contiguous();
}

// Rows `indices` of src [N, ...] -> [B, ...] under MemoryCategory::data.
Tensor gather_rows(const Tensor& src, const std::vector<std::int64_t>& indices) {
  Shape shape = src.shape();
  shape[0] = static_cast<std::int64_t>(indices.size());
  Tensor out;
  {
    CategoryGuard guard(MemoryCategory::data);
    out = Tensor::empty(shape, src.dtype());
  }
  const std::size_t row_bytes = static_cast<std::size_t>(shape_numel(Shape(shape.begin() + 1, shape.end()))) *
                                src.element_size();
  if (row_bytes == 0) return out;
  const auto* from = static_cast<const unsigned char*>(src.data_ptr());
  auto* to = static_cast<unsigned char*>(out.data_ptr());
  for (std::size_t b = 0; b < indices.size(); ++b) {
    std::memcpy(to + b * row_bytes, from + static_cast<std::size_t>(indices[b]) * row_bytes, row_bytes);
  }
  return out;
}

}  // namespace

TensorDataset::TensorDataset(const Tensor& inputs, const Tensor& targets) {
  MT_CHECK(inputs.defined() && targets.defined(), kWhere, "inputs or targets tensor is undefined");
  MT_CHECK(inputs.dim() >= 1 && targets.dim() >= 1 && inputs.size(0) == targets.size(0), kWhere,
           "inputs {} and targets {} must both be [N, ...] with the same N", shape_str(inputs.shape()),
           shape_str(targets.shape()));
  inputs_ = host_rows(inputs);
  targets_ = host_rows(targets);
}

Batch TensorDataset::collate(const std::vector<std::int64_t>& indices) const {
  const char* where = "TensorDataset::collate";
  MT_CHECK(!indices.empty(), where, "no sample indices");
  for (std::size_t k = 0; k < indices.size(); ++k) {
    MT_CHECK(indices[k] >= 0 && indices[k] < size(), where, "sample index {} at position {} is outside [0, {})",
             indices[k], k, size());
  }
  Batch batch;
  batch.inputs = gather_rows(inputs_, indices);    // (B, ...)
  batch.targets = gather_rows(targets_, indices);  // (B, ...)
  batch.samples = static_cast<std::int64_t>(indices.size());
  batch.targets_count = batch.targets.numel();
  return batch;
}

std::string TensorDataset::describe() const {
  return fmt::format("TensorDataset: {} samples, inputs {} {}, targets {} {}", size(), shape_str(inputs_.shape()),
                     dtype_name(inputs_.dtype()), shape_str(targets_.shape()), dtype_name(targets_.dtype()));
}

}  // namespace memtrain::data

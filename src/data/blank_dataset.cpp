// BlankDataset (memtrain/data/loader.h): batches of the right shapes, filled with zeros.
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/data/loader.h"

#include <fmt/format.h>

namespace memtrain::data {

namespace {
Shape batched(std::int64_t batch, const Shape& sample) {
  Shape s{batch};
  s.insert(s.end(), sample.begin(), sample.end());
  return s;
}
}  // namespace

BlankDataset::BlankDataset(std::int64_t size, Shape input_shape, DType input_dtype, Shape target_shape)
    : size_(size),
      input_shape_(std::move(input_shape)),
      input_dtype_(input_dtype),
      target_shape_(std::move(target_shape)) {
  MT_CHECK(size_ > 0, "BlankDataset", "size must be positive, got {}", size_);
  for (const Shape* s : {&input_shape_, &target_shape_})
    for (const std::int64_t d : *s)
      MT_CHECK(d > 0, "BlankDataset", "sample shape {} has a dimension that is not positive", shape_str(*s));
}

Batch BlankDataset::collate(const std::vector<std::int64_t>& indices) const {
  MT_CHECK(!indices.empty(), "BlankDataset::collate", "no sample indices");
  for (const std::int64_t i : indices)
    MT_CHECK(i >= 0 && i < size_, "BlankDataset::collate", "sample index {} is outside [0, {})", i, size_);
  const auto b = static_cast<std::int64_t>(indices.size());
  Batch batch;
  CategoryGuard guard(MemoryCategory::data);
  batch.inputs = zeros(batched(b, input_shape_), input_dtype_);
  batch.targets = zeros(batched(b, target_shape_), DType::i64);
  batch.samples = b;
  batch.targets_count = batch.targets.numel();
  return batch;
}

std::string BlankDataset::describe() const {
  return fmt::format("BlankDataset: {} samples of {} {} with targets {} (zeros)", size_, shape_str(input_shape_),
                     dtype_name(input_dtype_), shape_str(target_shape_));
}

}  // namespace memtrain::data

// Named tensors to load from, read one at a time: a map already in memory, or a file read on demand
// (io::SafetensorsFile). A loader checks every name, shape and dtype first (info(), which reads no data), then
// reads each tensor straight into the storage that keeps it (read_into()), so a loaded state is never held
// twice: once as the file's tensors and once as the live ones.
#pragma once

#include "memtrain/core/tensor.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace memtrain {

struct TensorInfo {
  Shape shape;
  DType dtype = DType::f32;
};

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual std::vector<std::string> names() const = 0;  // in name order
  // The shape and dtype of `name`; nullopt when there is no such tensor.
  virtual std::optional<TensorInfo> info(const std::string& name) const = 0;
  // Fills dst, which has the tensor's shape (any dtype, device and layout: the values are converted), with the
  // values of `name`. Throws memtrain::Error naming the tensor when it is absent or its shape differs.
  virtual void read_into(const std::string& name, Tensor& dst) const = 0;
  // Fills dst (any shape, dtype, device and layout) with elements [first, first + dst.numel()) of `name`
  // flattened, in dst's element order: a piece of a tensor, as a ZeRO shard of a saved state is. Throws naming
  // the tensor when the range runs past its end.
  virtual void read_range_into(const std::string& name, std::int64_t first, Tensor& dst) const = 0;
  // The values of `name` as a tensor of its own dtype: a new CPU tensor from a file, the held tensor itself
  // from a map (so the caller does not write to it). For small entries (a step count, a basis); a large one
  // goes through read_into.
  virtual Tensor read(const std::string& name) const = 0;
};

// Every tensor of `source` read into memory (CPU tensors from a file), under the current CategoryGuard: for a
// caller that must rearrange them (resharding) or that reads a few small ones.
std::map<std::string, Tensor> read_all(const TensorSource& source);

// A source over a name -> tensor map, which must outlive it.
class MapTensorSource final : public TensorSource {
 public:
  explicit MapTensorSource(const std::map<std::string, Tensor>& tensors) : tensors_(tensors) {}
  std::vector<std::string> names() const override;
  std::optional<TensorInfo> info(const std::string& name) const override;
  void read_into(const std::string& name, Tensor& dst) const override;
  void read_range_into(const std::string& name, std::int64_t first, Tensor& dst) const override;
  Tensor read(const std::string& name) const override;

 private:
  const Tensor& find(const std::string& name) const;
  const std::map<std::string, Tensor>& tensors_;
};

// The tensors of `base` whose names start with `prefix`, named without it ("model.wte" is "wte" under
// "model."). base must outlive it.
class PrefixedTensorSource final : public TensorSource {
 public:
  PrefixedTensorSource(const TensorSource& base, std::string prefix) : base_(base), prefix_(std::move(prefix)) {}
  std::vector<std::string> names() const override;
  std::optional<TensorInfo> info(const std::string& name) const override { return base_.info(prefix_ + name); }
  void read_into(const std::string& name, Tensor& dst) const override { base_.read_into(prefix_ + name, dst); }
  void read_range_into(const std::string& name, std::int64_t first, Tensor& dst) const override {
    base_.read_range_into(prefix_ + name, first, dst);
  }
  Tensor read(const std::string& name) const override { return base_.read(prefix_ + name); }

 private:
  const TensorSource& base_;
  std::string prefix_;
};

}  // namespace memtrain

// ZeRO-1 checkpoints: each rank's optimizer state in a file of its own beside the checkpoint, and the state
// of any other split of the parameters cut back out of those files.
//
// A checkpoint of a sharded run is the usual file (model, amp state, metadata; written by rank 0 last, so it
// exists only once every shard file is complete) plus "<checkpoint>.rank<r>of<n>", one per rank: the state of
// that rank's shards, keyed "<global parameter index>.<state name>", and its shard map as metadata. Optimizer
// state is elementwise (moments, 8-bit codes) or per 256-element block (8-bit absmax; shard boundaries are
// block boundaries), plus what every rank keeps whole (the step counter; a GaLore-projected weight's basis,
// random stream and refresh count; Adafactor's row and column statistics), so the state of elements [b, e) of a parameter is cut from whatever pieces
// cover them: a run saved at N ranks resumes at M ranks, alone, or unsharded. A GaLore-projected weight's
// elements are those of its projected gradient R, whose shape its state has.
#pragma once

#include "memtrain/core/tensor_source.h"
#include "memtrain/optim/optimizer.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace memtrain::train::detail {

// Global parameter index -> [begin, end) of its flattened state elements (an empty range: a rank that holds
// only the parameter's replicated state).
using ShardMap = std::map<std::size_t, std::pair<std::int64_t, std::int64_t>>;

// One rank's state as it saves it.
struct StateShard {
  optim::StateDict state;  // "<global index>.<name>"
  ShardMap shards;
};

// A saved state as it is read back: its tensors, read on demand (a shard file, or the optimizer entries of an
// unsharded checkpoint), and the elements it holds of each parameter.
struct SavedShard {
  std::shared_ptr<const TensorSource> state;
  ShardMap shards;
};

std::string state_shard_path(const std::string& checkpoint, std::int64_t rank, std::int64_t ranks);
// Writes one rank's shard file atomically.
void save_state_shard(const std::string& checkpoint, std::int64_t rank, std::int64_t ranks, const StateShard& shard);
// The `ranks` shard files of `checkpoint`, their headers read and checked (no state yet); throws naming a
// missing or foreign file.
std::vector<SavedShard> open_state_shards(const std::string& checkpoint, std::int64_t ranks);
// Whether state `name` ("step", "galore.left", "exp_avg") is kept whole by every rank rather than cut.
bool replicated_state(std::string_view name);

// The state of the elements a ShardMap names, keyed "<global index>.<name>", cut from saved pieces without
// reading them: each entry is a list of ranges of the pieces' tensors, and read_into reads those ranges from
// the files straight into the destination. So a rank resuming at any world size reads only its own share.
class ReshardedState final : public TensorSource {
 public:
  std::vector<std::string> names() const override;
  std::optional<TensorInfo> info(const std::string& name) const override;
  void read_into(const std::string& name, Tensor& dst) const override;
  void read_range_into(const std::string& name, std::int64_t first, Tensor& dst) const override;
  Tensor read(const std::string& name) const override;

  // Gives entry `name` another shape of as many elements (a whole parameter's moments take its state's shape).
  void reshape(const std::string& name, const Shape& shape);
  // Renames every entry by `new_name` (global parameter indices to an optimizer's slots).
  void rename(const std::function<std::string(const std::string&)>& new_name);

 private:
  friend ReshardedState reshard_state(std::vector<SavedShard> pieces, const ShardMap& want, const std::string& where);
  struct Range {
    const TensorSource* source;
    std::int64_t first, count;  // elements of the source's tensor of the entry's name
  };
  struct Entry {
    TensorInfo info;
    std::string key;  // the name in the pieces (before rename)
    std::vector<Range> ranges;  // in element order
  };
  const Entry& entry(const std::string& name) const;
  std::map<std::string, Entry> entries_;
  std::vector<SavedShard> pieces_;  // what the ranges read from
};

// The state `want` names, cut from `pieces`, with the replicated state of each parameter. Throws naming the
// parameter when the pieces do not cover its elements exactly, cut a block, or disagree on a dtype.
ReshardedState reshard_state(std::vector<SavedShard> pieces, const ShardMap& want, const std::string& where);
// Removes every shard file of `checkpoint`, whatever its world size.
void remove_state_shards(const std::string& checkpoint);

}  // namespace memtrain::train::detail

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

#include "memtrain/optim/optimizer.h"

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace memtrain::train::detail {

// Global parameter index -> [begin, end) of its flattened state elements (an empty range: a rank that holds
// only the parameter's replicated state).
using ShardMap = std::map<std::size_t, std::pair<std::int64_t, std::int64_t>>;

struct StateShard {
  optim::StateDict state;  // "<global index>.<name>"
  ShardMap shards;
};

std::string state_shard_path(const std::string& checkpoint, std::int64_t rank, std::int64_t ranks);
// Writes one rank's shard file atomically.
void save_state_shard(const std::string& checkpoint, std::int64_t rank, std::int64_t ranks, const StateShard& shard);
// The `ranks` shard files of `checkpoint`; throws naming a missing or foreign file.
std::vector<StateShard> load_state_shards(const std::string& checkpoint, std::int64_t ranks);
// Whether state `name` ("step", "galore.left", "exp_avg") is kept whole by every rank rather than cut.
bool replicated_state(std::string_view name);
// The state of the elements `want` names, keyed by global index, cut from `pieces`, with the replicated state
// of each. Throws naming the parameter when the pieces do not cover its elements exactly, or cut a block.
optim::StateDict reshard_state(const std::vector<StateShard>& pieces, const ShardMap& want, const std::string& where);
// Removes every shard file of `checkpoint`, whatever its world size.
void remove_state_shards(const std::string& checkpoint);

}  // namespace memtrain::train::detail

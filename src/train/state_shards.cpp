#include "train/state_shards.h"
#include "io/json_limits.h"

#include "memtrain/core/error.h"
#include "memtrain/io/safetensors.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <string_view>

namespace memtrain::train::detail {

namespace fs = std::filesystem;

namespace {

constexpr const char* kShardFormat = "memtrain-optimizer-shard";
constexpr std::int64_t kBlock = 256;  // the 8-bit block: shard boundaries are multiples of it

// "12.exp_avg.codes" -> (12, "exp_avg.codes").
std::pair<std::size_t, std::string> split_key(const std::string& key, const std::string& where) {
  const std::size_t dot = key.find('.');
  std::size_t index = 0;
  const bool ok = dot != std::string::npos && dot > 0 &&
                  std::all_of(key.begin(), key.begin() + static_cast<std::ptrdiff_t>(dot), ::isdigit);
  MT_CHECK(ok, where, "optimizer state key '{}' is not '<parameter index>.<name>'", key);
  index = std::stoull(key.substr(0, dot));
  return {index, key.substr(dot + 1)};
}

bool per_block(std::string_view name) { return name.ends_with(".absmax"); }

}  // namespace

bool replicated_state(std::string_view name) {
  return name == "step" || name.starts_with("galore.") || name == "exp_avg_sq_row" || name == "exp_avg_sq_col";
}

std::string state_shard_path(const std::string& checkpoint, std::int64_t rank, std::int64_t ranks) {
  return fmt::format("{}.rank{}of{}", checkpoint, rank, ranks);
}

void save_state_shard(const std::string& checkpoint, std::int64_t rank, std::int64_t ranks, const StateShard& shard) {
  nlohmann::json map = nlohmann::json::object();
  for (const auto& [index, range] : shard.shards) map[std::to_string(index)] = {range.first, range.second};
  std::vector<std::pair<std::string, Tensor>> tensors(shard.state.begin(), shard.state.end());
  io::save_safetensors(state_shard_path(checkpoint, rank, ranks), tensors,
                       {{"format", kShardFormat}, {"rank", std::to_string(rank)}, {"ranks", std::to_string(ranks)},
                        {"shards", map.dump()}});
}

std::vector<SavedShard> open_state_shards(const std::string& checkpoint, std::int64_t ranks) {
  std::vector<SavedShard> out;
  for (std::int64_t r = 0; r < ranks; ++r) {
    const std::string path = state_shard_path(checkpoint, r, ranks);
    MT_CHECK(fs::exists(path), "load_checkpoint", "'{}' was written by {} ranks, but its shard file '{}' is missing",
             checkpoint, ranks, path);
    auto file = std::make_shared<const io::SafetensorsFile>(path);
    const auto& meta = file->metadata();
    const auto format = meta.find("format");
    MT_CHECK(format != meta.end() && format->second == kShardFormat, "load_checkpoint",
             "'{}' is not an optimizer shard file (no metadata format = \"{}\")", path, kShardFormat);
    SavedShard shard;
    try {
      // alive while items() walks it
      const nlohmann::json map =
          nlohmann::json::parse(meta.at("shards"), ::memtrain::detail::json_depth_limit("load_checkpoint", path));
      for (const auto& [index, range] : map.items())
        shard.shards[std::stoull(index)] = {range.at(0).get<std::int64_t>(), range.at(1).get<std::int64_t>()};
    } catch (const std::exception& e) {
      MT_CHECK(false, "load_checkpoint", "'{}': its shard map is unreadable ({})", path, e.what());
    }
    shard.state = std::move(file);
    out.push_back(std::move(shard));
  }
  return out;
}

ReshardedState reshard_state(std::vector<SavedShard> pieces, const ShardMap& want, const std::string& where) {
  struct Piece {
    const SavedShard* shard;
    std::int64_t begin, end;
  };
  ReshardedState out;
  for (const auto& [index, range] : want) {
    const auto [begin, end] = range;
    // Every piece that holds some of the parameter (perhaps only its replicated state), and those among them
    // that hold elements of [begin, end), in element order.
    std::vector<Piece> holding, covering;
    for (const SavedShard& s : pieces) {
      const auto it = s.shards.find(index);
      if (it == s.shards.end()) continue;
      holding.push_back({&s, it->second.first, it->second.second});
      if (it->second.first < end && it->second.second > begin) covering.push_back(holding.back());
    }
    MT_CHECK(!holding.empty(), where, "parameter {}: no saved shard holds its state", index);
    std::sort(covering.begin(), covering.end(), [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
    // The pieces must tile [begin, end) with no gap, and cut it only at block boundaries.
    std::int64_t at = begin;
    for (const Piece& p : covering) {
      MT_CHECK(p.begin <= at, where, "parameter {}: no saved shard holds its elements [{}, {})", index, at, p.begin);
      MT_CHECK((at - p.begin) % kBlock == 0, where, "parameter {}: a saved shard starting at element {} cannot be "
               "cut at element {} (not a multiple of the {}-element 8-bit block)", index, p.begin, at, kBlock);
      at = std::max(at, std::min(end, p.end));
    }
    MT_CHECK(at == end, where, "parameter {}: the saved shards hold its elements only up to {} of [{}, {})", index,
             at, begin, end);
    // The state names of the parameter: a piece with an empty range holds only the replicated ones.
    const std::string prefix = std::to_string(index) + ".";
    std::map<std::string, std::pair<const TensorSource*, TensorInfo>> names;  // key -> the first piece holding it
    for (const Piece& p : holding)
      for (const std::string& key : p.shard->state->names())
        if (key.starts_with(prefix) && names.count(key) == 0) names.emplace(key, std::pair(p.shard->state.get(),
                                                                                            *p.shard->state->info(key)));
    for (const auto& [key, first] : names) {
      const std::string name = split_key(key, where).second;
      ReshardedState::Entry entry;
      entry.key = key;
      if (replicated_state(name)) {
        entry.info = first.second;
        entry.ranges.push_back({first.first, 0, shape_numel(first.second.shape)});
        out.entries_.emplace(key, std::move(entry));
        continue;
      }
      if (begin == end) continue;
      entry.info.dtype = first.second.dtype;
      std::int64_t count = 0;
      at = begin;
      for (const Piece& p : covering) {
        if (p.end <= at) continue;
        const auto t = p.shard->state->info(key);
        MT_CHECK(t.has_value(), where, "parameter {}: state '{}' is missing from one shard", index, name);
        MT_CHECK(t->dtype == entry.info.dtype, where, "parameter {}: state '{}' is {} in one shard and {} in another",
                 index, name, dtype_name(entry.info.dtype), dtype_name(t->dtype));
        const std::int64_t lo = at - p.begin, hi = std::min(end, p.end) - p.begin;
        const ReshardedState::Range r = per_block(name)
                                            ? ReshardedState::Range{p.shard->state.get(), lo / kBlock,
                                                                    (hi + kBlock - 1) / kBlock - lo / kBlock}
                                            : ReshardedState::Range{p.shard->state.get(), lo, hi - lo};
        MT_CHECK(r.first + r.count <= shape_numel(t->shape), where, "parameter {}: state '{}' of one shard holds {} "
                 "elements, too few for its elements [{}, {})", index, name, shape_numel(t->shape), p.begin, p.end);
        entry.ranges.push_back(r);
        count += r.count;
        at = std::min(end, p.end);
      }
      entry.info.shape = {count};
      out.entries_.emplace(key, std::move(entry));
    }
  }
  out.pieces_ = std::move(pieces);
  return out;
}

const ReshardedState::Entry& ReshardedState::entry(const std::string& name) const {
  const auto it = entries_.find(name);
  MT_CHECK(it != entries_.end(), "load_checkpoint", "no optimizer state '{}' in the saved shards", name);
  return it->second;
}

std::vector<std::string> ReshardedState::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

std::optional<TensorInfo> ReshardedState::info(const std::string& name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) return std::nullopt;
  return it->second.info;
}

void ReshardedState::read_into(const std::string& name, Tensor& dst) const {
  const Entry& e = entry(name);
  MT_CHECK(dst.shape() == e.info.shape, "load_checkpoint", "optimizer state '{}' has shape {}, its destination {}",
           name, shape_str(e.info.shape), shape_str(dst.shape()));
  read_range_into(name, 0, dst);
}

void ReshardedState::read_range_into(const std::string& name, std::int64_t first, Tensor& dst) const {
  const Entry& e = entry(name);
  const std::int64_t n = dst.numel();
  MT_CHECK(first >= 0 && first + n <= shape_numel(e.info.shape), "load_checkpoint",
           "elements [{}, {}) of optimizer state '{}' run past its {} elements", first, first + n, name,
           shape_numel(e.info.shape));
  if (e.ranges.size() == 1) {
    e.ranges.front().source->read_range_into(e.key, e.ranges.front().first + first, dst);
    return;
  }
  // Ranges of several pieces: each goes to its own run of dst's elements.
  MT_CHECK(dst.is_contiguous(), "load_checkpoint", "optimizer state '{}' is cut from {} saved shards and reads "
           "into a contiguous tensor only", name, e.ranges.size());
  std::int64_t start = 0;  // of the current range, in the entry's elements
  for (const Range& r : e.ranges) {
    const std::int64_t lo = std::max(first, start), hi = std::min(first + n, start + r.count);
    if (lo < hi) {
      Tensor run = Tensor::make_view(dst.storage(), {hi - lo}, {1}, dst.offset() + (lo - first), dst.dtype());
      r.source->read_range_into(e.key, r.first + (lo - start), run);
    }
    start += r.count;
  }
}

Tensor ReshardedState::read(const std::string& name) const {
  const Entry& e = entry(name);
  Tensor t = Tensor::empty(e.info.shape, e.info.dtype);
  read_range_into(name, 0, t);
  return t;
}

void ReshardedState::reshape(const std::string& name, const Shape& shape) {
  auto it = entries_.find(name);
  MT_CHECK(it != entries_.end() && shape_numel(shape) == shape_numel(it->second.info.shape), "load_checkpoint",
           "optimizer state '{}' cannot take shape {}", name, shape_str(shape));
  it->second.info.shape = shape;
}

void ReshardedState::rename(const std::function<std::string(const std::string&)>& new_name) {
  std::map<std::string, Entry> renamed;
  for (auto& [name, e] : entries_) renamed.emplace(new_name(name), std::move(e));
  entries_ = std::move(renamed);
}

void remove_state_shards(const std::string& checkpoint) {
  const fs::path path(checkpoint);
  const std::string prefix = path.filename().string() + ".rank";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(path.parent_path().empty() ? fs::path(".") : path.parent_path(), ec))
    if (entry.path().filename().string().starts_with(prefix)) fs::remove(entry.path(), ec);
}

}  // namespace memtrain::train::detail

#include "train/state_shards.h"
#include "io/json_limits.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/io/safetensors.h"
#include "memtrain/ops/shape.h"

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

std::vector<StateShard> load_state_shards(const std::string& checkpoint, std::int64_t ranks) {
  std::vector<StateShard> out;
  for (std::int64_t r = 0; r < ranks; ++r) {
    const std::string path = state_shard_path(checkpoint, r, ranks);
    MT_CHECK(fs::exists(path), "load_checkpoint", "'{}' was written by {} ranks, but its shard file '{}' is missing",
             checkpoint, ranks, path);
    const auto meta = io::load_safetensors_metadata(path);
    const auto format = meta.find("format");
    MT_CHECK(format != meta.end() && format->second == kShardFormat, "load_checkpoint",
             "'{}' is not an optimizer shard file (no metadata format = \"{}\")", path, kShardFormat);
    StateShard shard;
    try {
      // alive while items() walks it
      const nlohmann::json map =
          nlohmann::json::parse(meta.at("shards"), ::memtrain::detail::json_depth_limit("load_checkpoint", path));
      for (const auto& [index, range] : map.items())
        shard.shards[std::stoull(index)] = {range.at(0).get<std::int64_t>(), range.at(1).get<std::int64_t>()};
    } catch (const std::exception& e) {
      MT_CHECK(false, "load_checkpoint", "'{}': its shard map is unreadable ({})", path, e.what());
    }
    {
      CategoryGuard category(MemoryCategory::workspace);
      for (auto& [key, t] : io::load_safetensors(path)) shard.state.emplace(key, t);
    }
    out.push_back(std::move(shard));
  }
  return out;
}

optim::StateDict reshard_state(const std::vector<StateShard>& pieces, const ShardMap& want, const std::string& where) {
  struct Piece {
    const StateShard* shard;
    std::int64_t begin, end;
  };
  optim::StateDict out;
  for (const auto& [index, range] : want) {
    const auto [begin, end] = range;
    // Every piece that holds some of the parameter (perhaps only its replicated state), and those among them
    // that hold elements of [begin, end), in element order.
    std::vector<Piece> holding, covering;
    for (const StateShard& s : pieces) {
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
    std::map<std::string, const Tensor*> names;  // key -> the first piece's tensor of it
    for (const Piece& p : holding)
      for (const auto& [key, t] : p.shard->state)
        if (key.starts_with(prefix)) names.emplace(key, &t);
    for (const auto& [key, first] : names) {
      const std::string name = split_key(key, where).second;
      if (replicated_state(name)) {
        out[key] = *first;
        continue;
      }
      if (begin == end) continue;
      std::vector<Tensor> parts;
      at = begin;
      for (const Piece& p : covering) {
        if (p.end <= at) continue;
        const auto t = p.shard->state.find(key);
        MT_CHECK(t != p.shard->state.end(), where, "parameter {}: state '{}' is missing from one shard", index, name);
        const std::int64_t lo = at - p.begin, hi = std::min(end, p.end) - p.begin;
        const Tensor flat = t->second.reshape({t->second.numel()});
        parts.push_back(per_block(name) ? flat.narrow(0, lo / kBlock, (hi + kBlock - 1) / kBlock - lo / kBlock)
                                        : flat.narrow(0, lo, hi - lo));
        at = std::min(end, p.end);
      }
      CategoryGuard category(MemoryCategory::workspace);
      out[key] = parts.size() == 1 ? parts.front().contiguous() : ops::concat(parts, 0);
    }
  }
  return out;
}

void remove_state_shards(const std::string& checkpoint) {
  const fs::path path(checkpoint);
  const std::string prefix = path.filename().string() + ".rank";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(path.parent_path().empty() ? fs::path(".") : path.parent_path(), ec))
    if (entry.path().filename().string().starts_with(prefix)) fs::remove(entry.path(), ec);
}

}  // namespace memtrain::train::detail

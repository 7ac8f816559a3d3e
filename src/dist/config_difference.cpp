// first_difference: the field two configs' JSON first disagree on, for the start-up checks of DataParallel, the
// pipeline and tensor parallelism.
#include "dist/same_config.h"

#include "memtrain/core/error.h"
#include "memtrain/dist/data_parallel.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <string>

namespace memtrain::dist {

namespace {

std::string diff_at(const std::string& path, const nlohmann::json& here, const nlohmann::json& other) {
  if (here.is_object() && other.is_object()) {
    // Keys in order over both, so every rank names the same first field.
    std::map<std::string, int> keys;
    for (const auto& [k, v] : here.items()) keys[k];
    for (const auto& [k, v] : other.items()) keys[k];
    for (const auto& [k, unused] : keys) {
      const std::string sub = path.empty() ? k : path + "." + k;
      if (!here.contains(k)) return fmt::format("{}: absent here, {} in the other", sub, other.at(k).dump());
      if (!other.contains(k)) return fmt::format("{}: {} here, absent in the other", sub, here.at(k).dump());
      std::string d = diff_at(sub, here.at(k), other.at(k));
      if (!d.empty()) return d;
    }
    return {};
  }
  if (here == other) return {};
  return fmt::format("{}: {} here, {} in the other", path.empty() ? "(the config)" : path, here.dump(), other.dump());
}

}  // namespace

std::string first_difference(const nlohmann::json& here, const nlohmann::json& other) {
  return diff_at("", here, other);
}

namespace detail {

void require_same_config(const nlohmann::json& config, Communicator& comm, const char* where) {
  const std::string mine = config.dump();
  const std::string root = comm.broadcast_string(mine, 0);
  const std::vector<std::int64_t> differs = comm.all_gather_i64({mine == root ? 0 : 1});
  std::vector<std::size_t> ranks;
  for (std::size_t r = 0; r < differs.size(); ++r)
    if (differs[r] != 0) ranks.push_back(r);
  // Each differing rank names its own first difference; the others name the ranks.
  MT_CHECK(ranks.empty(), where, "the config of rank(s) {} differs from rank 0's{}", fmt::join(ranks, ", "),
           mine == root ? std::string() : " (" + first_difference(config, nlohmann::json::parse(root)) + ")");
}

}  // namespace detail

}  // namespace memtrain::dist

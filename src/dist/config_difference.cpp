// first_difference: the field two configs' JSON first disagree on, for DataParallel's start-up check.
#include "memtrain/dist/data_parallel.h"

#include <fmt/format.h>

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

}  // namespace memtrain::dist

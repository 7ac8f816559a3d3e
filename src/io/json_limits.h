// A nesting limit for JSON read from files. nlohmann parses without recursion, but dump() (which error messages
// use to quote a value) and any recursive walk of the value recurse once per level, so a file of a million '['
// would overflow the stack long after it parsed. No file memtrain reads nests deeper than a few levels.
#pragma once

#include "memtrain/core/error.h"

#include <nlohmann/json.hpp>

#include <string>
#include <utility>

namespace memtrain::detail {

inline constexpr int kMaxJsonDepth = 64;

// Pass to nlohmann::json::parse(text, json_depth_limit(...)): throws memtrain::Error naming `where` and the
// file when an object or array opens deeper than kMaxJsonDepth levels.
inline nlohmann::json::parser_callback_t json_depth_limit(std::string where, std::string path) {
  return [where = std::move(where), path = std::move(path)](int depth, nlohmann::json::parse_event_t event,
                                                            nlohmann::json& /*parsed*/) {
    const bool opens = event == nlohmann::json::parse_event_t::object_start ||
                       event == nlohmann::json::parse_event_t::array_start;
    // depth counts the levels around the value that opens: 0 for the top one.
    MT_CHECK(!opens || depth < kMaxJsonDepth, where, "'{}': JSON nested deeper than {} levels", path, kMaxJsonDepth);
    return true;
  };
}

}  // namespace memtrain::detail

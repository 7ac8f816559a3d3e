// A strict reader of one JSON object: each get() fills a field when its key is present, and finish()
// refuses any key no get()/find() asked for, naming it with its path ("schedule.warmup_step"), so a typo in
// a config file is an error instead of a silent default. Values of the wrong type are errors too.
#pragma once

#include "memtrain/core/error.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace memtrain::detail {

using nlohmann::json;

inline std::string type_of(const json& v) { return v.type_name(); }

// Reads the keys of one JSON object into fields, remembering which keys it knows so finish() can name
// the ones it does not. `path` prefixes keys in messages ("model.").
class JsonObjectReader {
 public:
  JsonObjectReader(const json& j, std::string path, std::string where)
      : j_(j), path_(std::move(path)), where_(std::move(where)) {
    MT_CHECK(j.is_object(), where_, "'{}' must be a JSON object, got {}", path_.empty() ? "config" : path_,
             type_of(j));
  }

  const json* find(const std::string& key) {
    known_.insert(key);
    auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }

  void get(const std::string& key, std::int64_t& out) {
    if (const json* v = find(key)) {
      MT_CHECK(v->is_number_integer(), where_, "'{}' must be an integer, got {} {}", name(key), type_of(*v), v->dump());
      if (v->is_number_unsigned())
        MT_CHECK(v->get<std::uint64_t>() <= static_cast<std::uint64_t>(INT64_MAX), where_, "'{}' is too large: {}",
                 name(key), v->dump());
      out = v->get<std::int64_t>();
    }
  }
  void get(const std::string& key, std::uint64_t& out) {
    if (const json* v = find(key)) {
      MT_CHECK(v->is_number_unsigned() || (v->is_number_integer() && v->get<std::int64_t>() >= 0), where_,
               "'{}' must be a non-negative integer, got {}", name(key), v->dump());
      out = v->get<std::uint64_t>();
    }
  }
  void get(const std::string& key, double& out) {
    if (const json* v = find(key)) {
      MT_CHECK(v->is_number(), where_, "'{}' must be a number, got {} {}", name(key), type_of(*v), v->dump());
      out = v->get<double>();
    }
  }
  void get(const std::string& key, bool& out) {
    if (const json* v = find(key)) {
      MT_CHECK(v->is_boolean(), where_, "'{}' must be true or false, got {}", name(key), v->dump());
      out = v->get<bool>();
    }
  }
  void get(const std::string& key, std::string& out) {
    if (const json* v = find(key)) {
      MT_CHECK(v->is_string(), where_, "'{}' must be a string, got {} {}", name(key), type_of(*v), v->dump());
      out = v->get<std::string>();
    }
  }
  // A list of strings; a single string is a list of one.
  void get(const std::string& key, std::vector<std::string>& out) {
    if (const json* v = find(key)) {
      if (v->is_string()) {
        out = {v->get<std::string>()};
        return;
      }
      MT_CHECK(v->is_array(), where_, "'{}' must be a list of strings, got {}", name(key), type_of(*v));
      out.clear();
      for (const json& e : *v) {
        MT_CHECK(e.is_string(), where_, "'{}' must be a list of strings, has {}", name(key), e.dump());
        out.push_back(e.get<std::string>());
      }
    }
  }
  void get(const std::string& key, std::optional<std::size_t>& out) {
    if (const json* v = find(key)) {
      if (v->is_null()) {
        out.reset();
        return;
      }
      MT_CHECK(v->is_number_unsigned() || (v->is_number_integer() && v->get<std::int64_t>() >= 0), where_,
               "'{}' must be null or a non-negative integer (bytes), got {}", name(key), v->dump());
      out = v->get<std::size_t>();
    }
  }

  // Throws on the first key no get()/find() asked for.
  void finish() const {
    for (const auto& [key, value] : j_.items()) {
      MT_CHECK(known_.count(key) != 0, where_, "unknown key '{}' (known: {})", name(key), fmt::join(known_, ", "));
    }
  }

 private:
  std::string name(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  const json& j_;
  std::string path_;
  std::string where_;
  std::set<std::string> known_;
};

}  // namespace memtrain::detail

// Reading back the SVGs memtrain writes: a well-formedness check (as far as they need) and attribute lookup.
#pragma once

#include <sstream>
#include <string>
#include <vector>

namespace memtrain::test_support {

// Well-formed XML, as far as this SVG needs: every tag closed in order, attributes quoted, entities known.
// Returns an empty string when it is, else what is wrong.
inline std::string xml_problem(const std::string& xml) {
  std::vector<std::string> open;
  std::size_t i = 0;
  while ((i = xml.find('<', i)) != std::string::npos) {
    const std::size_t end = xml.find('>', i);
    if (end == std::string::npos) return "unterminated tag at " + std::to_string(i);
    std::string tag = xml.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.empty()) return "empty tag";
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) return "</" + tag.substr(1) + "> closes nothing open";
      open.pop_back();
      continue;
    }
    const bool self_closing = tag.back() == '/';
    if (self_closing) tag.pop_back();
    std::istringstream words(tag);
    std::string name;
    words >> name;
    // Attributes: name="value" with no quote or '<' inside the value.
    std::size_t quotes = 0;
    for (const char c : tag) quotes += c == '"';
    if (quotes % 2 != 0) return "unbalanced quotes in <" + name + ">";
    if (!self_closing) open.push_back(name);
  }
  if (!open.empty()) return "<" + open.back() + "> is never closed";
  for (std::size_t a = xml.find('&'); a != std::string::npos; a = xml.find('&', a + 1)) {
    bool known = false;
    for (const char* e : {"&lt;", "&gt;", "&amp;", "&quot;"}) known = known || xml.compare(a, std::string(e).size(), e) == 0;
    if (!known) return "unknown entity at " + std::to_string(a);
  }
  return {};
}

inline std::string attribute(const std::string& element, const std::string& name) {
  const std::string key = name + "=\"";
  const std::size_t at = element.find(key);
  if (at == std::string::npos) return {};
  const std::size_t from = at + key.size();
  return element.substr(from, element.find('"', from) - from);
}

// The elements of `svg` that start with `<tag` and carry `marker`.
inline std::vector<std::string> elements(const std::string& svg, const std::string& tag, const std::string& marker) {
  std::vector<std::string> out;
  for (std::size_t i = svg.find("<" + tag); i != std::string::npos; i = svg.find("<" + tag, i + 1)) {
    const std::string e = svg.substr(i, svg.find('>', i) - i + 1);
    if (e.find(marker) != std::string::npos) out.push_back(e);
  }
  return out;
}

}  // namespace memtrain::test_support

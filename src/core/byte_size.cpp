// parse_byte_size (memtrain/core/byte_size.h).
#include "memtrain/core/byte_size.h"

#include "memtrain/core/error.h"

#include <charconv>
#include <cmath>
#include <utility>

namespace memtrain {

std::size_t parse_byte_size(std::string_view text, std::string_view where) {
  static constexpr std::pair<std::string_view, double> kUnits[] = {
      {"TiB", 1099511627776.0}, {"GiB", 1073741824.0}, {"MiB", 1048576.0}, {"KiB", 1024.0}, {"B", 1.0}};
  constexpr const char* kAccepted = "a number of bytes, or a number followed by B, KiB, MiB, GiB or TiB (e.g. 1.5GiB)";
  std::string_view number = text;
  double unit = 1.0;
  for (const auto& [suffix, bytes] : kUnits) {
    if (number.size() > suffix.size() && number.ends_with(suffix)) {
      number.remove_suffix(suffix.size());
      unit = bytes;
      break;
    }
  }
  double value = 0.0;
  const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  MT_CHECK(!number.empty() && ec == std::errc() && end == number.data() + number.size(), where,
           "'{}' is not a byte size: expected {}", text, kAccepted);
  const double bytes = std::floor(value * unit);
  MT_CHECK(std::isfinite(bytes) && bytes >= 1.0, where, "'{}' is not a positive byte size", text);
  MT_CHECK(bytes < 18446744073709551616.0, where, "'{}' is larger than any memory", text);
  return static_cast<std::size_t>(bytes);
}

}  // namespace memtrain

// Errors: every bad input becomes a memtrain::Error whose message names the op (or file) and what was
// wrong. MT_CHECK(cond, "op", fmt, args...) is the one way to raise it.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace memtrain {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Thrown when an allocation would exceed the device's byte budget; what() holds the memory report.
class OutOfBudget : public Error {
 public:
  using Error::Error;
};

namespace detail {
[[noreturn]] inline void throw_error(std::string_view where, const std::string& what) {
  throw Error(fmt::format("{}: {}", where, what));
}
}  // namespace detail

}  // namespace memtrain

// MT_CHECK(cond, where, fmt-string, args...): throws memtrain::Error("where: message") when cond is false.
#define MT_CHECK(cond, where, ...)                                              \
  do {                                                                          \
    if (!(cond)) ::memtrain::detail::throw_error((where), fmt::format(__VA_ARGS__)); \
  } while (0)

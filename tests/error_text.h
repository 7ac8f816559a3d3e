// The message of the memtrain::Error a call throws, or "(no error)": tests assert on what it says.
#pragma once

#include "memtrain/core/error.h"

#include <functional>
#include <string>

namespace memtrain::test_support {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace memtrain::test_support

// The CPU backend's name for the dtype conversions of core/convert.h (the rules are documented there).
#pragma once

#include "core/convert.h"

namespace memtrain::cpu {

using ::memtrain::detail::convert;
using ::memtrain::detail::read_as_double;
using ::memtrain::detail::write_from_double;

}  // namespace memtrain::cpu

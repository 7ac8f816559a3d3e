// Name globs, as users write them to choose parameters or modules by name: '*' matches any run of characters
// (dots included), every other character itself, over the whole name. Used by GaLore's targets and LoRA's.
#pragma once

#include <string_view>

namespace memtrain {

bool name_glob_matches(std::string_view pattern, std::string_view name);

}  // namespace memtrain

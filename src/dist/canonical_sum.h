// The canonical tree sum (communicator.h) evaluated on one process, over contributions already gathered.
#pragma once

#include "memtrain/core/dtype.h"

#include <cstdint>
#include <vector>

namespace memtrain::dist::detail {

// out[i] := tree over leaves[0..L) of leaves[l][i], for i < n: split at canonical_split(L), left operand first,
// each `+` in the accumulation type (f64 for f64, f32 for f32, bf16 and f16), and one rounding to `dtype` at the
// end. Every pointer holds n elements of `dtype`; out may be one of the leaves.
void canonical_sum(const std::vector<const void*>& leaves, DType dtype, std::int64_t n, void* out);

}  // namespace memtrain::dist::detail

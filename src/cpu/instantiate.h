// Explicit instantiation of a CPU kernel family: M(T) for each compute dtype (float, double), or M(T, I) for each
// compute dtype and index dtype (int32_t, int64_t) of the gather/scatter kernels. A kernel file defines M as its
// family's `template void ...` lines, expands one of these and #undefs M.
#pragma once

#include <cstdint>

#define MEMTRAIN_CPU_FOR_COMPUTE_TYPES(M) M(float) M(double)
#define MEMTRAIN_CPU_FOR_COMPUTE_AND_INDEX_TYPES(M) \
  M(float, std::int32_t) M(float, std::int64_t) M(double, std::int32_t) M(double, std::int64_t)

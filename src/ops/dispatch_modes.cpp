// The thread-local current modes of include/memtrain/ops/dispatch_modes.h.
#include "memtrain/ops/dispatch_modes.h"

namespace memtrain::ops {

namespace {
// Plain pointers, constant-initialised: reading one is a single thread-local load, no guard variable.
thread_local CastMode* t_cast_mode = nullptr;
thread_local RecomputeMode* t_recompute_mode = nullptr;
}  // namespace

CastModeGuard::CastModeGuard(CastMode* mode) : previous_(t_cast_mode) { t_cast_mode = mode; }
CastModeGuard::~CastModeGuard() { t_cast_mode = previous_; }

RecomputeModeGuard::RecomputeModeGuard(RecomputeMode* mode) : previous_(t_recompute_mode) { t_recompute_mode = mode; }
RecomputeModeGuard::~RecomputeModeGuard() { t_recompute_mode = previous_; }

namespace detail {
CastMode* current_cast_mode() { return t_cast_mode; }
RecomputeMode* current_recompute_mode() { return t_recompute_mode; }
}  // namespace detail

}  // namespace memtrain::ops

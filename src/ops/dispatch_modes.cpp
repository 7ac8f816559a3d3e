// The thread-local current modes of include/memtrain/ops/dispatch_modes.h.
#include "memtrain/ops/dispatch_modes.h"

namespace memtrain::ops {

namespace {
// Plain pointers, constant-initialised: reading one is a single thread-local load, no guard variable.
thread_local CastMode* t_cast_mode = nullptr;
thread_local RecomputeMode* t_recompute_mode = nullptr;

// The thread's slot for each kind of mode.
template <class Mode>
Mode*& current_slot();
template <>
CastMode*& current_slot<CastMode>() {
  return t_cast_mode;
}
template <>
RecomputeMode*& current_slot<RecomputeMode>() {
  return t_recompute_mode;
}
}  // namespace

template <class Mode>
ModeGuard<Mode>::ModeGuard(Mode* mode) : ScopedThreadValue<Mode*>(current_slot<Mode>(), mode) {}
template class ModeGuard<CastMode>;
template class ModeGuard<RecomputeMode>;

namespace detail {
CastMode* current_cast_mode() { return t_cast_mode; }
RecomputeMode* current_recompute_mode() { return t_recompute_mode; }
}  // namespace detail

}  // namespace memtrain::ops

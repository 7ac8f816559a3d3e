// The thread's work counter (core/work_counter.h).
#include "core/work_counter.h"

namespace memtrain::detail {

namespace {
thread_local WorkCounts* t_counter = nullptr;
}  // namespace

WorkCounts* current_work_counter() { return t_counter; }

WorkCounterGuard::WorkCounterGuard(WorkCounts* counter) : ScopedThreadValue(t_counter, counter) {}

}  // namespace memtrain::detail

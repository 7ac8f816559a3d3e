// The thread's work counter (core/work_counter.h).
#include "core/work_counter.h"

namespace memtrain::detail {

namespace {
thread_local WorkCounts* t_counter = nullptr;
}  // namespace

WorkCounts* current_work_counter() { return t_counter; }

WorkCounterGuard::WorkCounterGuard(WorkCounts* counter) : previous_(t_counter) { t_counter = counter; }
WorkCounterGuard::~WorkCounterGuard() { t_counter = previous_; }

}  // namespace memtrain::detail

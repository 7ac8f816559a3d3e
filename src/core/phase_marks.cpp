// The thread's phase listener (core/phase_marks.h).
#include "core/phase_marks.h"

namespace memtrain::detail {

namespace {
thread_local PhaseListener t_listener;
}  // namespace

void set_phase_listener(PhaseListener listener) { t_listener = std::move(listener); }
bool phase_listener_installed() { return static_cast<bool>(t_listener); }
void mark_phase(const std::string& phase) {
  if (t_listener) t_listener(phase);
}

}  // namespace memtrain::detail

// Phases inside a step that code below the training layer can name (a model's blocks, from
// ckpt::BlockCheckpointer), for whoever records them on this thread: train::Trainer::mark_phases_on installs a
// listener for the memory timeline. Nothing is formatted or called when no listener is installed.
#pragma once

#include <functional>
#include <string>

namespace memtrain::detail {

using PhaseListener = std::function<void(const std::string& phase)>;

void set_phase_listener(PhaseListener listener);  // this thread's; an empty function removes it
bool phase_listener_installed();
void mark_phase(const std::string& phase);  // tells this thread's listener, if any

}  // namespace memtrain::detail

// Grad mode: whether ops record backward nodes on this thread.
#pragma once

namespace memtrain::autograd {

bool grad_enabled();
void set_grad_enabled(bool enabled);

class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled) : previous_(grad_enabled()) { set_grad_enabled(enabled); }
  ~GradModeGuard() { set_grad_enabled(previous_); }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool previous_;
};

// No ops inside record a graph (optimizer steps, evaluation).
class NoGradGuard : public GradModeGuard {
 public:
  NoGradGuard() : GradModeGuard(false) {}
};
class EnableGradGuard : public GradModeGuard {
 public:
  EnableGradGuard() : GradModeGuard(true) {}
};

}  // namespace memtrain::autograd

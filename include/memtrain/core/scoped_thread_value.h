// ScopedThreadValue: the one implementation of the library's thread-local guards (CategoryGuard,
// nn::ParameterDeviceGuard, ops::ModeGuard, ...). Each keeps its thread_local slot private to its .cpp and
// derives from this with a constructor that names the slot: the guard installs a value in the slot for its
// lifetime, then puts back the one it replaced, so guards nest.
#pragma once

#include <utility>

namespace memtrain {

template <typename T>
class ScopedThreadValue {
 public:
  // `slot` is a thread_local of the constructing thread; the guard must end on that thread.
  ScopedThreadValue(T& slot, T value) : slot_(slot), previous_(std::exchange(slot, std::move(value))) {}
  ~ScopedThreadValue() { slot_ = std::move(previous_); }
  ScopedThreadValue(const ScopedThreadValue&) = delete;
  ScopedThreadValue& operator=(const ScopedThreadValue&) = delete;

 private:
  T& slot_;
  T previous_;
};

}  // namespace memtrain

// StateArena's accounting and the thread's arena. See include/memtrain/core/state_arena.h.
#include "memtrain/core/state_arena.h"

#include "memtrain/core/tensor.h"

#include <algorithm>
#include <utility>

namespace memtrain {

namespace {

thread_local std::shared_ptr<StateArena> t_arena;
const std::shared_ptr<StateArena> kNoArena;

}  // namespace

void* StateArena::allocate(std::size_t nbytes) {
  void* ptr = take(nbytes);
  std::lock_guard<std::mutex> lock(mutex_);
  live_ += nbytes;
  peak_ = std::max(peak_, live_);
  return ptr;
}

void StateArena::free(void* ptr, std::size_t nbytes) noexcept {
  give_back(ptr, nbytes);
  std::lock_guard<std::mutex> lock(mutex_);
  live_ -= nbytes;
}

std::size_t StateArena::live_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_;
}

std::size_t StateArena::peak_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_;
}

StateArenaGuard::StateArenaGuard(std::shared_ptr<StateArena> arena) : ScopedThreadValue(t_arena, std::move(arena)) {}

const std::shared_ptr<StateArena>& state_arena_for(Device device, MemoryCategory category) {
  if (t_arena && category == MemoryCategory::optimizer_state && t_arena->serves(device)) return t_arena;
  return kNoArena;
}

bool in_state_arena(const Tensor& t) { return t.defined() && t.storage() && t.storage()->arena() != nullptr; }

namespace {

// The bytes of t's elements in its arena's storage, from the storage's own address (data_ptr() refuses a meta
// tensor, whose arena hands out unmapped addresses); a strided view's elements are somewhere in all of it.
std::pair<char*, std::size_t> arena_range(const Tensor& t) {
  const Storage& storage = *t.storage();
  if (!t.is_contiguous()) return {static_cast<char*>(storage.data()), storage.nbytes()};
  const std::int64_t offset = t.offset() * static_cast<std::int64_t>(t.element_size());
  return {static_cast<char*>(storage.data()) + offset, t.nbytes()};
}

}  // namespace

void release_state_pages(const Tensor& t) {
  if (!in_state_arena(t)) return;
  const auto [ptr, nbytes] = arena_range(t);
  t.storage()->arena()->release(ptr, nbytes);
}

void prepare_state_pages(const Tensor& t) {
  if (!in_state_arena(t)) return;
  const auto [ptr, nbytes] = arena_range(t);
  t.storage()->arena()->prepare(ptr, nbytes);
}

}  // namespace memtrain

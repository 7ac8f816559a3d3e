// Random numbers: a stream is (seed, offset). Every random op draws its elements from Philox counters
// starting at the current offset and advances the offset by what it used, so restoring a saved state
// replays the same numbers (how checkpointing recomputes dropout) and CPU and CUDA kernels that use the
// same counters produce the same values.
#pragma once

#include <cstdint>

namespace memtrain {

struct RngState {
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;  // in Philox blocks (4 x 32 bits each)
  bool operator==(const RngState&) const = default;
};

// The process-wide default stream (thread-safe).
void manual_seed(std::uint64_t seed);  // sets seed, offset 0
RngState get_rng_state();
void set_rng_state(const RngState& state);
// Reserves `blocks` Philox blocks of the default stream and returns the state to draw them from.
RngState reserve_rng_blocks(std::uint64_t blocks);

// Restores the default stream's state when it goes out of scope.
class RngStateGuard {
 public:
  RngStateGuard() : saved_(get_rng_state()) {}
  ~RngStateGuard() { set_rng_state(saved_); }
  RngStateGuard(const RngStateGuard&) = delete;
  RngStateGuard& operator=(const RngStateGuard&) = delete;

 private:
  RngState saved_;
};

namespace cpu {
// Element i of the draw uses block (state.offset + i / 4), lane i % 4. Normal samples use Box-Muller on
// lanes (0,1) and (2,3) of a block: element i uses block offset + i / 4 as well, so uses 1 block per 4.
void fill_uniform(float* out, std::int64_t n, RngState state);  // (0, 1]
void fill_normal(float* out, std::int64_t n, RngState state);
}  // namespace cpu

}  // namespace memtrain

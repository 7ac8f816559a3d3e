#include "memtrain/core/rng.h"

#include "memtrain/core/philox.h"

#include <cmath>
#include <mutex>

namespace memtrain {

namespace {
std::mutex g_rng_mutex;
RngState g_rng_state{0x5eed, 0};
}  // namespace

void manual_seed(std::uint64_t seed) {
  std::lock_guard lock(g_rng_mutex);
  g_rng_state = RngState{seed, 0};
}

RngState get_rng_state() {
  std::lock_guard lock(g_rng_mutex);
  return g_rng_state;
}

void set_rng_state(const RngState& state) {
  std::lock_guard lock(g_rng_mutex);
  g_rng_state = state;
}

RngState reserve_rng_blocks(std::uint64_t blocks) {
  std::lock_guard lock(g_rng_mutex);
  RngState s = g_rng_state;
  g_rng_state.offset += blocks;
  return s;
}

namespace cpu {

void fill_uniform(float* out, std::int64_t n, RngState state) {
#pragma omp parallel for if (n > (1 << 16))
  for (std::int64_t b = 0; b < (n + 3) / 4; ++b) {
    const Philox4x32 r = philox4x32_10(state.offset + static_cast<std::uint64_t>(b), 0, state.seed);
    for (int lane = 0; lane < 4 && b * 4 + lane < n; ++lane) out[b * 4 + lane] = uint_to_unit_float(r.v[lane]);
  }
}

void fill_normal(float* out, std::int64_t n, RngState state) {
  constexpr float kTwoPi = 6.28318530717958647692f;
#pragma omp parallel for if (n > (1 << 16))
  for (std::int64_t b = 0; b < (n + 3) / 4; ++b) {
    const Philox4x32 r = philox4x32_10(state.offset + static_cast<std::uint64_t>(b), 0, state.seed);
    float z[4];
    for (int pair = 0; pair < 2; ++pair) {
      const float u1 = uint_to_unit_float(r.v[2 * pair]), u2 = uint_to_unit_float(r.v[2 * pair + 1]);
      const float radius = std::sqrt(-2.0f * std::log(u1));
      z[2 * pair] = radius * std::cos(kTwoPi * u2);
      z[2 * pair + 1] = radius * std::sin(kTwoPi * u2);
    }
    for (int lane = 0; lane < 4 && b * 4 + lane < n; ++lane) out[b * 4 + lane] = z[lane];
  }
}

}  // namespace cpu
}  // namespace memtrain

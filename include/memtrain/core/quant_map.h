// The two 256-entry maps of block-wise 8-bit state (memtrain/optim/quantized_state.h builds their values). The
// kind lives here, below the optimizer layer, so a backend's 8-bit kernels can name a map without reaching up.
#pragma once

#include <cstdint>

namespace memtrain {

// Signed (first moments): a sign, then k zero bits give the decade 10^-k (k = 0..6), a 1 indicator bit, and the
// remaining 6-k bits a linear fraction in [0.1, 1]; 127 values a sign, plus 0 and exactly 1.0 (so a block's absmax
// element is stored exactly). Unsigned (second moments): no sign, so each decade gets one more fraction bit: 254
// values, plus 0 and 1.0.
enum class QuantMap : std::uint8_t { signed_dynamic, unsigned_dynamic };

namespace detail {
// A block's stored scale from max(0, values) and min(0, values): the larger-magnitude one, with its sign (so the
// block's absmax element is exact whichever its sign). For kernels that track a block's max and min as they go.
inline float block_scale(float hi, float lo) { return -lo > hi ? lo : hi; }
}  // namespace detail

}  // namespace memtrain

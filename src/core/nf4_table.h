// The 16 NF4 levels (QLoRA, Dettmers et al. 2023; bitsandbytes' functional.py get_4bit_type("nf4")): quantiles
// of N(0, 1) normalised to [-1, 1], with an exact 0 at code 7, 7 negative and 8 positive levels. Here, below the
// ops and backend layers, so the CPU kernels, the ops front-end and the CUDA host code (which hands it to
// kernels/nf4.cu as a kernel parameter) read one table.
#pragma once

#include <array>

namespace memtrain::detail {

inline constexpr std::array<float, 16> kNf4Levels = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};
inline constexpr int kNf4ZeroCode = 7;

}  // namespace memtrain::detail

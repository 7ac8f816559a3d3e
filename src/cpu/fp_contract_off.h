// Included last by a kernel file whose results must round every product and sum on its own, in the order
// written (bit-compatibility with PyTorch's and the CUDA kernels' rounding): GCC contracts a*b + c into an FMA
// by default even in ISO mode, so this turns contraction off for the rest of the including file. An explicit
// fma (__builtin_fmaf) still fuses where the file asks for one.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif

// <Eigen/Core> for the files that use Eigen (the GEMM fallback, GaLore's SVD), without GCC 12's false positive.
//
// Under -march=native Eigen's AVX-512 packet code inlines intrinsics whose deliberately undefined registers
// (__Y, from _mm512_undefined_*) GCC's own avx512fintrin.h then reports as "may be used uninitialized". GCC
// attributes the warning to the intrinsic header's lines, so the pragma covers the include that first pulls
// them in; Eigen modules included after this header (QR, SVD) add no new intrinsic headers.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Core>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

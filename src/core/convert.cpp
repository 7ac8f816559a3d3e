// Bulk dtype conversion. Each source element is first read into a "wide" value that holds it exactly
// (double for f64, float for f32 and the narrow floats, int32/int64 for the integer types and bool), then
// written to the destination type with one rounding step. The 121 (src, dst) loops are instantiated from
// templates; each inner loop is branch-free so the compiler vectorizes it.
#include "core/convert.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "memtrain/core/error.h"
#include "memtrain/core/float_types.h"

namespace memtrain::detail {
namespace {

// A bool element: one byte, any nonzero value is true. Not `bool`, since loading a byte that is not 0/1
// through a bool lvalue is undefined.
struct BoolByte {
  std::uint8_t v;
};

template <DType T>
struct Storage;
template <> struct Storage<DType::f64> { using type = double; };
template <> struct Storage<DType::f32> { using type = float; };
template <> struct Storage<DType::f16> { using type = Half; };
template <> struct Storage<DType::bf16> { using type = BFloat16; };
template <> struct Storage<DType::f8_e4m3> { using type = Float8E4M3; };
template <> struct Storage<DType::f8_e5m2> { using type = Float8E5M2; };
template <> struct Storage<DType::i8> { using type = std::int8_t; };
template <> struct Storage<DType::u8> { using type = std::uint8_t; };
template <> struct Storage<DType::i32> { using type = std::int32_t; };
template <> struct Storage<DType::i64> { using type = std::int64_t; };
template <> struct Storage<DType::boolean> { using type = BoolByte; };

template <DType T>
using StorageT = typename Storage<T>::type;

// ---- reading: storage -> exact wide value -------------------------------------------------------
inline double widen(double v) { return v; }
inline float widen(float v) { return v; }
inline float widen(Half v) { return v.to_float(); }
inline float widen(BFloat16 v) { return v.to_float(); }
inline float widen(Float8E4M3 v) { return v.to_float(); }
inline float widen(Float8E5M2 v) { return v.to_float(); }
inline std::int32_t widen(std::int8_t v) { return v; }
inline std::int32_t widen(std::uint8_t v) { return v; }
inline std::int32_t widen(std::int32_t v) { return v; }
inline std::int64_t widen(std::int64_t v) { return v; }
inline std::int32_t widen(BoolByte v) { return v.v != 0; }

// |v| > 2^53 does not fit a double; rounding it to odd at 53 bits keeps the sticky information, so the
// later rounding to a narrow format (<= 51 bits) is still correctly rounded.
inline double int64_to_double_round_odd(std::int64_t v) {
  const std::uint64_t mag = v < 0 ? 0 - static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v);
  const int width = std::bit_width(mag);
  if (width <= 53) return static_cast<double>(v);
  const int shift = width - 53;
  std::uint64_t top = mag >> shift;
  if ((mag & ((std::uint64_t(1) << shift) - 1)) != 0) top |= 1;
  const double r = std::ldexp(static_cast<double>(top), shift);
  return v < 0 ? -r : r;
}

// Float -> integer: truncate, NaN -> 0, clamp to the type's range. The bounds are powers of two (or 0),
// exact in float and double; comparing before the cast keeps the cast in range (no UB).
template <typename I, typename F>
inline I float_to_int(F v) {
  constexpr F kLo = static_cast<F>(std::numeric_limits<I>::min());
  constexpr F kHiExcl = static_cast<F>(std::uint64_t(1) << std::numeric_limits<I>::digits);
  const F in_range = std::isnan(v) ? F(0) : std::clamp(v, kLo, kHiExcl);
  if (in_range >= kHiExcl) return std::numeric_limits<I>::max();
  return static_cast<I>(in_range);
}

template <typename I>
inline I int_to_int(std::int64_t v) {
  constexpr std::int64_t kMin = std::numeric_limits<I>::min();
  constexpr std::int64_t kMax = std::numeric_limits<I>::max();
  return static_cast<I>(std::clamp(v, kMin, kMax));
}

// ---- writing: wide value -> destination storage ------------------------------------------------
template <typename To, typename W>
inline To narrow(W v) {
  if constexpr (std::is_same_v<To, BoolByte>) {
    return BoolByte{static_cast<std::uint8_t>(v != W(0))};
  } else if constexpr (std::is_integral_v<To>) {
    if constexpr (std::is_floating_point_v<W>) return float_to_int<To>(v);
    else return int_to_int<To>(v);
  } else if constexpr (std::is_same_v<To, double> || std::is_same_v<To, float>) {
    return static_cast<To>(v);  // one IEEE rounding (int64 -> float included)
  } else if constexpr (std::is_same_v<W, float>) {
    return To::from_float(v);
  } else if constexpr (std::is_same_v<W, double> || std::is_same_v<W, std::int32_t>) {
    return To::from_double(static_cast<double>(v));  // int32 -> double is exact
  } else {
    static_assert(std::is_same_v<W, std::int64_t>);
    return To::from_double(int64_to_double_round_odd(v));
  }
}

template <typename To, typename From>
inline To convert_one(From v) {
  return narrow<To>(widen(v));
}

template <typename To, typename From>
void convert_block(const From* src, To* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = convert_one<To>(src[i]);
}

constexpr std::size_t kParallelMin = std::size_t(1) << 16;
constexpr std::size_t kBlock = std::size_t(1) << 14;  // elements per parallel work item

template <DType S, DType D>
void convert_typed(const void* src, void* dst, std::size_t n) {
  using From = StorageT<S>;
  using To = StorageT<D>;
  const From* s = static_cast<const From*>(src);
  To* d = static_cast<To*>(dst);
  if constexpr (S == D) {
    if (s != d) std::memcpy(d, s, n * sizeof(From));
  } else {
    if (n < kParallelMin) {
      convert_block(s, d, n);
      return;
    }
    const std::int64_t blocks = static_cast<std::int64_t>((n + kBlock - 1) / kBlock);
#pragma omp parallel for schedule(static)
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::size_t begin = static_cast<std::size_t>(b) * kBlock;
      convert_block(s + begin, d + begin, std::min(kBlock, n - begin));
    }
  }
}

// Calls f(std::integral_constant<DType, t>{}) for the runtime dtype t.
template <typename F>
decltype(auto) visit_dtype(DType t, const char* op, F&& f) {
  using enum DType;
  switch (t) {
    case f64: return f(std::integral_constant<DType, f64>{});
    case f32: return f(std::integral_constant<DType, f32>{});
    case f16: return f(std::integral_constant<DType, f16>{});
    case bf16: return f(std::integral_constant<DType, bf16>{});
    case f8_e4m3: return f(std::integral_constant<DType, f8_e4m3>{});
    case f8_e5m2: return f(std::integral_constant<DType, f8_e5m2>{});
    case i8: return f(std::integral_constant<DType, i8>{});
    case u8: return f(std::integral_constant<DType, u8>{});
    case i32: return f(std::integral_constant<DType, i32>{});
    case i64: return f(std::integral_constant<DType, i64>{});
    case boolean: return f(std::integral_constant<DType, boolean>{});
  }
  detail::throw_error(op, fmt::format("unknown dtype code {}", static_cast<int>(t)));
}

}  // namespace

void convert(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n) {
  visit_dtype(src_type, "convert", [&](auto s) {
    visit_dtype(dst_type, "convert", [&](auto d) {
      constexpr DType kSrc = decltype(s)::value;
      constexpr DType kDst = decltype(d)::value;
      if (n == 0) return;
      MT_CHECK(src != nullptr && dst != nullptr, "convert", "null buffer converting {} elements from {} to {}",
               n, dtype_name(kSrc), dtype_name(kDst));
      convert_typed<kSrc, kDst>(src, dst, n);
    });
  });
}

double read_as_double(const void* p, DType type) {
  return visit_dtype(type, "read_as_double", [&](auto t) {
    StorageT<decltype(t)::value> v;
    std::memcpy(&v, p, sizeof(v));
    return static_cast<double>(widen(v));
  });
}

void write_from_double(void* p, DType type, double v) {
  visit_dtype(type, "write_from_double", [&](auto t) {
    using T = StorageT<decltype(t)::value>;
    const T out = narrow<T>(v);
    std::memcpy(p, &out, sizeof(out));
  });
}

}  // namespace memtrain::detail

// Element types. Conversions between them live in core/float_types.h (scalar) and cpu/convert.h (bulk).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace memtrain {

enum class DType : std::uint8_t {
  f64,
  f32,
  f16,
  bf16,
  f8_e4m3,
  f8_e5m2,
  i8,
  u8,
  i32,
  i64,
  boolean,
};

inline constexpr int kNumDTypes = 11;

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: case DType::i64: return 8;
    case DType::f32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: return 2;
    case DType::f8_e4m3: case DType::f8_e5m2: case DType::i8: case DType::u8: case DType::boolean: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f64: return "f64";
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f8_e4m3: return "f8_e4m3";
    case DType::f8_e5m2: return "f8_e5m2";
    case DType::i8: return "i8";
    case DType::u8: return "u8";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::boolean: return "bool";
  }
  return "?";
}

constexpr bool is_floating(DType t) {
  return t == DType::f64 || t == DType::f32 || t == DType::f16 || t == DType::bf16 ||
         t == DType::f8_e4m3 || t == DType::f8_e5m2;
}

// Types whose arithmetic the CPU ops run natively; the others are computed in f32 and converted back.
constexpr bool is_compute_native(DType t) { return t == DType::f64 || t == DType::f32; }

}  // namespace memtrain

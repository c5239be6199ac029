// Element types of opbuilder tensors, their sizes and names.
#pragma once

#include <complex>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "opbuilder/detail/core_lib.h"

namespace opbuilder {

// Unscoped on purpose: both `kFloat32` and `DataType::kFloat32` work.
enum DataType : int {
  kBool = 0,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUInt8,
  kFloat16,
  kFloat32,
  kFloat64,
  kBFloat16,
  kComplex64,   // std::complex<float>
  kComplex128,  // std::complex<double>
  kUInt16,
  kUInt32,
  kUInt64,
  kTypeUnknown,
  // MindSpore's TypeId spellings of the same values, for ms_extension.h: being
  // enumerators, `TypeId::kNumberTypeFloat32` works as well as `kNumberTypeFloat32`.
  kNumberTypeBool = kBool,
  kNumberTypeInt8 = kInt8,
  kNumberTypeInt16 = kInt16,
  kNumberTypeInt32 = kInt32,
  kNumberTypeInt64 = kInt64,
  kNumberTypeUInt8 = kUInt8,
  kNumberTypeFloat16 = kFloat16,
  kNumberTypeFloat32 = kFloat32,
  kNumberTypeFloat64 = kFloat64,
  kNumberTypeBFloat16 = kBFloat16,
  kNumberTypeComplex64 = kComplex64,
  kNumberTypeComplex128 = kComplex128,
  kNumberTypeUInt16 = kUInt16,
  kNumberTypeUInt32 = kUInt32,
  kNumberTypeUInt64 = kUInt64,
};

inline constexpr int kNumDataTypes = static_cast<int>(kTypeUnknown);

// Real floating point: float16, bfloat16, float32, float64.
inline constexpr bool IsFloating(DataType t) {
  return t == kFloat16 || t == kBFloat16 || t == kFloat32 || t == kFloat64;
}
inline constexpr bool IsComplex(DataType t) { return t == kComplex64 || t == kComplex128; }
// The dtypes gradients flow to: floating and complex (integer and bool tensors are not differentiable).
inline constexpr bool IsDifferentiable(DataType t) { return IsFloating(t) || IsComplex(t); }

inline std::size_t ElementSize(DataType t) {
  switch (t) {
    case kBool: case kInt8: case kUInt8: return 1;
    case kInt16: case kUInt16: case kFloat16: case kBFloat16: return 2;
    case kInt32: case kUInt32: case kFloat32: return 4;
    case kInt64: case kUInt64: case kFloat64: case kComplex64: return 8;
    case kComplex128: return 16;
    default: return 0;
  }
}

// The names runtime dtypes and the aot ABI use ("float32", "bool", ...).
OB_CORE_FN const char *DataTypeName(DataType t);

// The DataType a name of DataTypeName stands for (an aot op's dtypes[i]); kTypeUnknown for others.
inline DataType DataTypeFromName(const char *name) {
  if (name == nullptr) return kTypeUnknown;
  for (int t = 0; t < static_cast<int>(kTypeUnknown); ++t) {
    if (std::strcmp(name, DataTypeName(static_cast<DataType>(t))) == 0) return static_cast<DataType>(t);
  }
  return kTypeUnknown;
}

// IEEE 754 binary16, stored as bits; converts to and from float.
struct Half {
  std::uint16_t bits = 0;

  Half() = default;
  Half(float f) : bits(FromFloat(f)) {}  // NOLINT(google-explicit-constructor)
  operator float() const { return ToFloat(bits); }  // NOLINT(google-explicit-constructor)

  static float ToFloat(std::uint16_t h) {
    std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    std::uint32_t exp = (h >> 10) & 0x1fu;
    std::uint32_t man = h & 0x3ffu;
    std::uint32_t out;
    if (exp == 0x1f) {
      out = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
      out = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
      out = sign;
    } else {  // subnormal half: normalise
      int e = -1;
      do { ++e; man <<= 1; } while ((man & 0x400u) == 0);
      out = sign | ((112u - static_cast<std::uint32_t>(e)) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &out, sizeof f);
    return f;
  }

  static std::uint16_t FromFloat(float f) {
    std::uint32_t x;
    std::memcpy(&x, &f, sizeof x);
    std::uint32_t sign = (x >> 16) & 0x8000u;
    std::uint32_t abs = x & 0x7fffffffu;
    if (abs >= 0x7f800000u) {  // inf or nan
      return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
    }
    if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow -> inf
    if (abs < 0x38800000u) {  // result is subnormal or zero
      if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);
      std::uint32_t man = (abs & 0x7fffffu) | 0x800000u;
      const int shift = 126 - static_cast<int>(abs >> 23);  // 14..24: value = man * 2^-shift half-ulps
      std::uint32_t half = man >> shift;
      std::uint32_t rem = man & ((1u << shift) - 1u);
      std::uint32_t mid = 1u << (shift - 1);
      if (rem > mid || (rem == mid && (half & 1u))) ++half;
      return static_cast<std::uint16_t>(sign | half);
    }
    std::uint32_t half = ((abs - 0x38000000u) >> 13);
    std::uint32_t rem = abs & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
};

// bfloat16 (the top 16 bits of a float32), stored as bits; converts to and from
// float, rounding to nearest even. Arithmetic goes through float.
struct bfloat16 {
  std::uint16_t bits = 0;

  bfloat16() = default;
  bfloat16(float f) : bits(FromFloat(f)) {}  // NOLINT(google-explicit-constructor)
  operator float() const { return ToFloat(bits); }  // NOLINT(google-explicit-constructor)

  static float ToFloat(std::uint16_t b) {
    const std::uint32_t x = static_cast<std::uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &x, sizeof f);
    return f;
  }

  static std::uint16_t FromFloat(float f) {
    std::uint32_t x;
    std::memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // NaN stays quiet NaN
    x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest, ties to even (overflow rounds to inf)
    return static_cast<std::uint16_t>(x >> 16);
  }
};

template <typename T> struct DataTypeOf;
template <> struct DataTypeOf<bool> { static constexpr DataType value = kBool; };
template <> struct DataTypeOf<std::int8_t> { static constexpr DataType value = kInt8; };
template <> struct DataTypeOf<std::int16_t> { static constexpr DataType value = kInt16; };
template <> struct DataTypeOf<std::int32_t> { static constexpr DataType value = kInt32; };
template <> struct DataTypeOf<std::int64_t> { static constexpr DataType value = kInt64; };
template <> struct DataTypeOf<std::uint8_t> { static constexpr DataType value = kUInt8; };
template <> struct DataTypeOf<Half> { static constexpr DataType value = kFloat16; };
template <> struct DataTypeOf<float> { static constexpr DataType value = kFloat32; };
template <> struct DataTypeOf<double> { static constexpr DataType value = kFloat64; };
template <> struct DataTypeOf<bfloat16> { static constexpr DataType value = kBFloat16; };
template <> struct DataTypeOf<std::complex<float>> { static constexpr DataType value = kComplex64; };
template <> struct DataTypeOf<std::complex<double>> { static constexpr DataType value = kComplex128; };
template <> struct DataTypeOf<std::uint16_t> { static constexpr DataType value = kUInt16; };
template <> struct DataTypeOf<std::uint32_t> { static constexpr DataType value = kUInt32; };
template <> struct DataTypeOf<std::uint64_t> { static constexpr DataType value = kUInt64; };

}  // namespace opbuilder

#if !OB_CORE_SHARED  // no core library: its bodies compile here, inline (detail/core_lib.h)
#if __has_include("../../src/core/dtype.cpp")
#include "../../src/core/dtype.cpp"
#else  // a copy of these headers (vendored): the installed ones' sources, found from the include path
#include "../src/core/dtype.cpp"
#endif
#endif

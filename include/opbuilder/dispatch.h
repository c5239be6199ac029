// Dtype dispatch: run one body per dtype with `scalar_t` naming that dtype's C++ type.
//
//   OB_DISPATCH_FLOATING_TYPES(x->dtype(), "my_op", [&] {
//     Kernel<scalar_t>(x->data<scalar_t>(), out->data<scalar_t>(), x->numel());
//   });
//
// The body is pasted into one switch case per dtype (as PyTorch's AT_DISPATCH_*), after
// `using scalar_t = <type>;`; the macro's value is the body's return value. Any other dtype
// raises a Python TypeError: "my_op: unsupported dtype int32; supported: float32, float64".
// C++ types: float16 -> opbuilder::Half, bfloat16 -> opbuilder::bfloat16 (both compute through
// float), complex64/128 -> std::complex<float/double>, the integers -> std::(u)intN_t.
// Python-free: aot operators use it too (with DataTypeFromName(dtypes[i])); an exception
// escaping an aot kernel is reported as a RuntimeError with its message.
#pragma once

#include <complex>
#include <cstdint>
#include <string>

#include "opbuilder/detail/error_types.h"
#include "opbuilder/detail/visibility.h"
#include "opbuilder/dtype.h"

namespace opbuilder {

// The complex conjugate; a real value unchanged (backward rules of complex ops multiply by conj(f'(z))).
template <typename T>
inline T Conj(const T &v) { return v; }
template <typename T>
inline std::complex<T> Conj(const std::complex<T> &v) { return std::conj(v); }

namespace detail OB_HIDDEN {

[[noreturn]] inline void DispatchFailed(const char *op, DataType t, const char *supported) {
  throw TypeError(std::string(op) + ": unsupported dtype " + DataTypeName(t) + "; supported: " + supported);
}

}  // namespace detail
}  // namespace opbuilder

#define OB_DISPATCH_CASE(ENUM, TYPE, ...) \
  case ::opbuilder::ENUM: {               \
    using scalar_t = TYPE;                \
    return __VA_ARGS__();                 \
  }

// A switch over TYPE with the given OB_DISPATCH_CASEs; SUPPORTED names them for the error.
#define OB_DISPATCH_SWITCH(TYPE, NAME, SUPPORTED, ...)                                  \
  [&] {                                                                                 \
    const ::opbuilder::DataType ob_dispatch_type_ = (TYPE);                             \
    switch (ob_dispatch_type_) {                                                        \
      __VA_ARGS__                                                                       \
      default: ::opbuilder::detail::DispatchFailed((NAME), ob_dispatch_type_, SUPPORTED); \
    }                                                                                   \
  }()

#define OB_DISPATCH_CASES_FLOATING(...) \
  OB_DISPATCH_CASE(kFloat32, float, __VA_ARGS__) OB_DISPATCH_CASE(kFloat64, double, __VA_ARGS__)
#define OB_DISPATCH_CASES_COMPLEX(...)                                  \
  OB_DISPATCH_CASE(kComplex64, std::complex<float>, __VA_ARGS__)        \
  OB_DISPATCH_CASE(kComplex128, std::complex<double>, __VA_ARGS__)
#define OB_DISPATCH_CASES_INTEGRAL(...)                                                                    \
  OB_DISPATCH_CASE(kInt8, std::int8_t, __VA_ARGS__) OB_DISPATCH_CASE(kInt16, std::int16_t, __VA_ARGS__)    \
  OB_DISPATCH_CASE(kInt32, std::int32_t, __VA_ARGS__) OB_DISPATCH_CASE(kInt64, std::int64_t, __VA_ARGS__)  \
  OB_DISPATCH_CASE(kUInt8, std::uint8_t, __VA_ARGS__) OB_DISPATCH_CASE(kUInt16, std::uint16_t, __VA_ARGS__) \
  OB_DISPATCH_CASE(kUInt32, std::uint32_t, __VA_ARGS__) OB_DISPATCH_CASE(kUInt64, std::uint64_t, __VA_ARGS__)
#define OB_DISPATCH_SUPPORTED_INTEGRAL "int8, int16, int32, int64, uint8, uint16, uint32, uint64"

// float32, float64
#define OB_DISPATCH_FLOATING_TYPES(TYPE, NAME, ...) \
  OB_DISPATCH_SWITCH(TYPE, NAME, "float32, float64", OB_DISPATCH_CASES_FLOATING(__VA_ARGS__))
// float32, float64, float16
#define OB_DISPATCH_FLOATING_TYPES_AND_HALF(TYPE, NAME, ...)                               \
  OB_DISPATCH_SWITCH(TYPE, NAME, "float32, float64, float16", OB_DISPATCH_CASES_FLOATING(__VA_ARGS__) \
                     OB_DISPATCH_CASE(kFloat16, ::opbuilder::Half, __VA_ARGS__))
// float32, float64, bfloat16
#define OB_DISPATCH_FLOATING_TYPES_AND_BF16(TYPE, NAME, ...)                                \
  OB_DISPATCH_SWITCH(TYPE, NAME, "float32, float64, bfloat16", OB_DISPATCH_CASES_FLOATING(__VA_ARGS__) \
                     OB_DISPATCH_CASE(kBFloat16, ::opbuilder::bfloat16, __VA_ARGS__))
// complex64, complex128
#define OB_DISPATCH_COMPLEX_TYPES(TYPE, NAME, ...) \
  OB_DISPATCH_SWITCH(TYPE, NAME, "complex64, complex128", OB_DISPATCH_CASES_COMPLEX(__VA_ARGS__))
// float32, float64, complex64, complex128
#define OB_DISPATCH_FLOATING_AND_COMPLEX_TYPES(TYPE, NAME, ...)                                        \
  OB_DISPATCH_SWITCH(TYPE, NAME, "float32, float64, complex64, complex128",                            \
                     OB_DISPATCH_CASES_FLOATING(__VA_ARGS__) OB_DISPATCH_CASES_COMPLEX(__VA_ARGS__))
// float32, float64, complex64, complex128, bfloat16
#define OB_DISPATCH_FLOATING_AND_COMPLEX_TYPES_AND_BF16(TYPE, NAME, ...)                               \
  OB_DISPATCH_SWITCH(TYPE, NAME, "float32, float64, complex64, complex128, bfloat16",                  \
                     OB_DISPATCH_CASES_FLOATING(__VA_ARGS__) OB_DISPATCH_CASES_COMPLEX(__VA_ARGS__)    \
                     OB_DISPATCH_CASE(kBFloat16, ::opbuilder::bfloat16, __VA_ARGS__))
// int8 ... int64, uint8 ... uint64
#define OB_DISPATCH_INTEGRAL_TYPES(TYPE, NAME, ...) \
  OB_DISPATCH_SWITCH(TYPE, NAME, OB_DISPATCH_SUPPORTED_INTEGRAL, OB_DISPATCH_CASES_INTEGRAL(__VA_ARGS__))
// the integers, float32, float64
#define OB_DISPATCH_ALL_TYPES(TYPE, NAME, ...)                                                       \
  OB_DISPATCH_SWITCH(TYPE, NAME, OB_DISPATCH_SUPPORTED_INTEGRAL ", float32, float64",                \
                     OB_DISPATCH_CASES_INTEGRAL(__VA_ARGS__) OB_DISPATCH_CASES_FLOATING(__VA_ARGS__))
// the integers, float32, float64, complex64, complex128
#define OB_DISPATCH_ALL_TYPES_AND_COMPLEX(TYPE, NAME, ...)                                          \
  OB_DISPATCH_SWITCH(TYPE, NAME, OB_DISPATCH_SUPPORTED_INTEGRAL ", float32, float64, complex64, complex128", \
                     OB_DISPATCH_CASES_INTEGRAL(__VA_ARGS__) OB_DISPATCH_CASES_FLOATING(__VA_ARGS__)  \
                     OB_DISPATCH_CASES_COMPLEX(__VA_ARGS__))

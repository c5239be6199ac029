"""The helpers every generated kernel starts with (C++17, header-free apart from the standard library).

Each one gives numpy's answer where C++'s differs: floor division and modulo
round toward minus infinity, max/min propagate NaN, a negative index
wraps once (``wrap``; -1 is the last element, as in Python), integer division by zero
gives 0 instead of a trap, sign(NaN) is NaN. In debug builds ``ob::at``
checks an index against its extent and records the first failure (file:line
of the DSL source) instead of reading outside the tensor. Where numpy raises
(a negative integer power, int() of NaN, an element assignment or a Python
int out of an integer dtype's range), the checked helpers throw ``Raise``.
Where glibc has libmvec, the libm functions are declared with their vector
variants (runtime/vector_math.py), so a loop over ``exp``/``log1p``/... vectorizes.
"""
from __future__ import annotations

from .. import vector_math

__all__ = ["PRELUDE"]

_HELPERS = r"""#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <type_traits>

namespace ob {

// float16 (_Float16) has no std::floor/fmod/pow overloads of its own: compute in float and round back
template <typename T> using wide_t = std::conditional_t<(sizeof(T) < sizeof(float)), float, T>;
// numpy's float divmod (npy_divmod): the quotient snapped to an integer, the remainder with b's sign
template <typename W> inline W fdivmod(W a, W b, W *mod) {
  W m = std::fmod(a, b);
  if (b == 0) {
    *mod = m;
    return a / b;
  }
  W div = (a - m) / b;
  if (m != 0) {
    if ((b < 0) != (m < 0)) {
      m += b;
      div -= 1;
    }
  } else {
    m = std::copysign(W(0), b);
  }
  W q;
  if (div != 0) {
    q = std::floor(div);
    if (div - q > W(0.5)) q += 1;
  } else {
    q = std::copysign(W(0), a / b);
  }
  *mod = m;
  return q;
}
template <typename T> inline T floordiv(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    if (b == 0) return 0;
    if constexpr (std::is_signed_v<T>) {  // the lowest value // -1 overflows (a trap): numpy wraps it
      if (b == -1) return static_cast<T>(std::make_unsigned_t<T>(0) - static_cast<std::make_unsigned_t<T>>(a));
    }
    T q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? static_cast<T>(q - 1) : q;
  } else {
    using W = wide_t<T>;
    W m;
    return static_cast<T>(fdivmod(static_cast<W>(a), static_cast<W>(b), &m));
  }
}
template <typename T> inline T mod(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    if (b == 0) return 0;
    if constexpr (std::is_signed_v<T>) {
      if (b == -1) return 0;  // the lowest value % -1 would trap
    }
    T r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? static_cast<T>(r + b) : r;
  } else {
    using W = wide_t<T>;
    W m;
    fdivmod(static_cast<W>(a), static_cast<W>(b), &m);
    return static_cast<T>(m);
  }
}
// numpy's shifts: a count outside [0, bits of T) shifts everything out (0, or -1 for a negative a >>)
template <typename T> inline T shl(T a, T b) {
  using U = std::make_unsigned_t<std::conditional_t<std::is_same_v<T, bool>, unsigned char, T>>;
  if (b < 0 || static_cast<uint64_t>(b) >= sizeof(T) * 8) return 0;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) << b));
}
template <typename T> inline T shr(T a, T b) {
  if (b < 0 || static_cast<uint64_t>(b) >= sizeof(T) * 8) return a < 0 ? static_cast<T>(-1) : static_cast<T>(0);
  return static_cast<T>(a >> b);
}
template <typename T> inline T power(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    if (b < 0) return 0;
    T r = 1;
    while (b > 0) {
      if (b & 1) r = static_cast<T>(r * a);
      a = static_cast<T>(a * a);
      b = static_cast<T>(b >> 1);
    }
    return r;
  } else {
    using W = wide_t<T>;
    return static_cast<T>(std::pow(static_cast<W>(a), static_cast<W>(b)));
  }
}
// A float to an integer type, defined for every value (C++ leaves NaN and out-of-range values undefined):
// numpy's result on x86-64, where int64 takes an out-of-range or NaN value as its lowest value and the
// narrower types go through int32 (out of range: INT32_MIN), then keep their low bits (int8(300.0) is 44).
template <typename To, typename From> inline To f2i(From v) {
  using W = wide_t<From>;
  const W w = static_cast<W>(v);
  if constexpr (sizeof(To) == 8) {
    return (w >= W(-9223372036854775808.0) && w < W(9223372036854775808.0)) ? static_cast<To>(w) : INT64_MIN;
  } else {
    const int32_t i = (w >= W(-2147483648.0) && w < W(2147483648.0)) ? static_cast<int32_t>(w) : INT32_MIN;
    return static_cast<To>(static_cast<std::make_unsigned_t<To>>(static_cast<uint32_t>(i)));
  }
}
// Where numpy or Python raise, a kernel throws Raise with the status of that check (its site in the table
// cxx.py keeps: the exception, the DSL file:line and the operation); the entry function catches it and
// returns the status, the runtime raises the exception (kernel.py). Only generated code throws it, and it never
// leaves the entry function; the checks below are called only where a value can be out of what numpy accepts.
struct Raise {
  int status;
};
[[noreturn]] __attribute__((cold, noinline)) inline void raise(int status) { throw Raise{status}; }
// a ** b of integers: numpy refuses a negative exponent (ValueError)
template <typename T> inline T ipower(T a, T b, int site) {
  if constexpr (std::is_signed_v<T>) {
    if (__builtin_expect(b < 0, 0)) raise(site);
  }
  return power(a, b);
}
// An integer (a Python int, or a wider type being stored) as the integer type To: numpy raises OverflowError
// for a value out of To's range ("Python integer 300 out of bounds for int8").
template <typename To, typename From> inline To fit(From v, int site) {
  const int64_t w = static_cast<int64_t>(v);  // every DSL integer type fits in int64
  if (__builtin_expect(w < int64_t{std::numeric_limits<To>::min()} || w > int64_t{std::numeric_limits<To>::max()}, 0))
    raise(site);
  return static_cast<To>(v);
}
// A float as the integer type To, as Python's int() and numpy's element assignment convert it: truncated;
// NaN raises ValueError (status site), an infinity OverflowError (site + 1), another value whose truncation is
// out of To's range OverflowError (site + 2).
template <typename To, typename From> inline To f2i_checked(From v, int site) {
  const double d = static_cast<double>(static_cast<wide_t<From>>(v));
  bool ok;
  if constexpr (sizeof(To) == 8) ok = d >= -9223372036854775808.0 && d < 9223372036854775808.0;
  else ok = d > static_cast<double>(std::numeric_limits<To>::min()) - 1.0 &&
            d < static_cast<double>(std::numeric_limits<To>::max()) + 1.0;
  if (__builtin_expect(!ok, 0)) raise(d != d ? site : std::isinf(d) ? site + 1 : site + 2);
  return static_cast<To>(d);
}
// Python's meaning of a negative index, wrapped once: -1 is the last element.
inline int64_t wrap(int64_t i, int64_t n) { return i < 0 ? i + n : i; }
template <typename T> inline T max(T a, T b) { return (a > b || a != a) ? a : b; }
template <typename T> inline T min(T a, T b) { return (a < b || a != a) ? a : b; }
template <typename T> inline T abs(T a) {
  if constexpr (std::is_integral_v<T>) return a < 0 ? static_cast<T>(-a) : a;
  else return static_cast<T>(std::fabs(static_cast<wide_t<T>>(a)));  // abs(-0.0) is 0.0
}
template <typename T> inline T sign(T a) { return a > 0 ? T(1) : a < 0 ? T(-1) : a == 0 ? T(0) : a; }
template <typename T> inline T rsqrt(T a) { return T(1) / std::sqrt(a); }
template <typename T> inline T floor(T a) { if constexpr (std::is_integral_v<T>) return a; else return std::floor(a); }
template <typename T> inline T ceil(T a) { if constexpr (std::is_integral_v<T>) return a; else return std::ceil(a); }
template <typename T> inline T trunc(T a) { if constexpr (std::is_integral_v<T>) return a; else return std::trunc(a); }
template <typename T> inline T nearbyint(T a) {
  if constexpr (std::is_integral_v<T>) return a; else return std::nearbyint(a);
}
template <typename T> inline bool isnan(T a) { if constexpr (std::is_integral_v<T>) return false; else return a != a; }
template <typename T> inline bool isinf(T a) {
  if constexpr (std::is_integral_v<T>) return false; else return std::isinf(a);
}
template <typename T> inline bool isfinite(T a) {
  if constexpr (std::is_integral_v<T>) return true; else return std::isfinite(a);
}

// The first out-of-range index of a debug build: where, which index, its value and extent.
struct Check {
  char *error;  // the AotExtra error buffer (512 bytes)
  bool failed = false;
  int64_t at(int64_t i, int64_t n, const char *where) {
    const int64_t j = i < 0 ? i + n : i;  // -1 is the last element, as in Python
    if (j >= 0 && j < n) return j;
    if (!failed) {
      failed = true;
      std::snprintf(error, 512, "%s: index %lld is out of range for a dimension of size %lld", where,
                    static_cast<long long>(i), static_cast<long long>(n));
    }
    return 0;
  }
};

}  // namespace ob
"""


def _prelude() -> str:
    if not vector_math.available():
        return _HELPERS
    names = vector_math.UNARY + vector_math.BINARY
    return _HELPERS + "// glibc's vector math (libmvec): a loop over these calls vectorizes\n" + \
        vector_math.declarations(names) + "\n"


PRELUDE = _prelude()

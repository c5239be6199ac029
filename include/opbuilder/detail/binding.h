// What the binding-neutral core asks of a binding layer, and saved_data's values.
//
// `Binding<Dep>` is declared here and defined by exactly one binding layer:
// opbuilder/casters.h (pybind11) or opbuilder/nanobind.h (nanobind). `Dep` only
// defers the lookup to where an operator's code is instantiated, after its
// binding header was included; including both layers in one file is a
// redefinition error, so a source can never mix them silently. It provides:
//   static PyObject *ToPython(V &&v);             // new reference, or throws
//   template <class T> static T FromPython(PyObject *o);
//   static void SetErrorFromCurrentException();   // inside a catch: set the Python error
#pragma once

#include <Python.h>

#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "opbuilder/detail/errors.h"
#include "opbuilder/detail/pyref.h"
#include "opbuilder/detail/visibility.h"

namespace opbuilder {
namespace detail OB_HIDDEN {

template <typename Dep>
struct Binding;

// Sets the Python error for the exception being handled (the node's error path).
using ErrorFn = void (*)();

// A bool argument of a bound function on the pybind11 layer: True or False only (casters.h's caster), as
// nanobind's bool and torch's (detail/bound_call.h's ArgIn).
struct StrictBool {
  bool value;
  operator bool() const { return value; }  // NOLINT: implicit, into the function's own bool
};

// Non-null while this thread runs code for an XLA FFI handler, without the GIL: what that code is, for
// saved_data's messages.
inline const char *&NoPythonHandler() {
  static thread_local const char *where = nullptr;
  return where;
}

// Non-null while to_jax's probe runs a Function on this thread to learn whether it uses saved_data
// (replay.h SwapNoPython): saved_data then refuses, and the probe reads the refusal.
inline const char *&ProbeRefusesPython() {
  static thread_local const char *where = nullptr;
  return where;
}

// The std exceptions' Python types, as both binding libraries map them (call inside a catch).
OB_CORE_FN void SetStdError();

// The neutral exceptions (errors.h), else the std mapping (call inside a catch).
OB_CORE_FN void SetNeutralOrStdError();

// What a stored value may be read back as, the same on both binding layers (pybind11 would read a float
// as a bool by its truth, nanobind refuses with a bare std::bad_cast): a bool (numpy's too) as bool only, an
// int as an integer type it fits or a floating type, a float (numpy's too) as a floating type, a str as
// std::string or char; no array or tensor as a number. Else a TypeError naming both (`what`: the reader).
// `bits`, `is_signed`: an integer type's. (An optional and a list are read by their values: SavedValue.)
enum class ReadKind : int { kBool, kInteger, kFloating, kString };
OB_CORE_FN void CheckReadAs(PyObject *o, ReadKind want, const char *what, int bits, bool is_signed);
// What a read the binding layer refused (its cast error) raises: that TypeError.
[[noreturn]] OB_CORE_FN void ThrowReadAs(PyObject *o, const char *what);

template <typename T>
struct ReadElements : std::false_type {};
template <typename T>
struct ReadElements<std::vector<T>> : std::true_type {};
template <typename T>
struct ReadOptional : std::false_type {};
template <typename T>
struct ReadOptional<std::optional<T>> : std::true_type {};

template <typename T>
inline void CheckReadAs(PyObject *o, const char *what) {
  if constexpr (std::is_same_v<T, bool>) {
    CheckReadAs(o, ReadKind::kBool, what, 0, false);
  } else if constexpr (std::is_same_v<T, char> || std::is_same_v<T, std::string>) {
    CheckReadAs(o, ReadKind::kString, what, 0, false);
  } else if constexpr (std::is_integral_v<T>) {
    CheckReadAs(o, ReadKind::kInteger, what, static_cast<int>(sizeof(T) * 8), std::is_signed_v<T>);
  } else if constexpr (std::is_floating_point_v<T>) {
    CheckReadAs(o, ReadKind::kFloating, what, 0, false);
  }
}
}  // namespace detail
}  // namespace opbuilder

#if !OB_CORE_SHARED  // no core library: its bodies compile here, inline (detail/core_lib.h)
#if __has_include("../../../src/core/binding.cpp")
#include "../../../src/core/binding.cpp"
#else  // a copy of these headers (vendored): the installed ones' sources, found from the include path
#include "../src/core/binding.cpp"
#endif
#endif

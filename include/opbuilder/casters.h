// The pybind11 binding layer: TensorPtr <-> runtime.Tensor (zero-copy both
// ways) over the binding-neutral bridge, and what the core asks of a binding
// (detail/binding.h): saved_data conversions, the jit trace hook, and the
// Python type of each exception the core throws.
//
// Arguments declared as TensorPtr (or const TensorPtr&, or TensorPtrList)
// accept a runtime.Tensor or a numpy array; a returned TensorPtr becomes the
// runtime.Tensor it is bound to, or a new one sharing its memory. None is not
// a tensor: use std::optional<TensorPtr> (with <pybind11/stl.h>) for optional
// inputs, so C++ never sees an unexpected null.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <stdexcept>
#include <type_traits>
#include <utility>

#if defined(__has_include)
#if __has_include(<pybind11/detail/exception_translation.h>)
#include <pybind11/detail/exception_translation.h>
#define OB_HAVE_PYBIND11_TRANSLATE 1
#endif
#endif

#include "opbuilder/detail/binding.h"
#include "opbuilder/detail/errors.h"
#include "opbuilder/detail/runtime_bridge.h"
#include "opbuilder/tensor.h"

namespace opbuilder {
namespace detail OB_HIDDEN {

// The core's exceptions as Python errors, for every function this module binds.
inline bool RegisterPybind11Translator() {
  pybind11::register_local_exception_translator([](std::exception_ptr p) {
    if (p && !SetNeutralError(p)) std::rethrow_exception(p);
  });
  return true;
}
// Registered when the library is loaded (the importing thread holds the GIL).
inline const bool kPybind11TranslatorRegistered = RegisterPybind11Translator();

template <typename Dep>
struct Binding {
  template <typename V>
  static PyObject *ToPython(V &&v) {
    if constexpr (std::is_base_of_v<pybind11::handle, std::decay_t<V>>) {  // py::cast(x), py::float_(x): as is
      return pybind11::handle(v).inc_ref().ptr();
    } else {
      return pybind11::cast(std::forward<V>(v)).release().ptr();
    }
  }
  template <typename T>
  static T FromPython(PyObject *o) {
    return pybind11::reinterpret_borrow<pybind11::object>(o).cast<T>();
  }
  static bool IsCastError(const std::exception &e) {  // (its char caster's refusal is a value_error)
    return dynamic_cast<const pybind11::cast_error *>(&e) != nullptr ||
           dynamic_cast<const pybind11::value_error *>(&e) != nullptr;
  }
  static void SetErrorFromCurrentException() {
    if (SetNeutralError(std::current_exception())) return;
#ifdef OB_HAVE_PYBIND11_TRANSLATE
    pybind11::detail::try_translate_exceptions();  // pybind11's mapping, registered translators included
#else
    // pybind11 before 2.13.6 has no public entry to its translators: its built-in mapping
    try {
      throw;
    } catch (pybind11::error_already_set &e) {
      e.restore();
    } catch (const pybind11::builtin_exception &e) {
      e.set_error();
    } catch (...) {
      SetStdError();
    }
#endif
  }
};

}  // namespace detail
}  // namespace opbuilder

namespace pybind11 {
namespace detail {

template <>
struct type_caster<opbuilder::TensorPtr> {
 public:
  PYBIND11_TYPE_CASTER(opbuilder::TensorPtr, const_name("runtime.Tensor"));

  bool load(handle src, bool /*convert*/) {
    value = opbuilder::detail::TensorFromObject(src.ptr());
    return value != nullptr;
  }

  static handle cast(const opbuilder::TensorPtr &t, return_value_policy /*policy*/, handle /*parent*/) {
    return opbuilder::detail::TensorToObject(t);
  }
};

template <>
struct type_caster<opbuilder::detail::StrictBool> {
 public:
  PYBIND11_TYPE_CASTER(opbuilder::detail::StrictBool, const_name("bool"));

  bool load(handle src, bool /*convert*/) {  // True or False only (detail/bound_call.h)
    if (src.ptr() != Py_True && src.ptr() != Py_False) return false;
    value.value = src.ptr() == Py_True;
    return true;
  }

  static handle cast(opbuilder::detail::StrictBool b, return_value_policy /*policy*/, handle /*parent*/) {
    return pybind11::bool_(b.value).release();
  }
};

}  // namespace detail
}  // namespace pybind11

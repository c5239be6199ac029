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

#include <string>
#include <type_traits>
#include <utility>

#include "opbuilder/detail/errors.h"
#include "opbuilder/detail/pyref.h"
#include "opbuilder/detail/visibility.h"

namespace opbuilder {
namespace detail OB_HIDDEN {

template <typename Dep>
struct Binding;

// Sets the Python error for the exception being handled (the node's error path).
using ErrorFn = void (*)();

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

// The GIL for one conversion of a saved_data value: PyGILState_Ensure and Release nest, so a thread
// that holds the GIL keeps it and one that did not (an XLA FFI handler's run, a body under
// gil_scoped_release) gives it back at once. (PyGILState_Check, which GilForRefcount asks, is answered
// in an XLA FFI run by gil_wrap.h, which keeps the GIL to the run's end: threads the run then joins,
// whose Applies need the GIL, would wait for ever.)
class GilForValue {
 public:
  GilForValue() : state_(PyGILState_Ensure()) {}
  ~GilForValue() { PyGILState_Release(state_); }
  GilForValue(const GilForValue &) = delete;
  GilForValue &operator=(const GilForValue &) = delete;

 private:
  PyGILState_STATE state_;
};

// What saved_data keeps of a value stored: the value; a tensor stored in an XLA FFI run is kept as a
// private copy (ffi_bound.h specializes this: XLA's buffers do not outlive the call, the context may).
template <typename V>
struct SavedForm {
  template <typename U>
  static U &&Of(U &&v) {
    return std::forward<U>(v);
  }
};

// One value of AutogradContext::saved_data: held as a Python object, converted
// by the operator's binding layer on the way in (operator=) and out (cast<T>()).
// Each conversion takes the GIL for itself if this thread does not hold it.
class SavedValue {
 public:
  SavedValue() = default;
  template <typename V, typename = std::enable_if_t<!std::is_same_v<std::decay_t<V>, SavedValue>>>
  SavedValue &operator=(V &&v) {
    CheckPython();
    auto &&kept = SavedForm<std::decay_t<V>>::Of(std::forward<V>(v));
    GilForValue gil;  // (the value replaced is dropped under it too)
    obj_ = PyRef::Steal(Binding<std::decay_t<V>>::ToPython(std::forward<decltype(kept)>(kept)));
    return *this;
  }
  template <typename T>
  T cast() const {
    CheckPython();
    if (!obj_) throw std::runtime_error("saved_data: no value was stored under this key");
    GilForValue gil;
    return Binding<T>::template FromPython<T>(obj_.get());
  }
  PyObject *ptr() const { return obj_.get(); }
  explicit operator bool() const { return static_cast<bool>(obj_); }

 private:
  static void CheckPython() {
    if (const char *probe = ProbeRefusesPython()) {
      throw std::runtime_error(std::string("ctx->saved_data holds Python objects (seen by ") + probe + ")");
    }
    if (!Py_IsInitialized()) {
      const char *where = NoPythonHandler();
      throw std::runtime_error(std::string("ctx->saved_data holds Python objects, and Python has ended") +
                               (where != nullptr ? std::string(" (in ") + where + ")" : std::string()));
    }
  }
  PyRef obj_;
};

// The std exceptions' Python types, as both binding libraries map them (call inside a catch).
OB_CORE_FN void SetStdError();

// The neutral exceptions (errors.h), else the std mapping (call inside a catch).
OB_CORE_FN void SetNeutralOrStdError();

}  // namespace detail
}  // namespace opbuilder

#if !OB_CORE_SHARED  // no core library: its bodies compile here, inline (detail/core_lib.h)
#if __has_include("../../../src/core/binding.cpp")
#include "../../../src/core/binding.cpp"
#else  // a copy of these headers (vendored): the installed ones' sources, found from the include path
#include "../src/core/binding.cpp"
#endif
#endif

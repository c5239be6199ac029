// Python exceptions from the binding-neutral core, without pybind11 or nanobind.
//
// The core (tensor.h, autograd.h, the bridge) throws these; each binding layer
// (casters.h for pybind11, nanobind.h for nanobind) registers a translator that
// raises the named Python type. ValueError derives from std::invalid_argument,
// which both libraries already raise as ValueError.
#pragma once

#include <Python.h>

#include <exception>
#include <stdexcept>
#include <string>

#include "opbuilder/detail/error_types.h"
#include "opbuilder/detail/pyref.h"
#include "opbuilder/detail/visibility.h"

namespace opbuilder {
namespace detail OB_HIDDEN {

// TypeError and ValueError: error_types.h

// A Python error that a C API call left set, taken out of the interpreter so the
// exception can travel through C++; the translator puts it back unchanged.
class PythonError : public std::exception {
 public:
  OB_CORE_FN PythonError();
  const char *what() const noexcept override { return what_.c_str(); }
  // Sets the held error as the current Python error (the GIL held).
  OB_CORE_FN void Restore() const;

 private:
  // (type, value, traceback) in one tuple: one reference to drop in the (inline) destructor
  PyRef error_;
  std::string what_;
};


// Throws PythonError for the Python error set now. Out of line (in the core library), so that an
// operator that calls Check() does not compile PythonError's destructor and virtual table itself.
[[noreturn]] OB_CORE_FN void ThrowPythonError();

// A new reference, or PythonError if the call that made it failed.
inline PyObject *Check(PyObject *o) {
  if (o == nullptr) ThrowPythonError();
  return o;
}
inline void Check(int rc) {
  if (rc < 0) ThrowPythonError();
}

// Sets the Python error for one of the exceptions above (call inside a catch);
// false for any other exception, which the binding library maps itself.
OB_CORE_FN bool SetNeutralError(const std::exception_ptr &p);

// nanobind's exception translator (nanobind.h registers it): SetNeutralError, else nanobind's own
// mapping; what is not a std::exception (`throw 42`) as RuntimeError with pybind11's message, so a
// function raises alike on both layers (nanobind itself would report a SystemError).
OB_CORE_FN void TranslateNeutral(const std::exception_ptr &p, void *);

}  // namespace detail
}  // namespace opbuilder

#if !OB_CORE_SHARED  // no core library: its bodies compile here, inline (detail/core_lib.h)
#if __has_include("../../../src/core/errors.cpp")
#include "../../../src/core/errors.cpp"
#else  // a copy of these headers (vendored): the installed ones' sources, found from the include path
#include "../src/core/errors.cpp"
#endif
#endif

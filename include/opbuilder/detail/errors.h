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

#if OB_CORE_BODIES  // a member: declared in its class
OB_CORE_FN PythonError::PythonError() {
  PyObject *t = nullptr, *v = nullptr, *tb = nullptr;
  PyErr_Fetch(&t, &v, &tb);
  if (t == nullptr) {
    t = PyExc_SystemError;
    Py_INCREF(t);
    v = PyUnicode_FromString("opbuilder: a Python C API call failed without setting an error");
  }
  PyErr_NormalizeException(&t, &v, &tb);
  error_ = PyRef::Steal(PyTuple_Pack(3, t, v != nullptr ? v : Py_None, tb != nullptr ? tb : Py_None));
  if (!error_) PyErr_Clear();  // no memory: Restore() says so
  PyObject *s = v != nullptr ? PyObject_Str(v) : nullptr;
  const char *u = s != nullptr ? PyUnicode_AsUTF8(s) : nullptr;
  what_ = u != nullptr ? u : "Python error";
  Py_XDECREF(s);
  Py_XDECREF(t);
  Py_XDECREF(v);
  Py_XDECREF(tb);
  PyErr_Clear();  // from a failed str() or tuple; the error itself is held above
}

OB_CORE_FN void PythonError::Restore() const {
  if (!error_) {  // the tuple could not be made (no memory)
    PyErr_SetString(PyExc_MemoryError, what_.c_str());
    return;
  }
  PyObject *t = PyTuple_GET_ITEM(error_.get(), 0);
  PyObject *v = PyTuple_GET_ITEM(error_.get(), 1);
  PyObject *tb = PyTuple_GET_ITEM(error_.get(), 2);
  if (v == Py_None) v = nullptr;
  if (tb == Py_None) tb = nullptr;
  Py_XINCREF(t);
  Py_XINCREF(v);
  Py_XINCREF(tb);
  PyErr_Restore(t, v, tb);
}
#endif

// A new reference, or PythonError if the call that made it failed.
inline PyObject *Check(PyObject *o) {
  if (o == nullptr) throw PythonError();
  return o;
}
inline void Check(int rc) {
  if (rc < 0) throw PythonError();
}

// Sets the Python error for one of the exceptions above (call inside a catch);
// false for any other exception, which the binding library maps itself.
OB_CORE_FN bool SetNeutralError(const std::exception_ptr &p) OB_CORE_DECL
#if OB_CORE_BODIES
{
  try {
    std::rethrow_exception(p);
  } catch (const PythonError &e) {
    e.Restore();
  } catch (const TypeError &e) {
    PyErr_SetString(PyExc_TypeError, e.what());
  } catch (const ValueError &e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (...) {
    return false;
  }
  return true;
}
#endif

}  // namespace detail
}  // namespace opbuilder

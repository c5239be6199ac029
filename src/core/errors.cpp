// The core library's bodies of the functions opbuilder/detail/errors.h declares with OB_CORE_FN.
// Compiled once into libobcore (core_lib.cpp), or, in a build without the core library,
// inline in each operator: opbuilder/detail/errors.h includes this file at its end (detail/core_lib.h).
#include "opbuilder/detail/errors.h"

namespace opbuilder {

namespace detail OB_HIDDEN {

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

OB_CORE_FN bool SetNeutralError(const std::exception_ptr &p) {
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

OB_CORE_FN void ThrowPythonError() { throw PythonError(); }

OB_CORE_FN void TranslateNeutral(const std::exception_ptr &p, void *) {
  if (SetNeutralError(p)) return;
  try {
    std::rethrow_exception(p);
  } catch (const std::exception &) {
    throw;  // the binding library's own mapping, and translators registered before this one
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "Caught an unknown exception!");
  }
}

}  // namespace detail
}  // namespace opbuilder

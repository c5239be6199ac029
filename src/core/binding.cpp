// The core library's bodies of the functions opbuilder/detail/binding.h declares with OB_CORE_FN.
// Compiled once into libobcore (core_lib.cpp), or, in a build without the core library,
// inline in each operator: opbuilder/detail/binding.h includes this file at its end (detail/core_lib.h).
#include "opbuilder/detail/binding.h"

#include <string>

namespace opbuilder {

namespace detail OB_HIDDEN {

OB_CORE_FN void CheckReadAs(PyObject *o, ReadKind want, const char *what) {
  const bool is_bool = PyBool_Check(o);
  const bool is_int = !is_bool && (PyLong_Check(o) || (PyIndex_Check(o) && !PyFloat_Check(o)));  // numpy's too
  bool fits = false;
  const char *as = "";
  switch (want) {
    case ReadKind::kBool: fits = is_bool, as = "bool"; break;
    case ReadKind::kInteger: fits = is_int, as = "an integer type"; break;
    case ReadKind::kFloating: fits = is_int || PyFloat_Check(o), as = "a floating type"; break;
    case ReadKind::kString: fits = PyUnicode_Check(o), as = "std::string"; break;
  }
  if (fits) return;
  throw TypeError(std::string(what) + ": a stored " + TypeNameOf(o) + " cannot be read as " + as +
                  " (a bool reads back as bool, an int as an integer or floating type, a float as a floating "
                  "type, a str as std::string)");
}

OB_CORE_FN void SetStdError() {
  try {
    throw;
  } catch (const std::bad_alloc &e) {
    PyErr_SetString(PyExc_MemoryError, e.what());
  } catch (const std::out_of_range &e) {
    PyErr_SetString(PyExc_IndexError, e.what());
  } catch (const std::overflow_error &e) {
    PyErr_SetString(PyExc_OverflowError, e.what());
  } catch (const std::domain_error &e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::invalid_argument &e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::length_error &e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::range_error &e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::exception &e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "unknown C++ exception (not a std::exception)");
  }
}

OB_CORE_FN void SetNeutralOrStdError() {
  if (!SetNeutralError(std::current_exception())) SetStdError();
}

}  // namespace detail
}  // namespace opbuilder

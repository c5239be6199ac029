// The core library's bodies of the functions opbuilder/detail/binding.h declares with OB_CORE_FN.
// Compiled once into libobcore (core_lib.cpp), or, in a build without the core library,
// inline in each operator: opbuilder/detail/binding.h includes this file at its end (detail/core_lib.h).
#include "opbuilder/detail/binding.h"

namespace opbuilder {

namespace detail OB_HIDDEN {

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

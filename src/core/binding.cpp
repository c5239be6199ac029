// The core library's bodies of the functions opbuilder/detail/binding.h declares with OB_CORE_FN.
// Compiled once into libobcore (core_lib.cpp), or, in a build without the core library,
// inline in each operator: opbuilder/detail/binding.h includes this file at its end (detail/core_lib.h).
#include "opbuilder/detail/binding.h"

#include <string>

namespace opbuilder {

namespace detail OB_HIDDEN {

namespace {

const char kReadRule[] = " (a bool reads back as bool, an int as an integer or floating type, a float as a floating "
                         "type, a str as std::string)";

bool IsBoolish(PyObject *o) {  // Python's bool or numpy's (numpy.bool, or bool_ before numpy 2)
  if (PyBool_Check(o)) return true;
  const std::string name = TypeNameOf(o);
  return name == "bool" || name == "bool_" || name == "numpy.bool" || name == "numpy.bool_";
}

std::string ReprOf(PyObject *o) {
  PyObject *r = PyObject_Repr(o);
  const char *u = r != nullptr ? PyUnicode_AsUTF8AndSize(r, nullptr) : nullptr;
  std::string out = u != nullptr ? u : "?";
  Py_XDECREF(r);
  if (u == nullptr) PyErr_Clear();
  return out;
}

// Does the int `o` fit a `bits`-bit integer of that signedness?
bool FitsInteger(PyObject *o, int bits, bool is_signed) {
  PyObject *idx = PyNumber_Index(o);
  if (idx == nullptr) {
    PyErr_Clear();
    return false;
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(idx, &overflow);
  bool fits = false;
  if (overflow == 0 && !(v == -1 && PyErr_Occurred())) {
    if (is_signed) {
      fits = bits >= 64 || (v >= -(1LL << (bits - 1)) && v < (1LL << (bits - 1)));
    } else {
      fits = v >= 0 && (bits >= 64 || static_cast<unsigned long long>(v) < (1ULL << bits));
    }
  } else if (overflow > 0 && !is_signed && bits >= 64) {
    (void)PyLong_AsUnsignedLongLong(idx);
    fits = PyErr_Occurred() == nullptr;
  }
  PyErr_Clear();
  Py_DECREF(idx);
  return fits;
}

}  // namespace

OB_CORE_FN void CheckReadAs(PyObject *o, ReadKind want, const char *what, int bits, bool is_signed) {
  const bool is_bool = IsBoolish(o);
  // a number, not an array or a tensor of one (those have a length, even 0-d ones, and may be bools)
  const bool scalar = PyLong_Check(o) || PyFloat_Check(o) || !PyObject_HasAttrString(o, "__len__");
  const bool is_int = !is_bool && (PyLong_Check(o) || (scalar && PyIndex_Check(o) && !PyFloat_Check(o)));
  bool fits = false;
  const char *as = "";
  switch (want) {
    case ReadKind::kBool: fits = is_bool, as = "bool"; break;
    case ReadKind::kInteger: fits = is_int, as = "an integer type"; break;
    case ReadKind::kFloating:  // numpy's floats too (float32 is no Python float)
      fits = !is_bool && (is_int || PyFloat_Check(o) ||
                          (scalar && !PyUnicode_Check(o) && PyObject_HasAttrString(o, "__float__")));
      as = "a floating type";
      break;
    case ReadKind::kString: fits = PyUnicode_Check(o), as = "std::string"; break;
  }
  if (!fits) {
    throw TypeError(std::string(what) + ": a stored " + TypeNameOf(o) + " cannot be read as " + as + kReadRule);
  }
  if (want == ReadKind::kInteger && !FitsInteger(o, bits, is_signed)) {
    throw TypeError(std::string(what) + ": a stored int, " + ReprOf(o) + ", does not fit the " +
                    (is_signed ? "signed" : "unsigned") + " integer type of " + std::to_string(bits) + " bits read");
  }
}

OB_CORE_FN void ThrowReadAs(PyObject *o, const char *what) {
  throw TypeError(std::string(what) + ": a stored " + TypeNameOf(o) + " cannot be read as the type asked for" +
                  kReadRule);
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

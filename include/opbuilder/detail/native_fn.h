// Native code's way to the runtime's Python functions (runtime/_native.py owns what it exports).
#pragma once

#include "opbuilder/detail/visibility.h"

#include <Python.h>

#include <atomic>

#include "opbuilder/detail/errors.h"
#include "opbuilder/detail/pyref.h"

namespace opbuilder {
namespace detail OB_HIDDEN {

// A module's attribute (new reference).
inline PyObject *ImportAttr(const char *module, const char *name) {
  PyRef m = PyRef::Steal(Check(PyImport_ImportModule(module)));
  return Check(PyObject_GetAttrString(m.get(), name));
}

// A function of runtime._native, loaded once into `slot` and kept (borrowed): native code calls
// these per op, and an import per call costs about a microsecond.
inline PyObject *NativeFn(std::atomic<PyObject *> &slot, const char *name) {
  PyObject *f = slot.load(std::memory_order_acquire);
  if (f != nullptr) return f;
  f = ImportAttr("runtime._native", name);
  PyObject *expected = nullptr;
  if (slot.compare_exchange_strong(expected, f, std::memory_order_acq_rel)) return f;
  Py_DECREF(f);
  return expected;
}

}  // namespace detail
}  // namespace opbuilder

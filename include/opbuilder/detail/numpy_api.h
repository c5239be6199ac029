// The few numpy C API entries the bridge uses, found through numpy's
// _ARRAY_API capsule (what numpy's own import_array() reads), so no binding
// library and no numpy headers are needed at compile time.
#pragma once

#include <Python.h>

#include "opbuilder/detail/errors.h"
#include "opbuilder/detail/visibility.h"

namespace opbuilder {
namespace detail OB_HIDDEN {

// numpy's type numbers and array flags (stable across numpy 1.x and 2.x).
enum NpyType : int {
  kNpyBool = 0, kNpyByte = 1, kNpyUByte = 2, kNpyShort = 3, kNpyUShort = 4, kNpyInt = 5, kNpyUInt = 6,
  kNpyLong = 7, kNpyULong = 8, kNpyLongLong = 9, kNpyULongLong = 10, kNpyFloat = 11, kNpyDouble = 12,
  kNpyCFloat = 14, kNpyCDouble = 15, kNpyHalf = 23,
  kNpyUserDef = 256  // the first number of a dtype registered at run time (ml_dtypes' bfloat16)
};
constexpr int kNpyCContiguous = 0x0001;
constexpr int kNpyAligned = 0x0100;
constexpr int kNpyWriteable = 0x0400;

// The leading fields of PyArrayObject and PyArray_Descr (the same in numpy 1 and 2).
struct NpyArray {
  PyObject_HEAD
  char *data;
  int nd;
  Py_ssize_t *dimensions;
  Py_ssize_t *strides;
  PyObject *base;
  PyObject *descr;
  int flags;
};
struct NpyDescr {
  PyObject_HEAD
  PyObject *typeobj;
  char kind;
  char type;
  char byteorder;
  char former_flags;
  int type_num;
};

inline NpyArray *ArrayFields(PyObject *a) { return reinterpret_cast<NpyArray *>(a); }
inline NpyDescr *DescrFields(PyObject *d) { return reinterpret_cast<NpyDescr *>(d); }

struct NumpyApi {
  PyTypeObject *array_type = nullptr;
  PyObject *(*DescrFromType)(int) = nullptr;
  PyObject *(*NewCopy)(PyObject *, int) = nullptr;
  PyObject *(*NewFromDescr)(PyTypeObject *, PyObject *, int, Py_intptr_t const *, Py_intptr_t const *, void *, int,
                            PyObject *) = nullptr;

  bool IsArray(PyObject *o) const { return PyObject_TypeCheck(o, array_type) != 0; }

  static NumpyApi Load() {
    PyObject *m = PyImport_ImportModule("numpy._core.multiarray");  // numpy 2
    if (m == nullptr) {
      PyErr_Clear();
      m = Check(PyImport_ImportModule("numpy.core.multiarray"));
    }
    PyRef mod = PyRef::Steal(m);
    PyRef cap = PyRef::Steal(Check(PyObject_GetAttrString(mod.get(), "_ARRAY_API")));
    void **table = static_cast<void **>(PyCapsule_GetPointer(cap.get(), nullptr));
    if (table == nullptr) throw PythonError();
    NumpyApi api;
    api.array_type = static_cast<PyTypeObject *>(table[2]);
    api.DescrFromType = reinterpret_cast<decltype(api.DescrFromType)>(table[45]);
    api.NewCopy = reinterpret_cast<decltype(api.NewCopy)>(table[85]);
    api.NewFromDescr = reinterpret_cast<decltype(api.NewFromDescr)>(table[94]);
    return api;  // the table lives as long as numpy, which is never unloaded
  }
};

}  // namespace detail
}  // namespace opbuilder

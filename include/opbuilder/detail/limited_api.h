// What opbuilder's headers and core library need of Python's C API that the limited API (Py_LIMITED_API,
// the stable ABI: one binary for Python 3.12, 3.13 and later) leaves out, in limited-API terms.
//
// Only when Py_LIMITED_API is defined (opbuilder builds nanobind operators, nanobind's runtime and the
// core library that way on Python >= 3.12). Without it nothing here is defined and every call site uses
// the full API's macros and struct fields, exactly as before: the 3.11 build pays nothing.
#pragma once

#include <Python.h>
#if !defined(Py_LIMITED_API)
#include <structmember.h>  // PyMemberDef, T_OBJECT_EX (ObjectSlotOffset)
#endif

#include <string>
#include <vector>

#if defined(Py_LIMITED_API)
// the list and tuple accessors that the full API has as macros over the object's fields
#ifndef PyTuple_GET_SIZE
#define PyTuple_GET_SIZE(o) PyTuple_Size(o)
#define PyTuple_GET_ITEM(o, i) PyTuple_GetItem((o), (i))
#define PyTuple_SET_ITEM(o, i, v) ((void)PyTuple_SetItem((o), (i), (v)))  // a new tuple: cannot fail
#endif
#ifndef PyList_GET_SIZE
#define PyList_GET_SIZE(o) PyList_Size(o)
#define PyList_GET_ITEM(o, i) PyList_GetItem((o), (i))
#define PyList_SET_ITEM(o, i, v) ((void)PyList_SetItem((o), (i), (v)))  // a new list: cannot fail
#endif
#ifndef PySequence_Fast_GET_SIZE
#define PySequence_Fast_GET_SIZE(o) PySequence_Size(o)
#define PySequence_Fast_GET_ITEM(o, i) PySequence_GetItem_Borrowed((o), (i))
#endif
#ifndef PyUnicode_AsUTF8
#define PyUnicode_AsUTF8(o) PyUnicode_AsUTF8AndSize((o), nullptr)
#endif
#ifndef PyObject_CallOneArg
#define PyObject_CallOneArg(f, a) ::opbuilder::detail::LimitedCallOneArg((f), (a))
#endif
#ifndef Py_TRASHCAN_BEGIN  // deep-recursion guard of deallocators: not in the limited API, left out
#define Py_TRASHCAN_BEGIN(o, fn) {
#define Py_TRASHCAN_END }
#endif

// PySequence_Fast's result is a list or a tuple: its item, borrowed (what PySequence_Fast_GET_ITEM gives)
inline PyObject *PySequence_GetItem_Borrowed(PyObject *seq, Py_ssize_t i) {
  return PyList_Check(seq) ? PyList_GetItem(seq, i) : PyTuple_GetItem(seq, i);
}
#endif

namespace opbuilder {
namespace detail {

#if defined(Py_LIMITED_API)
inline PyObject *LimitedCallOneArg(PyObject *f, PyObject *a) {
  PyObject *args[2] = {nullptr, a};
  return PyObject_Vectorcall(f, args + 1, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
}
#endif

// The items of PySequence_Fast's result (a list or a tuple), borrowed: its item array under the full
// API, a copy of the pointers under the limited one (which has no item array).
class FastItems {
 public:
  explicit FastItems(PyObject *seq) {
#if defined(Py_LIMITED_API)
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    copy_.reserve(static_cast<std::size_t>(n > 0 ? n : 0));
    for (Py_ssize_t i = 0; i < n; ++i) copy_.push_back(PySequence_GetItem_Borrowed(seq, i));
    items_ = copy_.data();
#else
    items_ = PySequence_Fast_ITEMS(seq);
#endif
  }
  PyObject *operator[](Py_ssize_t i) const { return items_[i]; }
  PyObject *const *data() const { return items_; }

 private:
  PyObject **items_ = nullptr;
#if defined(Py_LIMITED_API)
  std::vector<PyObject *> copy_;
#endif
};

// The name of `o`'s type, for messages.
inline std::string TypeNameOf(PyObject *o) {
#if defined(Py_LIMITED_API)
  PyObject *name = PyType_GetName(Py_TYPE(o));
  const char *s = name != nullptr ? PyUnicode_AsUTF8AndSize(name, nullptr) : nullptr;
  std::string out = s != nullptr ? s : "object";
  Py_XDECREF(name);
  if (s == nullptr) PyErr_Clear();
  return out;
#else
  return Py_TYPE(o)->tp_name;
#endif
}

// A new instance of `type` made by its tp_new (no __init__), `args` its arguments.
inline PyObject *NewByTpNew(PyTypeObject *type, PyObject *args) {
#if defined(Py_LIMITED_API)
  auto tp_new = reinterpret_cast<newfunc>(PyType_GetSlot(type, Py_tp_new));
  return tp_new(type, args, nullptr);
#else
  return type->tp_new(type, args, nullptr);
#endif
}

// Free `o` with its type's tp_free (the end of a deallocator).
inline void FreeByTpFree(PyTypeObject *type, PyObject *o) {
#if defined(Py_LIMITED_API)
  reinterpret_cast<freefunc>(PyType_GetSlot(type, Py_tp_free))(o);
#else
  type->tp_free(o);
#endif
}

// The byte offset of the object slot `name` of class `type` (a `__slots__` entry); 0 if it is none or
// cannot be found. Under the full API it is read from the slot's member descriptor. The limited API
// has no descriptor struct: an instance is made with tp_new, `name` is set to a new object, and the
// instance's words (up to the class's __basicsize__) are searched for it, twice with two objects, so
// that only the slot's offset can match.
inline Py_ssize_t ObjectSlotOffset(PyTypeObject *type, const char *name, PyObject *empty_args) {
#if defined(Py_LIMITED_API)
  PyObject *size_obj = PyObject_GetAttrString(reinterpret_cast<PyObject *>(type), "__basicsize__");
  const Py_ssize_t size = size_obj != nullptr ? PyLong_AsSsize_t(size_obj) : -1;
  Py_XDECREF(size_obj);
  PyObject *obj = size > 0 ? NewByTpNew(type, empty_args) : nullptr;
  Py_ssize_t found = 0;
  for (int round = 0; obj != nullptr && round < 2; ++round) {
    PyObject *mark = PyList_New(0);  // a new object: its address appears nowhere else in `obj`
    if (mark == nullptr || PyObject_SetAttrString(obj, name, mark) < 0) {
      Py_XDECREF(mark);
      found = 0;
      break;
    }
    Py_ssize_t here = 0;
    for (Py_ssize_t off = static_cast<Py_ssize_t>(sizeof(PyObject)); off + static_cast<Py_ssize_t>(sizeof(void *)) <= size;
         off += static_cast<Py_ssize_t>(sizeof(void *))) {
      if (*reinterpret_cast<PyObject **>(reinterpret_cast<char *>(obj) + off) == mark) {
        here = here == 0 ? off : -1;  // -1: more than one word matches
      }
    }
    Py_DECREF(mark);
    if (here <= 0 || (round == 1 && here != found)) {
      found = 0;
      break;
    }
    found = here;
  }
  Py_XDECREF(obj);
  if (PyErr_Occurred()) PyErr_Clear();
  return found;
#else
  (void)empty_args;
  PyObject *d = PyDict_GetItemString(type->tp_dict, name);  // borrowed
  if (d != nullptr && Py_IS_TYPE(d, &PyMemberDescr_Type)) {
    const PyMemberDef *m = reinterpret_cast<PyMemberDescrObject *>(d)->d_member;
    if (m->type == T_OBJECT_EX && m->offset > 0) return m->offset;
  }
  return 0;
#endif
}

}  // namespace detail
}  // namespace opbuilder

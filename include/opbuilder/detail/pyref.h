// An owned reference to a Python object that may be dropped on any thread.
//
// Tensors made from Python data keep the Python owner alive. C++ code may
// copy or drop such tensors with the GIL released (inside
// gil_scoped_release), so every reference-count change here takes the GIL
// when the calling thread does not hold it.
#pragma once

#include <Python.h>

#include "opbuilder/detail/limited_api.h"

namespace opbuilder {
namespace detail {  // default visibility: Tensor (user-visible) holds a PyRef

class GilForRefcount {
 public:
#if defined(Py_LIMITED_API)  // no PyGILState_Check: Ensure and Release nest
  GilForRefcount() : held_(false) { state_ = PyGILState_Ensure(); }
#else
  GilForRefcount() : held_(PyGILState_Check() != 0) {
    if (!held_) state_ = PyGILState_Ensure();
  }
#endif
  ~GilForRefcount() {
    if (!held_) PyGILState_Release(state_);
  }
  GilForRefcount(const GilForRefcount &) = delete;
  GilForRefcount &operator=(const GilForRefcount &) = delete;

 private:
  bool held_;
  PyGILState_STATE state_{};
};

inline void IncRefAnyThread(PyObject *o) {
  if (o == nullptr) return;
  GilForRefcount gil;
  Py_INCREF(o);
}

inline void DecRefAnyThread(PyObject *o) {
  if (o == nullptr || !Py_IsInitialized()) return;  // at exit: leak rather than crash
  GilForRefcount gil;
  Py_DECREF(o);
}

class PyRef {
 public:
  PyRef() = default;
  static PyRef Steal(PyObject *o) { PyRef r; r.p_ = o; return r; }
  static PyRef Borrow(PyObject *o) { IncRefAnyThread(o); return Steal(o); }

  PyRef(const PyRef &other) : p_(other.p_) { IncRefAnyThread(p_); }
  PyRef(PyRef &&other) noexcept : p_(other.p_) { other.p_ = nullptr; }
  PyRef &operator=(PyRef other) noexcept {
    PyObject *t = p_;
    p_ = other.p_;
    other.p_ = t;
    return *this;
  }
  ~PyRef() { DecRefAnyThread(p_); }

  PyObject *get() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }
  // Hands the reference to the caller.
  PyObject *release() { PyObject *o = p_; p_ = nullptr; return o; }

 private:
  PyObject *p_ = nullptr;
};

// Deleter of storage owned by a Python object (a numpy array): drops the
// owner's reference, taking the GIL if needed. Also lets the runtime find the
// owner again (std::get_deleter), to hand the same buffer back to numpy.
struct PyOwnerDeleter {
  PyObject *owner;
  void operator()(void *) const { DecRefAnyThread(owner); }
};

}  // namespace detail
}  // namespace opbuilder

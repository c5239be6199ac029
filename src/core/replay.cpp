// The core library's bodies of the functions opbuilder/detail/replay.h declares with OB_CORE_FN.
// Compiled once into libobcore (core_lib.cpp), or, in a build without the core library,
// inline in each operator: opbuilder/detail/replay.h includes this file at its end (detail/core_lib.h).
#include "opbuilder/detail/replay.h"

namespace opbuilder {

namespace detail OB_HIDDEN {

OB_CORE_FN PyObject *ReplayCall(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  const auto *target = static_cast<const ReplayTarget *>(PyCapsule_GetPointer(self, "opbuilder.replay"));
  if (target == nullptr) return nullptr;
  if (nargs != target->nargs) {
    PyErr_Format(PyExc_TypeError, "replay of a traced C++ Function takes %zd arguments (%zd given)", target->nargs,
                 nargs);
    return nullptr;
  }
  return target->fn(args, nargs);
}

OB_CORE_FN PyObject *TraceCall(PyObject *hook, PyObject *name, const ReplayTarget &target, PyObject *args) {
  static PyMethodDef def = {"replay", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(ReplayCall)),
                            METH_FASTCALL, "the traced C++ Function call on new arguments"};
  PyRef self = PyRef::Steal(
      Check(PyCapsule_New(const_cast<ReplayTarget *>(&target), "opbuilder.replay", nullptr)));
  PyRef replay = PyRef::Steal(Check(PyCFunction_New(&def, self.get())));
  return Check(PyObject_CallFunctionObjArgs(hook, name, replay.get(), args, nullptr));
}

OB_CORE_FN TensorPtr ReplayTensor(PyObject *o) {
  if (o == Py_None) return nullptr;  // a null TensorPtr crossed as None (TensorToObject), and back
  TensorPtr t = TensorFromObject(o);
  if (!t) {
    throw TypeError(std::string("replay of a traced C++ Function: expected a tensor, got ") + TypeNameOf(o));
  }
  return t;
}

OB_CORE_FN TensorPtrList ReplayTensorList(PyObject *o) {
  PyRef seq = PyRef::Steal(Check(PySequence_Fast(o, "replay of a traced C++ Function: expected a list of tensors")));
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.get());
  TensorPtrList out;
  out.reserve(static_cast<std::size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) out.push_back(ReplayTensor(PySequence_Fast_GET_ITEM(seq.get(), i)));
  return out;
}

OB_CORE_FN PyObject *TensorListToObject(const TensorPtrList &ts) {
  PyRef list = PyRef::Steal(Check(PyList_New(static_cast<Py_ssize_t>(ts.size()))));
  for (std::size_t i = 0; i < ts.size(); ++i) {
    PyList_SET_ITEM(list.get(), static_cast<Py_ssize_t>(i), TensorToObject(ts[i]));
  }
  return list.release();
}

}  // namespace detail
}  // namespace opbuilder

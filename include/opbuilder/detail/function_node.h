// The graph node that Function<T>::Apply records (not for operator authors).
//
// It follows the node protocol of runtime/autograd/node.py: `next_edges`,
// `input_meta`, `out_meta`, `name`, `materialize_grads`, `strict`,
// `differentiable`, `apply(grads, create_graph)`, `release()`. It is a plain
// CPython type rather than a pybind11 class because the engine reads these
// attributes on every backward: member and getset descriptors cost a few
// nanoseconds where pybind11's property dispatch costs a few hundred.
// `input_meta`/`out_meta` are built on first use, so recording stays cheap.
// The type is garbage-collected: a cycle through `saved_data` (a value that
// refers to an output) is collected like any Python cycle.
#pragma once

#include "opbuilder/detail/visibility.h"

#include <Python.h>

#include "opbuilder/detail/limited_api.h"

#include <atomic>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <structmember.h>

#include "opbuilder/detail/binding.h"
#include "opbuilder/detail/errors.h"
#include "opbuilder/detail/runtime_bridge.h"
#include "opbuilder/tensor.h"

namespace opbuilder {

class AutogradContext;

namespace detail OB_HIDDEN {

struct TensorMeta {
  bool is_tensor = false;
  ShapeVector shape;
  DataType dtype = kFloat32;
};

inline TensorMeta MetaOf(const Tensor *t) {
  TensorMeta m;
  if (t != nullptr) {
    m.is_tensor = true;
    m.shape = t->shape();
    m.dtype = t->dtype();
  }
  return m;
}

using BackwardFn = TensorPtrList (*)(AutogradContext *, TensorPtrList);

// What the node needs of AutogradContext; defined in detail/function_details.h, which autograd.h
// includes after the class (ContextDeleter's call operator: src/core/autograd.cpp).
struct ContextDeleter {
  OB_CORE_FN void operator()(AutogradContext *ctx) const;
};
bool ContextMaterializeGrads(const AutogradContext &ctx);
void ContextRelease(AutogradContext &ctx);
int ContextVisit(AutogradContext &ctx, visitproc visit, void *arg);
void ContextClear(AutogradContext &ctx);

// What the node keeps on the C++ side.
struct NodeState {
  std::unique_ptr<AutogradContext, ContextDeleter> ctx;
  BackwardFn backward = nullptr;
  ErrorFn set_error = SetNeutralOrStdError;  // the binding layer's mapping of Backward's exceptions
  std::vector<TensorMeta> in_meta;
  std::vector<TensorMeta> out_meta;
};

struct NodeObject {
  PyObject_HEAD
  PyObject *next_edges;  // tuple, one entry per Forward argument
  PyObject *name;        // str
  PyObject *in_meta;     // tuple, built on first use (nullptr until then)
  PyObject *out_meta;
  NodeState *state;
};

inline PyObject *MetasToPython(const Runtime &rt, const std::vector<TensorMeta> &ms) {
  PyRef t = PyRef::Steal(Check(PyTuple_New(static_cast<Py_ssize_t>(ms.size()))));
  for (std::size_t i = 0; i < ms.size(); ++i) {
    const TensorMeta &m = ms[i];
    PyObject *item = Py_None;
    if (!m.is_tensor) {
      Py_INCREF(item);
    } else {
      PyRef shape = PyRef::Steal(Check(PyTuple_New(static_cast<Py_ssize_t>(m.shape.size()))));
      for (std::size_t d = 0; d < m.shape.size(); ++d) {
        PyTuple_SET_ITEM(shape.get(), static_cast<Py_ssize_t>(d), Check(PyLong_FromLongLong(m.shape[d])));
      }
      item = Check(PyTuple_Pack(2, shape.get(), DescrOf(rt, m.dtype)));
    }
    PyTuple_SET_ITEM(t.get(), static_cast<Py_ssize_t>(i), item);
  }
  return t.release();
}

// The cached metadata tuple, built on first use (new reference).
inline PyObject *CachedMeta(PyObject **cache, const std::vector<TensorMeta> &ms) {
  if (*cache == nullptr) {
    try {
      *cache = MetasToPython(Runtime::Get(), ms);
    } catch (...) {
      SetNeutralOrStdError();
      return nullptr;
    }
  }
  Py_INCREF(*cache);
  return *cache;
}

inline PyObject *NodeInputMeta(PyObject *o, void *) {
  auto *self = reinterpret_cast<NodeObject *>(o);
  return CachedMeta(&self->in_meta, self->state->in_meta);
}

inline PyObject *NodeOutMeta(PyObject *o, void *) {
  auto *self = reinterpret_cast<NodeObject *>(o);
  return CachedMeta(&self->out_meta, self->state->out_meta);
}

inline PyObject *NodeMaterialize(PyObject *o, void *) {
  return PyBool_FromLong(ContextMaterializeGrads(*reinterpret_cast<NodeObject *>(o)->state->ctx));
}

// ---- every gradient handed to the user owns its memory (runtime/autograd/ownership.py) ----
// A gradient Backward made and holds nowhere else (in saved_data, a static, ...) goes out
// as it is; so does one over an incoming gradient's memory (the engine compares those);
// anything else (a saved or input tensor, say) goes out as a copy.

// Nothing but `r` refers to its tensor or memory: the list Backward returned holds the only
// reference, and the storage is C++'s own (or a Python block nothing else refers to).
inline bool FreshGradient(const Runtime &rt, const TensorPtr &r) {
  if (r.use_count() != 1 || r->py_object() != nullptr || r->storage().use_count() > 1) return false;
  if (auto *del = std::get_deleter<PyOwnerDeleter>(r->storage())) {
    PyObject *owner = del->owner;
    if (Py_REFCNT(owner) != 1) return false;
    return !rt.api->IsArray(owner) || ArrayFields(owner)->base == nullptr;
  }
  return true;
}

// `r` is one of the incoming gradients `grads[0..n)` (runtime.Tensors or None), or a view of one.
inline bool OverIncoming(const Runtime &rt, const Tensor &r, PyObject *const *grads, Py_ssize_t n) {
  auto *del = std::get_deleter<PyOwnerDeleter>(r.storage());
  for (Py_ssize_t k = 0; k < n; ++k) {
    if (grads[k] == Py_None) continue;
    if (r.py_object() == grads[k]) return true;
    if (del != nullptr) {
      PyRef data = PyRef::Steal(DataOf(rt, grads[k]));
      if (data.get() == del->owner) return true;
    }
  }
  return false;
}

// A new runtime.Tensor with `r`'s values in memory of its own (new reference).
inline PyObject *PrivateGradient(const Runtime &rt, const TensorPtr &r) {
  if (!r->is_cuda()) return ToPython(rt, r->contiguous_copy());
  PyRef t = PyRef::Steal(Check(ToPython(rt, r)));
  PyRef data = PyRef::Steal(DataOf(rt, t.get()));
  PyRef copy = PyRef::Steal(Check(PyObject_CallMethod(data.get(), "copy", nullptr)));
  return NewPyTensor(rt, copy.get());
}

// apply(grads, create_graph): output gradients (runtime.Tensor or None) in,
// one gradient per Forward argument out. A gradient for a non-tensor argument
// is refused here (only the node knows which arguments were tensors); count,
// shape and dtype are the engine's to check.
inline PyObject *NodeApply(PyObject *o, PyObject *const *args, Py_ssize_t nargs) {
  auto *self = reinterpret_cast<NodeObject *>(o);
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "apply(grads, create_graph) takes two arguments");
    return nullptr;
  }
  try {
    const Runtime &rt = Runtime::Get();
    PyRef seq = PyRef::Steal(Check(PySequence_Fast(args[0], "apply: grads must be a sequence")));
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.get());
    const FastItems items(seq.get());
    TensorPtrList grads;
    grads.reserve(static_cast<std::size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
      grads.push_back(items[i] == Py_None ? nullptr : TensorFromPy(rt, items[i]));
    }
    NodeState *s = self->state;
    TensorPtrList res = s->backward(s->ctx.get(), std::move(grads));
    for (std::size_t i = 0; i < res.size() && i < s->in_meta.size(); ++i) {
      if (res[i] && !s->in_meta[i].is_tensor) {
        throw std::runtime_error("backward of " + std::string(PyUnicode_AsUTF8(self->name)) +
                                 " returned a gradient for argument " + std::to_string(i) + ", which is not a tensor");
      }
    }
    PyRef out = PyRef::Steal(Check(PyList_New(static_cast<Py_ssize_t>(res.size()))));
    for (std::size_t i = 0; i < res.size(); ++i) {
      PyObject *r = Py_None;
      if (!res[i]) {
        Py_INCREF(r);
      } else if (FreshGradient(rt, res[i]) || OverIncoming(rt, *res[i], items.data(), n)) {
        r = ToPython(rt, res[i]);
      } else {
        r = PrivateGradient(rt, res[i]);
      }
      PyList_SET_ITEM(out.get(), static_cast<Py_ssize_t>(i), r);
    }
    return out.release();
  } catch (...) {
    self->state->set_error();
    return nullptr;
  }
}

inline PyObject *NodeRelease(PyObject *o, PyObject *) {
  NodeState *s = reinterpret_cast<NodeObject *>(o)->state;
  try {
    ContextRelease(*s->ctx);
  } catch (...) {
    s->set_error();
    return nullptr;
  }
  Py_RETURN_NONE;
}

inline PyObject *NodeRepr(PyObject *o) {
  auto *self = reinterpret_cast<NodeObject *>(o);
  return PyUnicode_FromFormat("<C++ Function node %U>", self->name);
}

inline int NodeTraverse(PyObject *o, visitproc visit, void *arg) {
  auto *self = reinterpret_cast<NodeObject *>(o);
  Py_VISIT(Py_TYPE(o));
  Py_VISIT(self->next_edges);
  if (self->state != nullptr && self->state->ctx) return ContextVisit(*self->state->ctx, visit, arg);
  return 0;
}

inline int NodeClear(PyObject *o) {
  auto *self = reinterpret_cast<NodeObject *>(o);
  Py_CLEAR(self->next_edges);
  if (self->state != nullptr && self->state->ctx) ContextClear(*self->state->ctx);
  return 0;
}

inline void NodeDealloc(PyObject *o) {
  auto *self = reinterpret_cast<NodeObject *>(o);
  PyTypeObject *tp = Py_TYPE(o);
  PyObject_GC_UnTrack(o);
  Py_TRASHCAN_BEGIN(o, NodeDealloc)
  Py_CLEAR(self->next_edges);
  Py_CLEAR(self->name);
  Py_CLEAR(self->in_meta);
  Py_CLEAR(self->out_meta);
  delete self->state;
  self->state = nullptr;
  FreeByTpFree(tp, o);
  Py_DECREF(tp);
  Py_TRASHCAN_END
}

// The node type, created once per extension module (each module built from
// this header has its own, as pybind11's module_local classes do).
inline PyTypeObject *MakeNodeType() {
            static PyMemberDef members[] = {
                {const_cast<char *>("next_edges"), T_OBJECT, offsetof(NodeObject, next_edges), READONLY, nullptr},
                {const_cast<char *>("name"), T_OBJECT, offsetof(NodeObject, name), READONLY, nullptr},
                {nullptr, 0, 0, 0, nullptr}};
            static PyGetSetDef getset[] = {
                {const_cast<char *>("input_meta"), NodeInputMeta, nullptr, nullptr, nullptr},
                {const_cast<char *>("out_meta"), NodeOutMeta, nullptr, nullptr, nullptr},
                {const_cast<char *>("materialize_grads"), NodeMaterialize, nullptr, nullptr, nullptr},
                {nullptr, nullptr, nullptr, nullptr, nullptr}};
            static PyMethodDef methods[] = {
                {"apply", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(NodeApply)), METH_FASTCALL,
                 "apply(grads, create_graph) -> one gradient per Forward argument"},
                {"release", NodeRelease, METH_NOARGS, "drop what was saved for backward"},
                {nullptr, nullptr, 0, nullptr}};
            static PyType_Slot slots[] = {{Py_tp_dealloc, reinterpret_cast<void *>(NodeDealloc)},
                                          {Py_tp_traverse, reinterpret_cast<void *>(NodeTraverse)},
                                          {Py_tp_clear, reinterpret_cast<void *>(NodeClear)},
                                          {Py_tp_repr, reinterpret_cast<void *>(NodeRepr)},
                                          {Py_tp_members, members},
                                          {Py_tp_getset, getset},
                                          {Py_tp_methods, methods},
                                          {0, nullptr}};
            static PyType_Spec spec = {"opbuilder.CppFunctionNode", static_cast<int>(sizeof(NodeObject)), 0,
                                       Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, slots};
            PyRef type = PyRef::Steal(Check(PyType_FromSpec(&spec)));
            // a user-written backward: wrong dtypes are errors; C++ records no graph
            Check(PyObject_SetAttrString(type.get(), "strict", Py_True));
            Check(PyObject_SetAttrString(type.get(), "differentiable", Py_False));
            return reinterpret_cast<PyTypeObject *>(type.release());
}

// Made on first use under the GIL and kept for the life of the process.
inline PyTypeObject *NodeType() {
  static std::atomic<PyTypeObject *> stored{nullptr};
  PyTypeObject *t = stored.load(std::memory_order_acquire);
  if (t != nullptr) return t;
  t = MakeNodeType();
  PyTypeObject *expected = nullptr;
  if (stored.compare_exchange_strong(expected, t, std::memory_order_acq_rel)) return t;
  Py_DECREF(t);
  return expected;
}

// A new node object owning `state` (new reference).
inline PyObject *NewNode(NodeState *state, PyObject *edges, PyObject *name) {
  std::unique_ptr<NodeState> owned(state);
  auto *self = PyObject_GC_New(NodeObject, NodeType());  // takes a reference to the type
  if (self == nullptr) throw PythonError();
  Py_INCREF(edges);
  Py_INCREF(name);
  self->next_edges = edges;
  self->name = name;
  self->in_meta = nullptr;
  self->out_meta = nullptr;
  self->state = owned.release();
  PyObject_GC_Track(reinterpret_cast<PyObject *>(self));
  return reinterpret_cast<PyObject *>(self);
}

}  // namespace detail
}  // namespace opbuilder

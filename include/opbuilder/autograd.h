// Function<T>: a C++ operator with its own Forward and Backward, recorded as
// one node of the Python runtime's graph.
//
//   class CustomMul : public Function<CustomMul> {
//    public:
//     static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y);
//     static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList grad_outputs);
//   };
//   m.def("mul", [](const TensorPtr &x, const TensorPtr &y) { return CustomMul::Apply(x, y); });
//
// Apply works out which tensor arguments need grad (grad mode on, the
// argument requires grad), runs Forward with recording off and, when any
// does, records a node whose backward calls Backward. The node follows the
// protocol of runtime/autograd/node.py; the engine checks what Backward
// returns (count, shape, dtype) and names the Function in any error.
#pragma once

#include "opbuilder/detail/visibility.h"

#include <pybind11/pybind11.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <vector>

#if defined(__GNUG__)
#include <cxxabi.h>
#endif

#include "opbuilder/casters.h"
#include "opbuilder/detail/runtime_bridge.h"
#include "opbuilder/tensor.h"

namespace opbuilder {

namespace detail OB_HIDDEN {

// What Apply and the recorded node keep in a context (not for operator authors).
struct SavedSlot {
  TensorPtr tensor;
  PyRef version_source;  // the runtime.Tensor (for outputs: a weak reference)
  bool weak = false;
  std::int64_t version = 0;
};

struct ContextState {
  const std::string *name = nullptr;
  TensorPtrList inputs;  // one per Forward argument, nullptr for non-tensors
  std::vector<bool> needs;
  TensorPtrList saved_raw;
  std::vector<SavedSlot> saved;
  bool saved_final = false;
  bool released = false;
  TensorPtrList non_differentiable;
  TensorPtrList dirty;
  bool materialize_grads = true;

  bool IsDirty(const TensorPtr &t) const {
    for (const auto &d : dirty) if (d == t) return true;
    return false;
  }
  bool IsNonDifferentiable(const TensorPtr &t) const {
    for (const auto &d : non_differentiable) if (d == t) return true;
    return false;
  }
};

}  // namespace detail

class AutogradContext;
namespace detail OB_HIDDEN {
inline ContextState &State(AutogradContext &ctx);
}  // namespace detail

class OB_HIDDEN AutogradContext {
 public:
  AutogradContext() = default;
  AutogradContext(const AutogradContext &) = delete;
  AutogradContext &operator=(const AutogradContext &) = delete;

  // Keep tensors for Backward (replaces what was saved before; nullptr allowed).
  void SaveForBackward(const TensorPtrList &tensors) { st_.saved_raw = tensors; }

  // The saved tensors; an error if one was modified in place since it was saved.
  TensorPtrList GetSavedTensors() const;

  // Does this Forward argument (by identity) need a gradient?
  bool NeedGrad(const TensorPtr &tensor) const {
    for (std::size_t i = 0; i < st_.inputs.size(); ++i) {
      if (st_.inputs[i] && st_.inputs[i] == tensor) return st_.needs[i];
    }
    return false;
  }

  // Does Forward argument `i` (counting every argument after ctx) need a gradient?
  bool NeedsInputGrad(std::size_t i) const { return i < st_.needs.size() && st_.needs[i]; }

  // These outputs get no gradient and have requires_grad == False.
  void MarkNonDifferentiable(const TensorPtrList &outputs) {
    st_.non_differentiable.insert(st_.non_differentiable.end(), outputs.begin(), outputs.end());
  }

  // These inputs were modified in place (and are returned as outputs).
  void MarkDirty(const TensorPtrList &inputs) { st_.dirty.insert(st_.dirty.end(), inputs.begin(), inputs.end()); }

  // false: gradients of unused outputs arrive as nullptr instead of zeros.
  void SetMaterializeGrads(bool materialize) { st_.materialize_grads = materialize; }

  // Plain values for Backward: ctx->saved_data["k"] = py::cast(3); ...cast<int>().
  std::unordered_map<std::string, pybind11::object> saved_data;

  // The Function's class name, for messages.
  const std::string &function_name() const { return *st_.name; }

 private:
  friend detail::ContextState &detail::State(AutogradContext &ctx);
  detail::ContextState st_;
};

namespace detail OB_HIDDEN {

namespace py = pybind11;

inline ContextState &State(AutogradContext &ctx) { return ctx.st_; }

inline std::string Demangle(const char *name) {
#if defined(__GNUG__)
  int status = 0;
  char *s = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status == 0 && s != nullptr) {
    std::string out(s);
    std::free(s);
    return out;
  }
#endif
  return name;
}

template <typename T>
const std::string &FunctionName() {
  static const std::string name = Demangle(typeid(T).name());
  return name;
}

struct TensorMeta {
  bool is_tensor = false;
  ShapeVector shape;
  DataType dtype = kFloat32;
};

inline py::object MetaToPython(const Runtime &rt, const TensorMeta &m) {
  if (!m.is_tensor) return py::none();
  py::tuple shape(m.shape.size());
  for (std::size_t i = 0; i < m.shape.size(); ++i) shape[i] = py::int_(m.shape[i]);
  return py::make_tuple(shape, py::reinterpret_borrow<py::object>(rt.descr[m.dtype]));
}

using BackwardFn = TensorPtrList (*)(AutogradContext *, TensorPtrList);

// The recorded node: the engine calls apply(grads, create_graph).
struct FunctionNode {
  const std::string *name = nullptr;
  std::shared_ptr<AutogradContext> ctx;
  BackwardFn backward = nullptr;
  py::tuple next_edges;
  std::vector<TensorMeta> in_meta;
  std::vector<TensorMeta> out_meta;

  py::list apply(const py::list &grads, bool /*create_graph*/) {
    if (State(*ctx).released) {
      throw std::runtime_error("backward through " + *name +
                               " a second time: its saved tensors were freed after the first backward; "
                               "pass retain_graph=True the first time");
    }
    const auto &rt = Runtime::Get();
    TensorPtrList g;
    g.reserve(grads.size());
    for (const auto &item : grads) {
      g.push_back(item.is_none() ? nullptr : TensorFromPy(rt, item.ptr()));
    }
    TensorPtrList res = backward(ctx.get(), std::move(g));
    py::list out;
    for (const auto &r : res) {
      out.append(r ? Steal(ToPython(rt, r)) : py::none());
    }
    return out;
  }

  void release() {
    State(*ctx).released = true;
    State(*ctx).saved.clear();
    ctx->saved_data.clear();
  }

  py::tuple metas(const std::vector<TensorMeta> &ms) const {
    const auto &rt = Runtime::Get();
    py::tuple t(ms.size());
    for (std::size_t i = 0; i < ms.size(); ++i) t[i] = MetaToPython(rt, ms[i]);
    return t;
  }
};

// Registers the node class once per extension module (module_local: every
// extension built from this header has its own copy).
inline void EnsureNodeClass() {
  PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<py::object> storage;
  storage.call_once_and_store_result([]() {
    py::module_ scope = py::reinterpret_steal<py::module_>(PyModule_New("opbuilder_function_nodes"));
    py::class_<FunctionNode> cls(scope, "CppFunctionNode", py::module_local());
    cls.def_property_readonly("name", [](const FunctionNode &n) { return *n.name; })
        .def_readonly("next_edges", &FunctionNode::next_edges)
        .def_property_readonly("input_meta", [](const FunctionNode &n) { return n.metas(n.in_meta); })
        .def_property_readonly("out_meta", [](const FunctionNode &n) { return n.metas(n.out_meta); })
        .def_property_readonly("materialize_grads",
                               [](const FunctionNode &n) { return State(*n.ctx).materialize_grads; })
        .def_property_readonly("strict", [](const FunctionNode &) { return true; })
        .def_property_readonly("differentiable", [](const FunctionNode &) { return false; })
        .def("apply", &FunctionNode::apply)
        .def("release", &FunctionNode::release)
        .def("__repr__", [](const FunctionNode &n) { return "<C++ Function node " + *n.name + ">"; });
    return py::object(cls);
  });
}

inline TensorMeta MetaOf(const TensorPtr &t) {
  TensorMeta m;
  if (t) {
    m.is_tensor = true;
    m.shape = t->shape();
    m.dtype = t->dtype();
  }
  return m;
}

// A tensor sharing `t`'s memory but bound to no Python object.
inline TensorPtr Alias(const TensorPtr &t) { return std::make_shared<Tensor>(*t); }

template <typename A>
void CollectTensor(TensorPtrList &out, const A &arg) {
  if constexpr (std::is_same_v<std::decay_t<A>, TensorPtr>) {
    out.push_back(arg);
  } else {
    out.push_back(nullptr);
  }
}

inline int IndexOf(const TensorPtrList &list, const TensorPtr &t) {
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (list[i] && list[i] == t) return static_cast<int>(i);
  }
  return -1;
}

// Outputs without recording: bump dirty inputs' versions; alias returned inputs.
inline TensorPtr FinishOutputNoGrad(const Runtime &rt, AutogradContext &ctx, const TensorPtr &out,
                                    const std::string &name) {
  if (!out) throw std::runtime_error(name + "::Forward returned a null tensor");
  if (IndexOf(State(ctx).inputs, out) < 0) return out;
  if (State(ctx).IsDirty(out)) {
    if (PyObject *p = out->py_object()) BumpVersion(rt, p);
    return out;
  }
  return Alias(out);
}

template <typename R>
struct ApplyImpl {
  static R NoGrad(const Runtime &rt, AutogradContext &ctx, R out, const std::string &name);
  static R Record(const Runtime &rt, std::shared_ptr<AutogradContext> ctx, R out, py::tuple edges,
                  BackwardFn backward, const std::string &name);
};

inline TensorPtrList AsList(const TensorPtr &t) { return TensorPtrList{t}; }
inline TensorPtrList AsList(const TensorPtrList &l) { return l; }

inline py::object WeakRef(PyObject *o) { return Steal(PyWeakref_NewRef(o, nullptr)); }

// Records the node and turns Forward's outputs into runtime.Tensors that are its results.
inline TensorPtrList RecordOutputs(const Runtime &rt, std::shared_ptr<AutogradContext> ctx,
                                   const TensorPtrList &outs, py::tuple edges, BackwardFn backward,
                                   const std::string &name) {
  ContextState &c = State(*ctx);
  // Validate everything before changing any tensor's history.
  for (std::size_t j = 0; j < outs.size(); ++j) {
    if (!outs[j]) throw std::runtime_error(name + "::Forward returned a null tensor as output " + std::to_string(j));
    if (c.IsDirty(outs[j]) && IndexOf(c.inputs, outs[j]) >= 0) {
      PyObject *p = outs[j]->py_object();
      if (p != nullptr && outs[j]->requires_grad()) {
        py::object node = Steal(PyObject_GetAttr(p, rt.s_node));
        if (node.is_none()) {
          throw std::runtime_error(name + " modifies input " + std::to_string(IndexOf(c.inputs, outs[j])) +
                                   " in place (MarkDirty), but it is a leaf that requires grad; "
                                   "in-place changes of such leaves are not allowed");
        }
      }
    }
  }
  for (const auto &d : c.dirty) {
    if (IndexOf(c.inputs, d) < 0) throw std::runtime_error(name + ": MarkDirty was given a tensor that is not an input");
  }

  EnsureNodeClass();
  FunctionNode fn;
  fn.name = &name;
  fn.ctx = ctx;
  fn.backward = backward;
  fn.next_edges = std::move(edges);
  fn.in_meta.reserve(c.inputs.size());
  for (const auto &t : c.inputs) fn.in_meta.push_back(MetaOf(t));
  fn.out_meta.reserve(outs.size());
  for (const auto &t : outs) fn.out_meta.push_back(MetaOf(t));
  py::object node = py::cast(std::move(fn), py::return_value_policy::move);

  TensorPtrList result;
  result.reserve(outs.size());
  std::vector<PyObject *> out_objs;
  for (std::size_t j = 0; j < outs.size(); ++j) {
    TensorPtr o = outs[j];
    const bool is_input = IndexOf(c.inputs, o) >= 0;
    if (is_input && c.IsDirty(o) && o->py_object() != nullptr) {
      BumpVersion(rt, o->py_object());  // in place: this input becomes the output
    } else if (is_input || o->py_object() != nullptr) {
      o = Alias(o);
    }
    py::object obj = Steal(ToPython(rt, o));
    if (!c.IsNonDifferentiable(outs[j])) {
      py::object idx = Steal(PyLong_FromSize_t(j));
      if (PyObject_SetAttr(obj.ptr(), rt.s_node, node.ptr()) < 0 ||
          PyObject_SetAttr(obj.ptr(), rt.s_out_index, idx.ptr()) < 0 ||
          PyObject_SetAttr(obj.ptr(), rt.s_requires_grad, Py_True) < 0) {
        throw py::error_already_set();
      }
      o->set_requires_grad(true);
    }
    out_objs.push_back(obj.ptr());
    result.push_back(o);
  }

  // Saved tensors: outputs are held without their Python object (a weak
  // reference tracks their version), so the node does not keep itself alive.
  c.saved.clear();
  for (const auto &s : c.saved_raw) {
    SavedSlot slot;
    if (s) {
      int oj = IndexOf(outs, s);
      if (oj >= 0) {
        slot.tensor = Alias(s);
        slot.version_source = PyRef::Steal(WeakRef(out_objs[static_cast<std::size_t>(oj)]).release().ptr());
        slot.weak = true;
        slot.version = PyVersion(rt, out_objs[static_cast<std::size_t>(oj)]);
      } else {
        slot.tensor = s;
        if (PyObject *p = s->py_object()) {
          slot.version_source = PyRef::Borrow(p);
          slot.version = PyVersion(rt, p);
        }
      }
    }
    c.saved.push_back(std::move(slot));
  }
  c.saved_raw.clear();
  c.saved_final = true;
  c.inputs.clear();  // Backward uses NeedsInputGrad(i); do not keep inputs alive
  return result;
}

template <>
struct ApplyImpl<TensorPtr> {
  static TensorPtr NoGrad(const Runtime &rt, AutogradContext &ctx, TensorPtr out, const std::string &name) {
    return FinishOutputNoGrad(rt, ctx, out, name);
  }
  static TensorPtr Record(const Runtime &rt, std::shared_ptr<AutogradContext> ctx, TensorPtr out, py::tuple edges,
                          BackwardFn backward, const std::string &name) {
    return RecordOutputs(rt, std::move(ctx), AsList(out), std::move(edges), backward, name)[0];
  }
};

template <>
struct ApplyImpl<TensorPtrList> {
  static TensorPtrList NoGrad(const Runtime &rt, AutogradContext &ctx, TensorPtrList outs, const std::string &name) {
    for (auto &o : outs) o = FinishOutputNoGrad(rt, ctx, o, name);
    return outs;
  }
  static TensorPtrList Record(const Runtime &rt, std::shared_ptr<AutogradContext> ctx, TensorPtrList outs,
                              py::tuple edges, BackwardFn backward, const std::string &name) {
    return RecordOutputs(rt, std::move(ctx), outs, std::move(edges), backward, name);
  }
};

// The edge to input tensor `t` (which requires grad): itself if a leaf, else (node, index).
inline py::object EdgeOf(const Runtime &rt, PyObject *t) {
  py::object node = Steal(PyObject_GetAttr(t, rt.s_node));
  if (node.is_none()) return py::reinterpret_borrow<py::object>(t);
  py::object idx = Steal(PyObject_GetAttr(t, rt.s_out_index));
  return Steal(PyTuple_Pack(2, node.ptr(), idx.ptr()));
}

}  // namespace detail

inline TensorPtrList AutogradContext::GetSavedTensors() const {
  const detail::ContextState &st = st_;
  if (st.released) {
    throw std::runtime_error(function_name() +
                             ": saved tensors were freed after the first backward; pass retain_graph=True");
  }
  if (!st.saved_final) return st.saved_raw;  // inside Forward
  const auto &rt = detail::Runtime::Get();
  TensorPtrList out;
  out.reserve(st.saved.size());
  for (std::size_t i = 0; i < st.saved.size(); ++i) {
    const detail::SavedSlot &s = st.saved[i];
    PyObject *src = s.version_source.get();
    if (src != nullptr && s.weak) src = PyWeakref_GetObject(src);
    if (src != nullptr && src != Py_None) {
      const std::int64_t now = detail::PyVersion(rt, src);
      if (now != s.version) {
        throw std::runtime_error("one of the tensors saved for backward by " + function_name() + " (saved slot " +
                                 std::to_string(i) + ") has been modified by an in-place operation: it is at version " +
                                 std::to_string(now) + ", but was saved at version " + std::to_string(s.version));
      }
    }
    out.push_back(s.tensor);
  }
  return out;
}

template <typename Derived>
class Function {
 public:
  template <typename... Args>
  static auto Apply(Args &&...args) {
    using R = decltype(Derived::Forward(std::declval<AutogradContext *>(), std::forward<Args>(args)...));
    static_assert(std::is_same_v<R, TensorPtr> || std::is_same_v<R, TensorPtrList>,
                  "Function<T>: T::Forward must return TensorPtr or TensorPtrList");
    const auto &rt = detail::Runtime::Get();
    const std::string &name = detail::FunctionName<Derived>();
    TensorPtrList inputs;
    inputs.reserve(sizeof...(Args));
    (detail::CollectTensor(inputs, args), ...);

    std::vector<bool> needs(inputs.size(), false);
    bool record = false;
    if (detail::GradEnabled(rt)) {
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        if (inputs[i] && inputs[i]->requires_grad() && inputs[i]->py_object() != nullptr) {
          needs[i] = record = true;
        }
      }
    }
    if (!record) {
      AutogradContext ctx;
      detail::ContextState &st = detail::State(ctx);
      st.name = &name;
      st.needs = std::move(needs);
      st.inputs = std::move(inputs);
      R out = Derived::Forward(&ctx, std::forward<Args>(args)...);
      return detail::ApplyImpl<R>::NoGrad(rt, ctx, std::move(out), name);
    }
    pybind11::tuple edges(inputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      edges[i] = needs[i] ? detail::EdgeOf(rt, inputs[i]->py_object()) : pybind11::none();
    }
    auto ctx = std::make_shared<AutogradContext>();
    detail::ContextState &st = detail::State(*ctx);
    st.name = &name;
    st.needs = std::move(needs);
    st.inputs = std::move(inputs);
    R out;
    {
      detail::GradModeGuard off(rt, false);
      out = Derived::Forward(ctx.get(), std::forward<Args>(args)...);
    }
    return detail::ApplyImpl<R>::Record(rt, ctx, std::move(out), std::move(edges), &BackwardThunk, name);
  }

 private:
  static TensorPtrList BackwardThunk(AutogradContext *ctx, TensorPtrList grads) {
    return Derived::Backward(ctx, std::move(grads));
  }
};

}  // namespace opbuilder

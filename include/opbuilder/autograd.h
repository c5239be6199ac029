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
// argument requires grad). When none does it just runs Forward (the fast
// path: no allocation beyond Forward's own, no Python calls). Otherwise it
// fingerprints the tensor arguments, runs Forward with recording off, checks
// that only MarkDirty'd arguments changed, and records a node
// (detail/function_node.h) whose backward calls Backward. The engine checks
// what Backward returns (count, shape, dtype) and names the Function in any
// error. A Forward that throws records nothing.
#pragma once

#include "opbuilder/detail/visibility.h"

#include <Python.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <vector>

#if defined(__GNUG__)
#include <cxxabi.h>
#endif

#include "opbuilder/detail/binding.h"
#include "opbuilder/detail/call_rules.h"
#include "opbuilder/detail/errors.h"
#include "opbuilder/detail/fingerprint.h"
#include "opbuilder/detail/function_checks.h"
#include "opbuilder/detail/function_node.h"
#include "opbuilder/detail/infer_shape.h"
#include "opbuilder/detail/replay.h"
#include "opbuilder/detail/runtime_bridge.h"
#include "opbuilder/tensor.h"

namespace opbuilder {

namespace detail OB_HIDDEN {

// A version a saved slot checks: the runtime.Tensor (or a weak reference to it) and its version then.
struct VersionWatch {
  PyRef source;
  bool weak = false;
  std::int64_t version = 0;
};

// A tensor kept for Backward and the version it had when kept. An argument Forward returns
// unchanged is handed out as a new runtime.Tensor over its memory: a write through either
// changes what was saved, so the slot watches the argument and (weakly) each such output.
struct SavedSlot {
  TensorPtr tensor;
  PyRef version_source;  // the runtime.Tensor (for outputs: a weak reference to it)
  bool weak = false;
  std::int64_t version = 0;
  std::vector<VersionWatch> aliases;  // outputs over a saved argument's memory
  std::shared_ptr<void> watch;  // the framework tensor's version counter (a bridge call's), else null
  std::shared_ptr<void> packed;  // kept by the framework's saved-tensor hooks instead (a bridge call's), else null
  PyRef hooked;  // (unpack, packed): kept by the runtime's saved_tensors_hooks instead, else null
};

// What Apply and the recorded node keep in a context (not for operator authors).
struct ContextState {
  const std::string *name = nullptr;
  // The Forward arguments while Apply runs (nullptr for non-tensors); nullptr after.
  Tensor *const *args = nullptr;
  // Per argument, while Apply runs: the caller's tensor where Forward was given a
  // private contiguous copy of it (nullptr where Forward got the caller's own).
  Tensor *const *originals = nullptr;
  std::size_t nargs = 0;
  std::vector<bool> needs;  // per argument; empty when nothing needs a gradient
  TensorPtrList saved_raw;
  std::vector<SavedSlot> saved;
  bool saved_final = false;
  bool released = false;
  bool materialize_grads = true;
  TensorPtrList non_differentiable;
  TensorPtrList dirty;
  WriteState *writes = nullptr;  // the Function type's: what its calls showed of writes (call_rules.h)

  int ArgIndex(const Tensor *t) const {
    for (std::size_t i = 0; i < nargs; ++i) {
      if (t != nullptr && args[i] == t) return static_cast<int>(i);
    }
    return -1;
  }
  bool IsDirty(const Tensor *t) const {
    for (const auto &d : dirty) {
      if (d.get() == t) return true;
    }
    return false;
  }
  bool IsNonDifferentiable(const Tensor *t) const {
    for (const auto &d : non_differentiable) {
      if (d.get() == t) return true;
    }
    return false;
  }
};

}  // namespace detail

class AutogradContext;
namespace detail OB_HIDDEN {
inline ContextState &State(AutogradContext &ctx);
inline const ContextState &State(const AutogradContext &ctx);
}  // namespace detail

class OB_HIDDEN AutogradContext {
 public:
  AutogradContext() = default;
  OB_CORE_FN ~AutogradContext();
  AutogradContext(const AutogradContext &) = delete;
  AutogradContext &operator=(const AutogradContext &) = delete;

  // Keep tensors for Backward (replaces what was saved before; nullptr allowed).
  // Save inputs and outputs here, not in saved_data: their versions are checked.
  OB_CORE_FN void SaveForBackward(const TensorPtrList &tensors);

  // The saved tensors, by position; an error naming the Function and the slot
  // if one was modified in place since it was saved.
  OB_CORE_FN TensorPtrList GetSavedTensors() const;

  // Does this Forward argument (by identity) need a gradient? Inside Forward only.
  OB_CORE_FN bool NeedGrad(const TensorPtr &tensor) const;

  // Does Forward argument `i` (counting every argument after ctx) need a gradient?
  bool NeedsInputGrad(std::size_t i) const { return i < st_.needs.size() && st_.needs[i]; }

  // These outputs get no gradient and have requires_grad == False.
  OB_CORE_FN void MarkNonDifferentiable(const TensorPtrList &outputs);

  // These arguments were modified in place by Forward, which returns them.
  OB_CORE_FN void MarkDirty(const TensorPtrList &inputs);

  // false: gradients of unused outputs arrive as nullptr instead of zeros.
  void SetMaterializeGrads(bool materialize) { st_.materialize_grads = materialize; }

  // Plain values for Backward: ctx->saved_data["k"] = 3; ...cast<int>() (numbers, strings,
  // tensors, lists of them; with pybind11 also ctx->saved_data["k"] = py::cast(3)).
  std::unordered_map<std::string, detail::SavedValue> saved_data;

  // The Function's class name, for messages.
  const std::string &function_name() const { return *st_.name; }

 private:
  // An error naming the slot if `src` (a runtime.Tensor, or a weak reference to one) moved from `version`.
  void CheckSavedVersion(const detail::Runtime &rt, std::size_t slot, PyObject *src, bool weak,
                         std::int64_t version) const;
  void VersionError(std::size_t slot, std::int64_t now, std::int64_t version) const;

  friend detail::ContextState &detail::State(AutogradContext &ctx);
  friend const detail::ContextState &detail::State(const AutogradContext &ctx);
  detail::ContextState st_;
};

namespace detail OB_HIDDEN {

inline ContextState &State(AutogradContext &ctx) { return ctx.st_; }
inline const ContextState &State(const AutogradContext &ctx) { return ctx.st_; }

// ---- what the node (function_node.h) needs of a context -------------------
inline bool ContextMaterializeGrads(const AutogradContext &ctx) { return State(ctx).materialize_grads; }
inline void ContextRelease(AutogradContext &ctx) {
  State(ctx).released = true;
  State(ctx).saved.clear();
  ctx.saved_data.clear();
}
inline int ContextVisit(AutogradContext &ctx, visitproc visit, void *arg) {
  for (auto &kv : ctx.saved_data) Py_VISIT(kv.second.ptr());
  return 0;
}
inline void ContextClear(AutogradContext &ctx) { ctx.saved_data.clear(); }

OB_CORE_FN std::string Demangle(const char *name);

// A class's name for messages from its typeid name: demangled, "(anonymous namespace)::" left out.
OB_CORE_FN std::string DisplayName(const char *mangled);

// The class name for messages, made once.
template <typename T>
const std::string &FunctionName() {
  static const std::string name = DisplayName(typeid(T).name());
  return name;
}

// The same name as a Python str (borrowed, lives as long as the module).
template <typename T>
PyObject *FunctionNamePy() {
  static std::atomic<PyObject *> stored{nullptr};  // made under the GIL; a race leaks one str at most
  PyObject *s = stored.load(std::memory_order_acquire);
  if (s != nullptr) return s;
  s = Check(PyUnicode_FromStringAndSize(FunctionName<T>().data(), static_cast<Py_ssize_t>(FunctionName<T>().size())));
  PyObject *expected = nullptr;
  if (stored.compare_exchange_strong(expected, s, std::memory_order_acq_rel)) return s;
  Py_DECREF(s);
  return expected;
}

// The tensor a Forward argument is (a TensorPtr, or an engaged std::optional<TensorPtr>), else nullptr.
template <typename A>
Tensor *TensorArg(const A &arg) {
  if constexpr (std::is_same_v<std::decay_t<A>, TensorPtr>) {
    return arg.get();
  } else if constexpr (std::is_same_v<std::decay_t<A>, std::optional<TensorPtr>>) {
    return arg ? arg->get() : nullptr;
  } else {
    return nullptr;
  }
}

inline int IndexOf(const TensorPtrList &list, const Tensor *t) {
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (list[i].get() == t) return static_cast<int>(i);
  }
  return -1;
}

// The same tensor for the purpose of "was it modified": one object, or two
// C++ views of one runtime.Tensor (an argument passed twice).
inline bool SameTensor(const Tensor *a, const Tensor *b) {
  return a == b || (a->py_object() != nullptr && a->py_object() == b->py_object());
}

// A tensor sharing `t`'s memory but bound to no Python object.
inline TensorPtr Alias(const TensorPtr &t) { return std::make_shared<Tensor>(*t); }

inline void CheckOutputs(const TensorPtrList &outs, const std::string &name) {
  for (std::size_t j = 0; j < outs.size(); ++j) {
    if (!outs[j]) throw std::runtime_error(name + "::Forward returned a null tensor as output " + std::to_string(j));
  }
}

// MarkDirty'd tensors: arguments of Forward, returned by it; their versions go up.
// A MarkDirty'd argument that Forward got as a private copy is written back to
// the caller's tensor; a read-only one is refused (its memory was never written).
inline void FinishDirty(const Runtime &rt, const ContextState &c, const TensorPtrList &outs) {
  const std::string &name = *c.name;
  for (std::size_t k = 0; k < c.dirty.size(); ++k) {
    const Tensor *d = c.dirty[k].get();
    const int i = c.ArgIndex(d);
    if (i < 0) throw std::runtime_error(name + ": MarkDirty was given a tensor that is not an argument of Forward");
    bool seen = false;
    for (std::size_t m = 0; m < k; ++m) seen = seen || c.dirty[m].get() == d;
    if (seen) continue;
    Tensor *orig = c.originals != nullptr ? c.originals[i] : nullptr;
    if (!(orig != nullptr ? orig : d)->is_writable()) {
      throw ValueError(name + ": argument " + std::to_string(i) +
                       " is read-only memory (a numpy array with writeable=False, a bytes buffer or a "
                            "read-only memory map), but Forward marked it dirty (an in-place write); pass a "
                            "writable copy, e.g. x * 1");
    }
    if (orig != nullptr) orig->copy_from(*d);
    if (d->py_object() != nullptr) BumpVersion(rt, d->py_object());
    if (void *h = ForeignHandle(orig != nullptr ? *orig : *d)) (*rt.bridge_slot)->bump_version(h);
  }
  for (const auto &d : c.dirty) {
    if (IndexOf(outs, d.get()) < 0) {
      throw std::runtime_error(name + ": argument " + std::to_string(c.ArgIndex(d.get())) +
                               " was given to MarkDirty but not returned by Forward; "
                               "an argument modified in place must be returned as an output");
    }
  }
}

// Outputs without recording: dirty arguments' versions go up; other returned
// arguments become aliases (new Python objects over the same memory).
OB_CORE_FN TensorPtrList FinishNoGrad(const Runtime &rt, ContextState &c, TensorPtrList outs);

// A tensor saved through a bridge's saved-tensor hooks (ForeignApi::pack), as its unpack hook gives it back.
inline TensorPtr UnpackForeignSaved(const ForeignApi &api, void *packed) {
  ForeignTensor f;
  if (api.unpack_saved(packed, &f) != 0) throw PythonError();
  return TensorFromForeign(api, f, false);
}

inline PyRef WeakRef(PyObject *o) { return PyRef::Steal(Check(PyWeakref_NewRef(o, nullptr))); }

// After Forward, before recording: dirty arguments, arguments changed without
// MarkDirty (their fingerprints differ), dirty leaves that require grad.
inline void CheckForwardWrites(const Runtime &rt, const ContextState &c, const TensorPtrList &outs,
                               const std::uint64_t *fingerprints, double phase) {
  const std::string &name = *c.name;
  FinishDirty(rt, c, outs);
  for (std::size_t i = 0; i < c.nargs; ++i) {
    const Tensor *a = c.args[i];
    if (a == nullptr) continue;
    bool dirty = false;
    for (const auto &d : c.dirty) dirty = dirty || SameTensor(a, d.get());
    if (dirty || Fingerprint(*a, phase) == fingerprints[i]) continue;
    const bool own = c.originals[i] == nullptr;  // else the write went to a private copy
    if (own && a->py_object() != nullptr) BumpVersion(rt, a->py_object());  // it did change
    NoteWrites(c.writes);
    throw std::runtime_error(name + "::Forward modified argument " + std::to_string(i) +
                             " in place without MarkDirty; mark it (ctx->MarkDirty({tensor})) and return it, "
                             "or write the result to a new tensor");
  }
  for (const auto &d : c.dirty) {
    PyObject *p = d->py_object();
    if (p == nullptr || !d->requires_grad()) continue;
    PyRef node = PyRef::Steal(Check(PyObject_GetAttr(p, rt.s_node)));
    if (node.get() == Py_None) {
      throw std::runtime_error(name + " modifies argument " + std::to_string(c.ArgIndex(d.get())) +
                               " in place (MarkDirty), but it is a leaf that requires grad; in-place changes "
                               "of such leaves are not allowed (use a copy, e.g. x * 1)");
    }
  }
}

// The runtime's saved_tensors_hooks in force on this thread (runtime/autograd/saved_hooks.py): its
// (pack, unpack) pair, or null.
inline PyRef SavedTensorHooks(const Runtime &rt) {
  static PyObject *const name = Check(PyUnicode_InternFromString("saved_hooks"));  // made once, under the GIL
  PyRef h = PyRef::Steal(Check(PyObject_GetAttr(rt.grad_state, name)));
  return h.get() == Py_None ? PyRef() : h;
}

// Each tensor `c` saved goes to the hooks' pack, as a new runtime.Tensor over its memory in no graph
// (what pack keeps holds no node); Backward reads what unpack returns, with no version check (what
// is kept is the hook's, as in torch).
inline void PackSaved(const Runtime &rt, ContextState &c, PyObject *hooks) {
  PyObject *pack = PyTuple_GET_ITEM(hooks, 0), *unpack = PyTuple_GET_ITEM(hooks, 1);
  for (auto &slot : c.saved) {
    if (!slot.tensor) continue;
    PyRef obj = PyRef::Steal(ToPython(rt, Alias(slot.tensor)));
    PyRef packed = PyRef::Steal(Check(PyObject_CallOneArg(pack, obj.get())));
    SavedSlot hooked;
    hooked.hooked = PyRef::Steal(Check(PyTuple_Pack(2, unpack, packed.get())));
    slot = std::move(hooked);
  }
}

// Records the node and turns Forward's outputs into runtime.Tensors that are its results.
OB_CORE_FN TensorPtrList RecordOutputs(const Runtime &rt, std::unique_ptr<AutogradContext, ContextDeleter> ctx,
                                   const TensorPtrList &outs, PyObject *edges,
                                   const std::uint64_t *fingerprints, double phase, BackwardFn backward,
                                   ErrorFn set_error, PyObject *name_py);

inline TensorPtrList AsList(TensorPtr t) { return TensorPtrList{std::move(t)}; }
inline TensorPtrList AsList(TensorPtrList l) { return l; }
template <typename R>
R FromList(TensorPtrList l) {
  if constexpr (std::is_same_v<R, TensorPtr>) {
    return std::move(l[0]);
  } else {
    return l;
  }
}

// The edge to argument `t` (which requires grad): itself if a leaf, else (node, index). New reference.
OB_CORE_FN PyObject *EdgeOf(const Runtime &rt, PyObject *t);

inline bool WantsGrad(const Tensor *t) {
  return t != nullptr && t->requires_grad() && t->py_object() != nullptr && IsDifferentiable(t->dtype());
}

// A TensorPtrList argument is one argument with one Backward entry: its tensors get no gradient.
// One that wants a gradient while it would be recorded is an error, not a silent zero.
template <typename A>
void CheckListArg(const A &arg, std::size_t index, const std::string &name) {
  if constexpr (std::is_same_v<std::decay_t<A>, TensorPtrList>) {
    for (std::size_t k = 0; k < arg.size(); ++k) {
      if (WantsGrad(arg[k].get())) {
        throw std::runtime_error(name + ": argument " + std::to_string(index) + " is a list of tensors and its " +
                                 "element " + std::to_string(k) + " requires grad, but Function<T> gives " +
                                 "gradients to TensorPtr arguments only (Backward returns one per argument); " +
                                 "pass that tensor as a TensorPtr argument, or stop its gradient first");
      }
    }
  }
}

// ---- what Forward and Backward are given ------------------------------------
// A Function sees C-contiguous, writable tensors unless it declares
//   static constexpr bool kAcceptsViews = true;
// and then gets every tensor as the caller passed it (any strides, read-only memory).
template <typename T, typename = void>
struct AcceptsViews : std::false_type {};
template <typename T>
struct AcceptsViews<T, std::void_t<decltype(T::kAcceptsViews)>> : std::bool_constant<T::kAcceptsViews> {};

inline bool NeedsPrivateCopy(const Tensor &t) { return !t.is_contiguous() || !t.is_writable(); }

// A private contiguous copy standing for `t`: same requires_grad, bound to the
// same runtime.Tensor (so grad edges, versions and MarkDirty refer to the caller's).
OB_CORE_FN TensorPtr PrivateCopy(const Tensor &t);

// What Forward gets for an argument: tensors (TensorPtr, std::optional<TensorPtr>,
// the elements of a TensorPtrList) made contiguous where needed (the copy kept in
// `*copy`, `*orig` set to the caller's tensor), everything else as it came. A
// tensor passes by reference: no reference count is touched on the common path.
template <bool kViews, typename A>
decltype(auto) ForwardArg(A &&arg, Tensor **orig, TensorPtr *copy) {
  using D = std::decay_t<A>;
  if constexpr (!kViews && std::is_same_v<D, TensorPtr>) {
    if (arg && NeedsPrivateCopy(*arg)) {
      *orig = arg.get();
      *copy = PrivateCopy(*arg);
      return static_cast<const TensorPtr &>(*copy);
    }
    return static_cast<const TensorPtr &>(arg);
  } else if constexpr (!kViews && std::is_same_v<D, std::optional<TensorPtr>>) {
    if (arg && *arg && NeedsPrivateCopy(**arg)) {
      *orig = arg->get();
      *copy = PrivateCopy(**arg);
      return std::optional<TensorPtr>(*copy);
    }
    return std::optional<TensorPtr>(std::forward<A>(arg));
  } else if constexpr (!kViews && std::is_same_v<D, TensorPtrList>) {
    TensorPtrList list(std::forward<A>(arg));
    for (auto &t : list) {
      if (t && NeedsPrivateCopy(*t)) t = PrivateCopy(*t);
    }
    return list;
  } else {
    return std::forward<A>(arg);
  }
}

// Function<T>::InferShapeFunction()'s target: Forward's parameters (minus ctx) in, T::InferShape's
// outputs out as MetaTensors (shape and dtype, no data), one TensorPtr or a list as Forward returns.
template <typename Derived, typename F>
struct InferShapeBinder;
template <typename Derived, typename R, typename... A>
struct InferShapeBinder<Derived, R (*)(AutogradContext *, A...)> {
  static R Call(A... args) {
    static_assert(kDeclaresInferShape<Derived>, "Function<T>::InferShapeFunction(): T declares no InferShape");
    if constexpr (InferShapeChecks<Derived, R, A...>::ok) {
      const DataType dtype = OutputDtype(args...);
      TensorPtrList outs;
      for (auto &s : ShapeList(Derived::InferShape(args...))) outs.push_back(MetaTensor(dtype, std::move(s)));
      if constexpr (std::is_same_v<R, TensorPtr>) {
        return std::move(outs[0]);
      } else {
        return outs;
      }
    } else {
      return R();
    }
  }
};

}  // namespace detail

inline void AutogradContext::CheckSavedVersion(const detail::Runtime &rt, std::size_t slot, PyObject *src, bool weak,
                                               std::int64_t version) const {
  detail::PyRef target;
  if (src != nullptr && weak) {
    target = detail::WeakTarget(src);
    src = target.get();
  }
  if (src == nullptr || src == Py_None) return;  // no Python object, or one that is gone
  const std::int64_t now = detail::PyVersion(rt, src);
  if (now != version) VersionError(slot, now, version);
}

inline void AutogradContext::VersionError(std::size_t slot, std::int64_t now, std::int64_t version) const {
  throw std::runtime_error("one of the tensors saved for backward by " + function_name() + " (saved slot " +
                           std::to_string(slot) + ") has been modified by an in-place operation: it is at version " +
                           std::to_string(now) + ", but was saved at version " + std::to_string(version));
}



namespace detail OB_HIDDEN {

// One Apply call's Forward, type-erased: T::Forward(ctx, the arguments `call` points to), its
// result stored in *single (Forward returns TensorPtr) or *list (TensorPtrList).
using ForwardFn = void (*)(AutogradContext *ctx, void *call, TensorPtr *single, TensorPtrList *list);

// What Function<T>::Apply hands the runner: all that depends on T and the arguments.
struct FunctionCall {
  const std::string *name;
  Tensor *const *args;       // per Forward argument: its tensor, or nullptr
  Tensor *const *originals;  // per argument: the caller's tensor where Forward gets a private copy
  std::size_t nargs;
  ForwardFn forward;
  void *call;
  BackwardFn backward;
  ErrorFn set_error;
  PyObject *(*name_py)();
  WriteState *writes;  // the Function type's (Function<T>::Writes): when arguments are kept (call_rules.h)
};

// A context as Forward sees it: the Function's name and this call's arguments.
inline void BeginContext(ContextState &st, const FunctionCall &f) {
  st.name = f.name;
  st.args = f.args;
  st.originals = f.originals;
  st.nargs = f.nargs;
  st.writes = f.writes;
}

// The tensor the caller passed for argument i (Forward may have a private copy of it).
inline Tensor *CallerArg(const FunctionCall &f, std::size_t i) {
  return f.originals[i] != nullptr ? f.originals[i] : f.args[i];
}

// Before Forward (call_rules.h): argument i's refusal, if it is written, and what to keep of it.
// Called only where KeepsArguments(f.writes): a type known to write none keeps nothing (LateRefusal).
inline void ProtectArg(ProtectedArgs &guard, const FunctionCall &f, std::size_t i, Refusal why) {
  if (why != Refusal::kNone) guard.Add(i, why, f.args[i], f.originals[i] != nullptr);
}

// After Forward of a call that kept nothing (its type had written none before): an argument marked dirty
// that a write is refused for is refused now, decided as before Forward (`why(i)`), from what Forward
// does not change. The caller's memory may hold the write (the one hole, call_rules.h): its version goes
// up (`bump`: a runtime.Tensor's; a framework's tensor counts its own writes); a private copy's write is
// never copied back.
template <typename Why>
inline void LateRefusal(const Runtime &rt, const ContextState &c, const FunctionCall &f, bool bump, Why why) {
  for (const auto &d : c.dirty) {
    const int i = c.ArgIndex(d.get());
    if (i < 0) continue;  // FinishDirty names that misuse
    const std::size_t k = static_cast<std::size_t>(i);
    std::string message = why(k);
    if (message.empty()) continue;
    PyObject *obj = CallerArg(f, k)->py_object();
    if (bump && f.originals[k] == nullptr && obj != nullptr) BumpVersion(rt, obj);
    throw std::runtime_error(message);
  }
}

// After Forward, before anything is written back or recorded: a refused argument marked dirty, or
// changed without MarkDirty, gets its values back; then the refusal decided before Forward is raised.
inline void CheckRefusals(const ContextState &c, const ProtectedArgs &guard) {
  for (const auto &d : c.dirty) {
    const int i = c.ArgIndex(d.get());
    if (i < 0) continue;  // FinishDirty names that misuse
    const Refusal why = guard.RefusalOf(static_cast<std::size_t>(i));
    if (why == Refusal::kNone) continue;
    guard.Restore();
    throw std::runtime_error(RefusalMessage(why, *c.name, static_cast<std::size_t>(i)));
  }
  for (std::size_t i = 0; i < c.nargs; ++i) {
    if (!guard.Changed(i)) continue;
    NoteWrites(c.writes);
    guard.Restore();
    throw std::runtime_error(*c.name + "::Forward modified argument " + std::to_string(i) +
                             " in place without MarkDirty; mark it (ctx->MarkDirty({tensor})) and return it, "
                             "or write the result to a new tensor");
  }
}

// ---- Function<T> called through a framework bridge (to_torch's C++ path) --------------
// The node goes into the framework's graph (ForeignApi::record) and runs Backward from there;
// arguments and gradients cross as views of the framework's memory (detail/foreign_api.h).

struct ForeignNodeState : NodeState {
  const ForeignApi *api = nullptr;
};

inline bool ForeignWantsGrad(const Tensor *t) {
  return t != nullptr && t->requires_grad() && IsDifferentiable(t->dtype()) && ForeignHandle(*t) != nullptr;
}

// `t` is exactly one of the incoming gradients: its memory, shape and strides.
inline bool IsIncoming(const Tensor &t, const ForeignTensor *grads, std::size_t n) {
  for (std::size_t j = 0; j < n; ++j) {
    const ForeignTensor &g = grads[j];
    if (g.ndim < 0 || g.data != t.data_ptr() || g.ndim != static_cast<std::int32_t>(t.ndim())) continue;
    if (!std::equal(t.shape().begin(), t.shape().end(), g.shape)) continue;
    if (g.strides == nullptr ? t.is_contiguous() : (!t.is_contiguous() || t.strides() == ShapeVector(g.strides, g.strides + g.ndim))) {
      return true;
    }
  }
  return false;
}

// ForeignNode::backward: the framework's gradients in, Backward's (checked, owned) out.
OB_CORE_FN int ForeignBackward(void *state, const ForeignTensor *grads, std::size_t ngrads, ForeignTensor *out,
                               void **keep, std::size_t nargs) noexcept;

OB_CORE_FN void ForeignRelease(void *state) noexcept;

OB_CORE_FN void ForeignDestroy(void *state) noexcept;

// Keeps framework tensor `o`'s version counter (not `o`) in `slot`, with its version now.
inline void WatchVersion(const ForeignApi &api, PyObject *o, SavedSlot &slot) {
  void *w = api.watch(o);
  if (w == nullptr) throw PythonError();
  slot.watch = std::shared_ptr<void>(w, [unwatch = api.unwatch](void *p) { unwatch(p); });
  slot.version = api.watched(w);
}

// RunFunction inside a bridge call: Forward (with the framework's grad mode off while recording),
// outputs as the framework's tensors (an in-place output is the caller's own object), and, when an
// argument needs a gradient, the node recorded in the framework's graph. Saved arguments' versions
// are the framework's; a saved output is kept without its object (no cycle through the node).
OB_CORE_FN void RunFunctionForeign(const Runtime &rt, const ForeignApi &api, const FunctionCall &f,
                                   TensorPtr *single, TensorPtrList *list);

// Apply's work once the arguments are prepared, compiled once (the core library) rather than per
// Function: runs Forward (recording off) and, when an argument needs a gradient and grad mode is on,
// records the node; else only the no-grad checks. The result goes to *single or *list as Forward's.
OB_CORE_FN void RunFunction(const Runtime &rt, const FunctionCall &f, TensorPtr *single,
                            TensorPtrList *list);

// Before T::Backward: an error if the node was released; else the gradients as Backward sees
// them (contiguous copies where needed, unless the Function accepts views).
OB_CORE_FN void PrepareBackward(AutogradContext &ctx, TensorPtrList &grads, bool views);

}  // namespace detail

template <typename Derived>
class Function {
 public:
  // Runs Forward (and records a node for Backward when an input needs grad).
  // Tensor arguments that are strided views or read-only memory reach Forward
  // as private contiguous copies, unless Derived declares kAcceptsViews.
  template <typename... Args>
  static auto Apply(Args &&...args) {
    const detail::Runtime &rt = detail::Runtime::Get();
    if (*rt.trace_flag != 0) return Traced(std::forward<Args>(args)...);
    return Prepare(rt, std::index_sequence_for<Args...>{}, std::forward<Args>(args)...);
  }

  // T::InferShape as a function to bind next to the op, m.def("<name>_infer_shape", T::InferShapeFunction()):
  // it takes Forward's arguments (minus ctx) and returns the outputs' shapes and dtypes as tensors
  // without data (every element one zero), running no kernel. Needs one (non-template) Forward.
  static constexpr auto InferShapeFunction() {
    return &detail::InferShapeBinder<Derived, decltype(&Derived::Forward)>::Call;
  }

 private:
  // runtime.jit is tracing: hand the call to its hook (runtime/jit/tracing.py cpp_hook), which
  // records one graph node whose target replays this Apply (without the check) and runs it.
  // The arguments and the result cross as Python objects, converted by the binding layer.
  template <typename... Args>
  static auto Traced(Args &&...args) {
    using R =
        decltype(Prepare(detail::Runtime::Get(), std::index_sequence_for<Args...>{}, std::forward<Args>(args)...));
    detail::PyRef py_args =
        detail::PyRef::Steal(detail::Check(PyTuple_New(static_cast<Py_ssize_t>(sizeof...(Args)))));
    Py_ssize_t k = 0;
    (PyTuple_SET_ITEM(py_args.get(), k++, detail::ReplayToPython<Derived>(args)), ...);
    detail::PyRef out = detail::PyRef::Steal(
        detail::TraceCall(detail::Runtime::Get().trace_hook, detail::FunctionNamePy<Derived>(),
                          Replay<std::index_sequence_for<Args...>, Args...>::kTarget, py_args.get()));
    return detail::ReplayFromPython<Derived, R>(out.get());
  }

  // The replay's target: the arguments converted to what Apply got (Args), then Apply's work.
  template <typename Seq, typename... Args>
  struct Replay;
  template <std::size_t... I, typename... Args>
  struct Replay<std::index_sequence<I...>, Args...> {
    static PyObject *Call(PyObject *const *py_args, Py_ssize_t) {
      try {
        std::tuple<std::decay_t<Args>...> a{
            detail::ReplayFromPython<Derived, std::decay_t<Args>>(py_args[I])...};
        (void)py_args;
        return detail::ReplayToPython<Derived>(
            Prepare(detail::Runtime::Get(), std::index_sequence<I...>{}, static_cast<Args &&>(std::get<I>(a))...));
      } catch (...) {
        detail::Binding<Derived>::SetErrorFromCurrentException();
        return nullptr;
      }
    }
    static constexpr detail::ReplayTarget kTarget{&Call, static_cast<Py_ssize_t>(sizeof...(Args))};
  };

  static constexpr bool kViews = detail::AcceptsViews<Derived>::value;

 public:
  // What Derived's calls showed of writes into its arguments, one per type (call_rules.h WriteKnowledge):
  // decides whether a call keeps the arguments a write would be refused for. Public for the XLA FFI
  // handlers (xla_ffi.h), which read and teach the same knowledge.
  static detail::WriteState *Writes() {
    static detail::WriteState state{detail::kWritesUnknown};
    return &state;
  }

 private:
  template <std::size_t... I, typename... Args>
  static auto Prepare(const detail::Runtime &rt, std::index_sequence<I...>, Args &&...args) {
    std::array<Tensor *, sizeof...(Args) + 1> originals{};
    std::array<TensorPtr, sizeof...(Args) + 1> copies;
    return Run(rt, originals.data(),
               detail::ForwardArg<kViews>(std::forward<Args>(args), &originals[I], &copies[I])...);
  }

  // Forward and Backward are called only when FunctionChecks (detail/function_checks.h) found them
  // callable; otherwise its static_assert is the one error the compiler reports for them.
  template <typename... Args>
  static auto Run(const detail::Runtime &rt, Tensor *const *originals, Args &&...args) {
    if constexpr (detail::FunctionChecks<Derived, Args...>::ok) {
      return RunChecked(rt, originals, std::forward<Args>(args)...);
    } else {
      return TensorPtr();
    }
  }

  // The part of Apply that needs T: the argument list, Forward's call; the rest is RunFunction.
  template <typename... Args>
  static auto RunChecked(const detail::Runtime &rt, Tensor *const *originals, Args &&...args) {
    using R = decltype(Derived::Forward(std::declval<AutogradContext *>(), std::forward<Args>(args)...));
    constexpr std::size_t kN = sizeof...(Args);
    const std::array<Tensor *, kN + 1> in{{detail::TensorArg(args)..., nullptr}};
    if constexpr ((std::is_same_v<std::decay_t<Args>, TensorPtrList> || ...)) {
      if (detail::GradEnabled(rt)) {
        std::size_t index = 0;
        (detail::CheckListArg(args, index++, detail::FunctionName<Derived>()), ...);
      }
    }
    std::tuple<Args &&...> call(std::forward<Args>(args)...);
    const detail::FunctionCall f{&detail::FunctionName<Derived>(),
                                 in.data(),
                                 originals,
                                 kN,
                                 &ForwardCaller<R, std::index_sequence_for<Args...>, Args...>::Call,
                                 &call,
                                 &BackwardThunk,
                                 &detail::Binding<Derived>::SetErrorFromCurrentException,
                                 &detail::FunctionNamePy<Derived>,
                                 Writes()};
    R out;
    if constexpr (std::is_same_v<R, TensorPtr>) {
      detail::RunFunction(rt, f, &out, nullptr);
    } else {
      detail::RunFunction(rt, f, nullptr, &out);
    }
    return out;
  }

  // detail::ForwardFn for one argument list: T::Forward on the arguments, checked against
  // T::InferShape under OPBUILDER_DEBUG_CHECKS when T declares one.
  template <typename R, typename Seq, typename... Args>
  struct ForwardCaller;
  template <typename R, std::size_t... I, typename... Args>
  struct ForwardCaller<R, std::index_sequence<I...>, Args...> {
    static void Call(AutogradContext *ctx, void *call, TensorPtr *single, TensorPtrList *list) {
      auto &t = *static_cast<std::tuple<Args &&...> *>(call);
      [[maybe_unused]] std::optional<detail::InferredShapes> inferred;
      if constexpr (detail::kDeclaresInferShape<Derived>) {
        if constexpr (detail::InferShapeChecks<Derived, R, Args...>::ok) {
          if (detail::DebugChecks()) {
            inferred.emplace();
            inferred->shapes = detail::ShapeList(Derived::InferShape(std::get<I>(t)...));
            inferred->dtype = detail::OutputDtype(std::get<I>(t)...);
          }
        }
      }
      R out = Derived::Forward(ctx, std::forward<Args>(std::get<I>(t))...);
      if constexpr (detail::kDeclaresInferShape<Derived>) {
        if (inferred) detail::CheckInferredShapes(ctx->function_name(), *inferred, detail::AsList(out));
      }
      if constexpr (std::is_same_v<R, TensorPtr>) {
        *single = std::move(out);
        (void)list;
      } else {
        *list = std::move(out);
        (void)single;
      }
    }
  };

 private:
  static TensorPtrList BackwardThunk(AutogradContext *ctx, TensorPtrList grads) {
    detail::PrepareBackward(*ctx, grads, kViews);
    return Derived::Backward(ctx, std::move(grads));
  }
};

}  // namespace opbuilder

#if !OB_CORE_SHARED  // no core library: its bodies compile here, inline (detail/core_lib.h)
#include "../../src/core/autograd.cpp"
#endif

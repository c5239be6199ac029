// RunFunction's helpers (detail/function_details.h declares RunFunction): recording a Function<T>
// call as a node of the runtime's graph, and running one inside a framework bridge's call (to_torch's
// C++ path: the node goes into the framework's graph). Only the core's bodies use them
// (src/core/autograd.cpp, compiled once into libobcore, or inline where there is no core library):
// included by that file only, after autograd.h. Not for operator authors.
#pragma once

#include "opbuilder/detail/visibility.h"

#include <Python.h>

#include "opbuilder/detail/limited_api.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "opbuilder/autograd.h"
#include "opbuilder/detail/call_rules.h"
#include "opbuilder/detail/context_state.h"
#include "opbuilder/detail/dlpack_exchange.h"
#include "opbuilder/detail/errors.h"
#include "opbuilder/detail/fingerprint.h"
#include "opbuilder/detail/foreign_api.h"
#include "opbuilder/detail/function_details.h"
#include "opbuilder/detail/function_node.h"
#include "opbuilder/detail/pyref.h"
#include "opbuilder/detail/runtime_bridge.h"
#include "opbuilder/detail/foreign_tensor.h"
#include "opbuilder/tensor.h"

namespace opbuilder {

inline void AutogradContext::CheckSavedVersion(const detail::Runtime &rt, std::size_t slot, PyObject *src, bool weak,
                                               std::int64_t version, PyObject *counter) const {
  detail::PyRef target;
  if (src != nullptr && weak) {
    target = detail::WeakTarget(src);
    src = target.get();
    if ((src == nullptr || src == Py_None) && counter != nullptr) {  // the output is gone: its memory's counter
      detail::PyRef v = detail::PyRef::Steal(detail::Check(PyObject_GetAttrString(counter, "value")));
      const std::int64_t now = PyLong_AsLongLong(v.get());
      if (now == -1 && PyErr_Occurred()) throw detail::PythonError();
      if (now != version) VersionError(slot, now, version);
      return;
    }
  }
  if (src == nullptr || src == Py_None) return;  // no Python object
  const std::int64_t now = detail::PyVersion(rt, src);
  if (now != version) VersionError(slot, now, version);
}

inline void AutogradContext::VersionError(std::size_t slot, std::int64_t now, std::int64_t version) const {
  throw std::runtime_error("one of the tensors saved for backward by " + function_name() + " (saved slot " +
                           std::to_string(slot) + ") has been modified by an in-place operation: it is at version " +
                           std::to_string(now) + ", but was saved at version " + std::to_string(version));
}

namespace detail OB_HIDDEN {

// ---- what the node (function_node.h) needs of a context (here: only the core calls it) ----
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


// The same tensor for the purpose of "was it modified": one object, or two
// C++ views of one runtime.Tensor (an argument passed twice).
inline bool SameTensor(const Tensor *a, const Tensor *b) {
  return a == b || (a->py_object() != nullptr && a->py_object() == b->py_object());
}

// One shape and, but for size-1 dimensions (whose stride reaches no other element), one set of strides:
// over the same address, the same elements in the same order (v[:, None] and v.reshape(n, 1)).
inline bool SameLayout(const Tensor &a, const Tensor &b) {
  if (a.shape() != b.shape()) return false;
  if (a.is_contiguous() && b.is_contiguous()) return true;
  const ShapeVector sa = a.strides(), sb = b.strides();
  for (std::size_t d = 0; d < sa.size(); ++d) {
    if (a.shape()[d] != 1 && sa[d] != sb[d]) return false;
  }
  return true;
}

// A write into `d` explains a change of `a`: the same tensor, or the same elements of the same memory
// (one framework tensor that reaches Forward as two, torch's x.add_(x)). Partly shared memory does not:
// `a` may have changed where `d` does not reach (torch refuses such partial overlap of an in-place op).
inline bool WriteReaches(const Tensor *d, const Tensor *a) {
  if (SameTensor(a, d)) return true;
  return TensorAccess::Read(*a) == TensorAccess::Read(*d) && a->dtype() == d->dtype() && SameLayout(*a, *d);
}

// The first output before `j` that is the tensor outs[j] (Forward returned one tensor twice), or -1.
inline int RepeatOf(const TensorPtrList &outs, std::size_t j) {
  for (std::size_t k = 0; k < j; ++k) {
    if (outs[k] && outs[k].get() == outs[j].get()) return static_cast<int>(k);
  }
  return -1;
}

// The argument whose storage a new output `t` is over (Forward built a view of it: a Tensor on its
// storage()), or -1. An argument Forward got as a private copy does not count (that memory is new), nor
// one it wrote (MarkDirty: that argument is an output itself, and torch takes its view as new memory).
inline int ViewedArg(const ContextState &c, const Tensor *t) {
  for (std::size_t i = 0; i < c.nargs; ++i) {  // (every no-grad call on the bridge asks: the cheap test first)
    const Tensor *a = c.args[i];
    if (a == nullptr || !TensorAccess::SameStorage(*a, *t) || a == t) continue;
    if ((c.originals != nullptr && c.originals[i] != nullptr) || c.IsDirty(a) || a->dtype() != t->dtype()) continue;
    return static_cast<int>(i);
  }
  return -1;
}

// The bytes [first, last) `t`'s elements span (strides of either sign); empty for no element.
inline std::pair<std::uintptr_t, std::uintptr_t> Extent(const Tensor &t) {
  std::uintptr_t lo = reinterpret_cast<std::uintptr_t>(TensorAccess::Read(t)), hi = lo;
  const ShapeVector &shape = t.shape();
  const ShapeVector strides = t.strides();
  const auto item = static_cast<std::intptr_t>(t.element_size());
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return {lo, lo};
    const std::intptr_t off = static_cast<std::intptr_t>((shape[d] - 1) * strides[d]) * item;
    (off < 0 ? lo : hi) += static_cast<std::uintptr_t>(off);
  }
  return {lo, hi + static_cast<std::uintptr_t>(item)};
}

// The new output that new output `j` is a view of, or -1: of the outputs over j's storage (same dtype, not
// j's tensor), the one spanning the most bytes (the first, of equal spans), if it spans all of j's and is
// not j. Each such group of outputs has one base; its other members are views of it ({y[2:], y}: y).
inline int ViewBase(const ContextState &c, const TensorPtrList &outs, std::size_t j) {
  const Tensor *t = outs[j].get();
  if (c.ArgIndex(t) >= 0) return -1;
  int best = -1;
  std::uintptr_t best_span = 0;
  for (std::size_t k = 0; k < outs.size(); ++k) {
    const Tensor *o = outs[k].get();
    if (!(k == j || (o != t && c.ArgIndex(o) < 0 && o->dtype() == t->dtype() && TensorAccess::SameStorage(*o, *t)))) {
      continue;
    }
    const auto e = Extent(*o);
    if (best < 0 || e.second - e.first > best_span) {
      best = static_cast<int>(k);
      best_span = e.second - e.first;
    }
  }
  if (best < 0 || static_cast<std::size_t>(best) == j) return -1;
  const auto b = Extent(*outs[static_cast<std::size_t>(best)]), e = Extent(*t);
  return b.first <= e.first && e.second <= b.second ? best : -1;
}

// A tensor sharing `t`'s memory but bound to no Python object.
inline TensorPtr Alias(const TensorPtr &t) { return NewTensor(*t); }

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
    // another framework's tensor it may not write now (call_rules.h ForeignRefusal): one taken straight,
    // after a call that kept nothing; or a torch tensor taken through dlpack_input, which reached Forward
    // as a read-only copy (its runtime.Tensor names it): asked only for read-only memory
    const Tensor &target = orig != nullptr ? *orig : *d;
    PyObject *caller = ExchangeOwner(target, *rt.api);
    if (caller == nullptr && !target.is_writable()) {
      caller = target.py_object();
      if (caller != nullptr && !PyObject_TypeCheck(caller, rt.tensor_type)) caller = nullptr;  // a bridge's own
    }
    if (caller != nullptr) {
      std::string why = ForeignRefusal(caller, name, static_cast<std::size_t>(i));
      if (!why.empty()) throw std::runtime_error(why);
    }
    if (!(orig != nullptr ? orig : d)->is_writable()) {
      // a private copy was written; the caller's own memory only by a Function that ignored is_writable():
      // that write happened, so it is counted (a gradient that saved this memory must not read it unseen)
      if (orig == nullptr && d->py_object() != nullptr) BumpVersion(rt, d->py_object());
      throw ValueError(name + ": argument " + std::to_string(i) +
                       " is read-only memory (a numpy array with writeable=False, a bytes buffer or a "
                       "read-only memory map), but Forward marked it dirty (an in-place write); pass a "
                       "writable copy, e.g. x * 1" +
                       (orig != nullptr ? std::string()
                                        : std::string(". Forward got that memory itself (kAcceptsViews) and wrote "
                                                      "it although is_writable() is false: its values have "
                                                      "changed; a Function that accepts views must check "
                                                      "is_writable() before writing")));
    }
    if (orig != nullptr) orig->copy_from(*d);
    if (d->py_object() != nullptr) BumpVersion(rt, d->py_object());
    if (void *h = ForeignHandle(orig != nullptr ? *orig : *d)) (*rt.bridge_slot)->bump_version(h);
    BumpProducerVersion(orig != nullptr ? *orig : *d, *rt.api);  // a torch tensor taken through DLPack
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
    for (const auto &d : c.dirty) dirty = dirty || WriteReaches(d.get(), a);  // the write explains the change
    if (dirty || Fingerprint(*a, phase) == fingerprints[i]) continue;
    const bool own = c.originals[i] == nullptr;  // else the write went to a private copy
    if (own && a->py_object() != nullptr) BumpVersion(rt, a->py_object());  // it did change
    if (own) BumpProducerVersion(*a, *rt.api);
    NoteWrites(c.writes);
    throw std::runtime_error(name + "::Forward modified argument " + std::to_string(i) +
                             " in place without MarkDirty; mark it (ctx->MarkDirty({tensor})) and return it, "
                             "or write the result to a new tensor");
  }
  for (const auto &d : c.dirty) {
    PyObject *p = d->py_object();
    // (a framework's tensor, inside a bridge call: the bridge asked its own rules before Forward)
    if (p == nullptr || !d->requires_grad() || !PyObject_TypeCheck(p, rt.tensor_type)) continue;
    PyRef node = PyRef::Steal(Check(PyObject_GetAttr(p, rt.s_node)));
    if (node.get() == Py_None) {
      throw std::runtime_error(name + " modifies argument " + std::to_string(c.ArgIndex(d.get())) +
                               " in place (MarkDirty), but it is a leaf that requires grad; in-place changes "
                               "of such leaves are not allowed (use a copy, e.g. x * 1)");
    }
  }
}

// The runtime's saved_tensors_hooks in force on this thread (runtime/autograd/saved_hooks.py): its
// (pack, unpack) pair, or null. None open in any thread (almost always): no thread-local lookup.
inline PyRef SavedTensorHooks(const Runtime &rt) {
  if (*rt.hooks_flag == 0) return PyRef();
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

// The edge to argument `t` (which requires grad): itself if a leaf, else (node, index). New reference.
OB_CORE_FN PyObject *EdgeOf(const Runtime &rt, PyObject *t);

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
inline void ProtectArg(ProtectedArgs &guard, const FunctionCall &f, std::size_t i, Refusal why,
                       std::string note = std::string()) {
  if (why != Refusal::kNone) guard.Add(i, why, f.args[i], f.originals[i] != nullptr, std::move(note));
}

// Before Forward, for a type that may write (KeepsForeign): per argument taken straight from another
// framework (a torch tensor through DLPack's C table), why that framework refuses a write into it now
// (call_rules.h ForeignRefusal); `out` stays empty when none is refused.
inline void ForeignRefusals(const Runtime &rt, const FunctionCall &f, std::vector<std::string> *out) {
  for (std::size_t i = 0; i < f.nargs; ++i) {
    if (f.args[i] == nullptr) continue;
    PyObject *owner = ExchangeOwner(*CallerArg(f, i), *rt.api);
    if (owner == nullptr) continue;
    std::string why = ForeignRefusal(owner, *f.name, i);
    if (why.empty()) continue;
    out->resize(f.nargs);
    (*out)[i] = std::move(why);
  }
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
    throw std::runtime_error(guard.MessageOf(static_cast<std::size_t>(i), *c.name));
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

}  // namespace detail
}  // namespace opbuilder

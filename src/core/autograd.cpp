// The core library's bodies of the functions opbuilder/autograd.h declares with OB_CORE_FN.
// Compiled once into libobcore (core_lib.cpp), or, in a build without the core library,
// inline in each operator: opbuilder/autograd.h includes this file at its end (detail/core_lib.h).
#include "opbuilder/autograd.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#if defined(__GNUG__)
#include <cxxabi.h>
#endif

#include "opbuilder/detail/function_runner.h"

namespace opbuilder {

namespace detail OB_HIDDEN {

OB_CORE_FN void ContextDeleter::operator()(AutogradContext *ctx) const { delete ctx; }

OB_CORE_FN std::string Demangle(const char *name) {
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

OB_CORE_FN std::string DisplayName(const char *mangled) {
  std::string n = Demangle(mangled);
  const std::string anon = "(anonymous namespace)::";
  for (std::size_t p; (p = n.find(anon)) != std::string::npos;) n.erase(p, anon.size());
  return n;
}

OB_CORE_FN TensorPtrList FinishNoGrad(const Runtime &rt, ContextState &c, TensorPtrList outs) {
  CheckOutputs(outs, *c.name);
  if (!c.dirty.empty()) FinishDirty(rt, c, outs);
  for (auto &o : outs) {
    const int i = c.ArgIndex(o.get());
    const int viewed = i < 0 && o->py_object() == nullptr ? ViewedArg(c, o.get()) : -1;
    if (viewed >= 0 && c.args[viewed]->py_object() != nullptr) {  // a view Forward built (RecordOutputs)
      PyRef obj = PyRef::Steal(ToPython(rt, o));
      ShareVersion(obj.get(), c.args[viewed]->py_object());
      continue;
    }
    if (i >= 0 && !c.IsDirty(o.get())) {
      // an argument returned unchanged: a new tensor over the caller's memory that shares its version
      // counter (call_rules.h), so a later write through either is seen by every check
      Tensor *caller = c.originals != nullptr && c.originals[i] != nullptr ? c.originals[i] : o.get();
      PyObject *arg = caller->py_object();
      o = std::make_shared<Tensor>(*caller);
      if (arg != nullptr) {
        PyRef obj = PyRef::Steal(ToPython(rt, o));
        ShareVersion(obj.get(), arg);
      }
    }
  }
  c.args = nullptr;
  c.originals = nullptr;
  c.nargs = 0;
  return outs;
}

// runtime.Tensor `obj`'s own version counter (runtime.versions.counter: one is made now if it reads the
// shared unwritten one), kept beside a weak reference to `obj`: once `obj` is gone (a local of the caller's
// loss function), a write into its memory still shows at backward. Null for another framework's tensor.
static PyRef OwnCounter(const Runtime &rt, PyObject *obj) {
  if (!PyObject_TypeCheck(obj, rt.tensor_type)) return PyRef();
  // constant-initialized (no static-init guard: the import may hand the GIL to a thread that comes here too)
  static std::atomic<PyObject *> counter{nullptr};
  return PyRef::Steal(Check(PyObject_CallOneArg(NativeFn(counter, "own_counter"), obj)));
}

// Saved argument `s`: each output over its memory (`s` itself returned, or a view Forward built on its
// storage) is watched, weakly, for a write a later check must see. A runtime.Tensor argument's own
// counter is shared by such outputs and checked through the slot; one of no runtime.Tensor (a numpy
// array, a torch tensor) has none, so each output's counter is held too, for when the output is gone.
static void WatchOutputsOver(const Runtime &rt, const Tensor &s, const TensorPtrList &outs,
                             PyObject *const *out_objs, SavedSlot &slot) {
  for (std::size_t j = 0; j < outs.size(); ++j) {
    if (outs[j].get() != &s && (slot.version_source.get() != nullptr || !TensorAccess::SameStorage(*outs[j], s))) {
      continue;
    }
    VersionWatch w;
    w.source = WeakRef(out_objs[j]);
    w.weak = true;
    w.version = PyVersion(rt, out_objs[j]);
    if (slot.version_source.get() == nullptr) w.counter = OwnCounter(rt, out_objs[j]);
    slot.aliases.push_back(std::move(w));
  }
}

// torch's rule: a Function that writes a view in place (MarkDirty) and returns more than one tensor is
// refused, since the view's base is rebased through one output only (each other output would run Backward
// again). Raised after Forward, as torch raises it; the write stays done and counted (FinishDirty).
static void CheckDirtyViewOutputs(const ContextState &c) {
  for (const auto &d : c.dirty) {
    PyObject *obj = d->py_object();
    if (obj == nullptr || c.IsNonDifferentiable(d.get()) || !IsDifferentiable(d->dtype())) continue;
    PyRef ref = BaseRefOf(obj);
    if (ref.get() == Py_None) continue;
    PyRef base = PyRef::Steal(Check(PyObject_CallObject(ref.get(), nullptr)));
    if (base.get() == Py_None) continue;  // its base is gone: nothing to rebase
    throw std::runtime_error(*c.name + ": Forward wrote argument " + std::to_string(c.ArgIndex(d.get())) +
                             " in place (MarkDirty), a view of another tensor, and returned more than one "
                             "tensor; as in torch, a Function that writes a view returns one tensor. Pass a "
                             "copy (x * 1), or split it into a Function that writes and returns only that "
                             "tensor and one that computes the rest");
  }
}

OB_CORE_FN TensorPtrList RecordOutputs(const Runtime &rt, std::unique_ptr<AutogradContext, ContextDeleter> ctx,
                                   const TensorPtrList &outs, PyObject *edges,
                                   const std::uint64_t *fingerprints, double phase, BackwardFn backward,
                                   ErrorFn set_error, PyObject *name_py) {
  ContextState &c = State(*ctx);
  CheckOutputs(outs, *c.name);
  CheckForwardWrites(rt, c, outs, fingerprints, phase);
  if (outs.size() > 1) CheckDirtyViewOutputs(c);

  auto state = std::make_unique<NodeState>();
  state->backward = backward;
  state->set_error = set_error;
  state->in_meta.reserve(c.nargs);
  for (std::size_t i = 0; i < c.nargs; ++i) state->in_meta.push_back(MetaOf(c.args[i]));
  state->out_meta.reserve(outs.size());
  for (const auto &t : outs) state->out_meta.push_back(MetaOf(t.get()));
  state->ctx = std::move(ctx);
  PyRef node = PyRef::Steal(NewNode(state.release(), edges, name_py));

  TensorPtrList result;
  result.reserve(outs.size());
  PyObject *out_objs_small[4];
  std::vector<PyObject *> out_objs_big;
  PyObject **out_objs = outs.size() <= 4 ? out_objs_small : (out_objs_big.resize(outs.size()), out_objs_big.data());
  for (std::size_t j = 0; j < outs.size(); ++j) {
    TensorPtr o = outs[j];
    const int ai = c.ArgIndex(o.get());
    const bool is_arg = ai >= 0;
    // a new tensor returned again: an alias of the same memory (each output its own gradient slot, as on JAX)
    // that counts writes on the first one's counter, so a write through either is seen by every check
    const int first = is_arg ? -1 : RepeatOf(outs, j);
    // a new tensor Forward built over an argument's memory: a view of it, as torch's Function's x[:1] is
    // (the argument's counter and base), so a later write into the argument is seen by what saved the view
    const int viewed = is_arg || first >= 0 ? -1 : ViewedArg(c, o.get());
    int viewed_out = -1;  // ... or over an earlier new output's ({y, y[:2]}): a view of that output
    for (std::size_t k = 0; k < j && !is_arg && first < 0 && viewed < 0 && viewed_out < 0; ++k) {
      if (c.ArgIndex(outs[k].get()) < 0 && outs[k]->dtype() == o->dtype() && TensorAccess::SameStorage(*outs[k], *o)) {
        viewed_out = static_cast<int>(k);
      }
    }
    PyObject *unchanged_arg = nullptr;  // the caller's object of an argument returned unchanged
    if (is_arg && !c.IsDirty(o.get())) {
      Tensor *caller = c.originals != nullptr && c.originals[ai] != nullptr ? c.originals[ai] : o.get();
      unchanged_arg = caller->py_object();
      o = std::make_shared<Tensor>(*caller);  // over the caller's memory, never Forward's private copy
    } else if (!(is_arg && c.IsDirty(o.get()) && o->py_object() != nullptr) && (is_arg || o->py_object() != nullptr)) {
      o = Alias(o);  // never rewrite the history of a tensor that is not ours, unless in place
    }
    PyRef obj = PyRef::Steal(ToPython(rt, o));
    if (unchanged_arg != nullptr) ShareVersion(obj.get(), unchanged_arg);
    if (first >= 0) ShareCounter(obj.get(), out_objs[first]);
    if (viewed >= 0) ShareVersion(obj.get(), c.args[viewed]->py_object());
    if (viewed_out >= 0) ShareCounter(obj.get(), out_objs[viewed_out]);  // (its counter; each output its own history)
    if (!c.IsNonDifferentiable(outs[j].get()) && IsDifferentiable(o->dtype())) {  // integer outputs: no gradient
      Check(PyObject_SetAttr(obj.get(), rt.s_node, node.get()));
      if (j != 0) {  // 0 is the class default
        PyRef idx = PyRef::Steal(Check(PyLong_FromSize_t(j)));
        Check(PyObject_SetAttr(obj.get(), rt.s_out_index, idx.get()));
      }
      Check(PyObject_SetAttr(obj.get(), rt.s_requires_grad, Py_True));
      TensorAccess::SetRequiresGrad(*o, true);
    }
    out_objs[j] = obj.get();  // kept alive by `result`
    result.push_back(std::move(o));
  }

  // Saved tensors: outputs are held without their Python object (a weak
  // reference tracks their version), so the node does not keep itself alive.
  c.saved.clear();
  c.saved.reserve(c.saved_raw.size());
  for (const auto &s : c.saved_raw) {
    SavedSlot slot;
    if (s) {
      const int oj = IndexOf(outs, s.get());
      if (oj >= 0 && c.ArgIndex(s.get()) >= 0 && !c.IsDirty(s.get())) {
        // an argument returned unchanged: its own version, and each output over it
        slot.tensor = s;
        if (PyObject *p = s->py_object()) {
          slot.version_source = PyRef::Borrow(p);
          slot.version = PyVersion(rt, p);
        }
        WatchOutputsOver(rt, *s, outs, out_objs, slot);
      } else if (oj >= 0) {
        PyObject *obj = out_objs[oj];
        slot.tensor = Alias(s);
        slot.version_source = WeakRef(obj);
        slot.weak = true;
        slot.version = PyVersion(rt, obj);
        slot.counter = OwnCounter(rt, obj);
      } else {
        slot.tensor = s;
        if (PyObject *p = s->py_object()) {
          slot.version_source = PyRef::Borrow(p);
          slot.version = PyVersion(rt, p);
        } else if (c.ArgIndex(s.get()) >= 0) {  // an argument of no runtime.Tensor: views Forward returned
          WatchOutputsOver(rt, *s, outs, out_objs, slot);
        }
      }
    }
    c.saved.push_back(std::move(slot));
  }
  c.saved_raw.clear();
  c.saved_final = true;
  if (PyRef hooks = SavedTensorHooks(rt)) PackSaved(rt, c, hooks.get());
  // a view written in place (MarkDirty) that is now this node's output: its base's history is rebased
  for (std::size_t k = 0; k < c.dirty.size(); ++k) {
    const Tensor *d = c.dirty[k].get();
    bool seen = false;
    for (std::size_t m = 0; m < k; ++m) seen = seen || c.dirty[m].get() == d;
    if (seen || d->py_object() == nullptr || c.IsNonDifferentiable(d) || !IsDifferentiable(d->dtype())) continue;
    RebaseView(d->py_object(), static_cast<std::size_t>(c.ArgIndex(d)));
  }
  c.args = nullptr;  // Backward uses NeedsInputGrad(i); do not keep arguments alive
  c.originals = nullptr;
  c.nargs = 0;
  // Only Apply reads these. A dirty input is now an output of this node: holding it here
  // would make a cycle (tensor -> node -> ctx -> tensor) that the collector cannot see.
  TensorPtrList().swap(c.dirty);
  TensorPtrList().swap(c.non_differentiable);
  return result;
}

OB_CORE_FN PyObject *EdgeOf(const Runtime &rt, PyObject *t) {
  PyRef node = PyRef::Steal(Check(PyObject_GetAttr(t, rt.s_node)));
  if (node.get() == Py_None) {
    Py_INCREF(t);
    return t;
  }
  PyRef idx = PyRef::Steal(Check(PyObject_GetAttr(t, rt.s_out_index)));
  return Check(PyTuple_Pack(2, node.get(), idx.get()));
}

OB_CORE_FN TensorPtr PrivateCopy(const Tensor &t) {
  TensorPtr c = t.contiguous_copy();
  TensorAccess::SetRequiresGrad(*c, t.requires_grad());
  if (PyObject *o = t.py_object()) TensorAccess::BindPython(*c, PyRef::Borrow(o));
  return c;
}

struct ArgCopies::Listed {
  std::vector<std::pair<TensorPtr, TensorPtr>> copies;
};

namespace {

// One caller's tensor at two places: one C++ Tensor, two of one runtime.Tensor, or of one framework tensor.
bool SameCaller(const Tensor &a, const Tensor &b) {
  if (&a == &b || (a.py_object() != nullptr && a.py_object() == b.py_object())) return true;
  void *h = ForeignHandle(a);
  return h != nullptr && h == ForeignHandle(b);
}

bool SameElements(const Tensor &a, const Tensor &b) {
  return SameCaller(a, b) || (a.data_ptr() == b.data_ptr() && a.dtype() == b.dtype() && SameLayout(a, b));
}

// The copy `made` holds of the same elements as `caller` already (`skip`: the argument asking), or null;
// *of: the caller's tensor it was made for.
const TensorPtr *CopyMade(const ArgCopies &made, const Tensor &caller, std::size_t skip, const Tensor **of) {
  for (std::size_t j = 0; j < made.n; ++j) {
    if (j != skip && made.origs[j] != nullptr && made.copies[j] && SameElements(*made.origs[j], caller)) {
      *of = made.origs[j];
      return &made.copies[j];
    }
  }
  if (made.listed != nullptr) {
    for (const auto &e : made.listed->copies) {
      if (SameElements(*e.first, caller)) {
        *of = e.first.get();
        return &e.second;
      }
    }
  }
  return nullptr;
}

// What `caller` gets where a copy of its elements was made for `of`: that copy for the same caller; for
// another (two views of the same elements, two leaves over one buffer) a Tensor of its own over the copy's
// memory, bound to `caller` as PrivateCopy binds: a write through one is what the other reads, and each
// keeps its own gradient edge.
TensorPtr Shared(const TensorPtr &copy, const Tensor &of, const Tensor &caller) {
  if (SameCaller(of, caller)) return copy;
  TensorPtr c = NewTensor(*copy);
  TensorAccess::SetRequiresGrad(*c, caller.requires_grad());
  PyObject *o = caller.py_object();
  TensorAccess::BindPython(*c, o != nullptr ? PyRef::Borrow(o) : PyRef());
  return c;
}

}  // namespace

OB_CORE_FN const TensorPtr &ArgCopies::For(Tensor *caller, std::size_t i) {
  origs[i] = caller;
  const Tensor *of = nullptr;
  const TensorPtr *got = CopyMade(*this, *caller, i, &of);
  return copies[i] = got != nullptr ? Shared(*got, *of, *caller) : PrivateCopy(*caller);
}

OB_CORE_FN TensorPtr ArgCopies::ForListed(const TensorPtr &caller) {
  const Tensor *of = nullptr;
  if (const TensorPtr *got = CopyMade(*this, *caller, n, &of)) return Shared(*got, *of, *caller);
  if (listed == nullptr) listed = new Listed();
  listed->copies.emplace_back(caller, PrivateCopy(*caller));
  return listed->copies.back().second;
}

OB_CORE_FN void ArgCopies::FreeListed(Listed *listed) { delete listed; }

}  // namespace detail

OB_CORE_FN AutogradContext::~AutogradContext() = default;

OB_CORE_FN void AutogradContext::SaveForBackward(TensorPtrList tensors) { st_.saved_raw = std::move(tensors); }

OB_CORE_FN void AutogradContext::MarkNonDifferentiable(const TensorPtrList &outputs) {
  st_.non_differentiable.insert(st_.non_differentiable.end(), outputs.begin(), outputs.end());
}

OB_CORE_FN void AutogradContext::MarkDirty(const TensorPtrList &inputs) {
  st_.dirty.insert(st_.dirty.end(), inputs.begin(), inputs.end());
  detail::NoteWrites(st_.writes);  // this Function type writes: its later calls keep what a refusal puts back
}

OB_CORE_FN bool AutogradContext::NeedGrad(const TensorPtr &tensor) const {
  if (st_.args == nullptr) {
    throw std::runtime_error(function_name() +
                             ": NeedGrad(tensor) works inside Forward; in Backward use NeedsInputGrad(i)");
  }
  const int i = st_.ArgIndex(tensor.get());
  return i >= 0 && NeedsInputGrad(static_cast<std::size_t>(i));
}

OB_CORE_FN TensorPtrList AutogradContext::GetSavedTensors() const {
  const detail::ContextState &st = st_;
  if (st.released) {
    throw std::runtime_error(function_name() +
                             ": saved tensors were freed after the first backward; pass retain_graph=True");
  }
  if (!st.saved_final) return st.saved_raw;  // inside Forward
  detail::GilForRefcount gil;  // versions live in Python objects; Backward may have released the GIL
  const auto &rt = detail::Runtime::Get();
  TensorPtrList out;
  out.reserve(st.saved.size());
  for (std::size_t i = 0; i < st.saved.size(); ++i) {
    const detail::SavedSlot &s = st.saved[i];
    if (s.packed) {  // what torch's unpack hook gives back; unchecked, as torch checks no hooked tensor's version
      out.push_back(detail::UnpackForeignSaved(**rt.bridge_slot, s.packed.get()));
      continue;
    }
    if (s.hooked) {  // the runtime's saved_tensors_hooks: what unpack returns, unchecked likewise
      detail::PyRef t = detail::PyRef::Steal(detail::Check(
          PyObject_CallOneArg(PyTuple_GET_ITEM(s.hooked.get(), 0), PyTuple_GET_ITEM(s.hooked.get(), 1))));
      if (!PyObject_TypeCheck(t.get(), rt.tensor_type)) {
        throw detail::TypeError(function_name() + ": the saved_tensors_hooks unpack hook returned a " +
                                detail::TypeNameOf(t.get()) + " for saved slot " + std::to_string(i) +
                                "; it must return a runtime.Tensor");
      }
      out.push_back(detail::TensorFromPy(rt, t.get()));
      continue;
    }
    if (s.watch) {
      const std::int64_t now = (*rt.bridge_slot)->watched(s.watch.get());
      if (now != s.version) VersionError(i, now, s.version);
    }
    CheckSavedVersion(rt, i, s.version_source.get(), s.weak, s.version, s.counter.get());
    for (const auto &w : s.aliases) CheckSavedVersion(rt, i, w.source.get(), w.weak, w.version, w.counter.get());
    out.push_back(s.tensor);
  }
  return out;
}

namespace detail OB_HIDDEN {

OB_CORE_FN int ForeignBackward(void *state, const ForeignTensor *grads, std::size_t ngrads, ForeignTensor *out,
                               void **keep, std::size_t nargs) noexcept {
  auto *s = static_cast<ForeignNodeState *>(state);
  for (std::size_t i = 0; i < nargs; ++i) {
    out[i] = ForeignTensor{nullptr, nullptr, nullptr, -1, 0, 0, nullptr, -1};
    keep[i] = nullptr;
  }
  try {
    TensorPtrList gl;
    gl.reserve(ngrads);
    for (std::size_t j = 0; j < ngrads; ++j) {
      gl.push_back(grads[j].ndim < 0 ? nullptr : TensorFromForeign(*s->api, grads[j], false));
    }
    const ContextState &st = State(*s->ctx);
    const std::string &name = *st.name;
    if (st.released) {  // the framework freed the node's saved state (no retain_graph): its rule and words
      throw std::runtime_error(
          "Trying to backward through the graph a second time (or directly access saved tensors after they have "
          "already been freed). Saved intermediate values of the graph are freed when you call .backward() or "
          "autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or "
          "if you need to access saved tensors after calling backward.");
    }
    TensorPtrList res = s->backward(s->ctx.get(), std::move(gl));
    const std::size_t n = res.size();
    for (std::size_t i = n; i < nargs; ++i) {
      if (i < st.needs.size() && st.needs[i]) {
        throw std::runtime_error("backward of " + name + " returned " + std::to_string(n) +
                                 " gradients, but its forward took " + std::to_string(nargs) + " arguments and argument " +
                                 std::to_string(i) + " needs a gradient (return one gradient, or None, per argument)");
      }
    }
    for (std::size_t i = nargs; i < n; ++i) {
      if (res[i]) {
        throw std::runtime_error("backward of " + name + " returned " + std::to_string(n) +
                                 " gradients, but its forward took " + std::to_string(nargs) +
                                 " arguments (expected one gradient, or None, per argument)");
      }
    }
    const Runtime &rt = Runtime::Get();
    for (std::size_t i = 0; i < n && i < nargs; ++i) {
      if (!res[i]) continue;
      const TensorMeta &m = s->in_meta[i];
      if (!m.is_tensor) {
        throw std::runtime_error("backward of " + name + " returned a gradient for argument " + std::to_string(i) +
                                 ", which is not a tensor");
      }
      if (i >= st.needs.size() || !st.needs[i]) continue;  // nothing to send it to
      if (res[i]->dtype() != m.dtype) {
        throw TypeError("backward of " + name + " returned a gradient of dtype " + DataTypeName(res[i]->dtype()) +
                        " for argument " + std::to_string(i) + ", whose dtype is " + DataTypeName(m.dtype));
      }
      // a gradient owns its memory: a saved or input tensor, or a view of an incoming gradient, goes
      // out as a copy; an incoming gradient itself goes back as torch's own tensor (the bridge)
      TensorPtr r = IsIncoming(*res[i], grads, ngrads) || FreshGradient(rt, res[i]) ? res[i] : res[i]->contiguous_copy();
      out[i] = ForeignOf(*r);
      keep[i] = out[i].handle;
    }
    return 0;
  } catch (...) {
    for (std::size_t i = 0; i < nargs; ++i) {
      if (keep[i] != nullptr) DropForeignKeep(keep[i]);
      keep[i] = nullptr;
      out[i].ndim = -1;
    }
    s->set_error();
    return -1;
  }
}

OB_CORE_FN void ForeignRelease(void *state) noexcept {
  ContextRelease(*static_cast<ForeignNodeState *>(state)->ctx);
}

OB_CORE_FN void ForeignDestroy(void *state) noexcept {
  delete static_cast<ForeignNodeState *>(state);
}

// Output `out` of a call through a bridge, bound to the framework tensor it is returned as: a dirty
// argument's own object (`*own` set to 1), a view of an argument returned unchanged, or a new framework
// tensor over its memory. `attach` (recording): the object the node attaches to, if `differentiable`.
// Forward raised. What it wrote stays written, as after a framework's own in-place op that fails midway,
// but a refusal writes nothing: refused arguments get their values back. Each other argument of the
// caller's memory that Forward changed counts one write, so a tensor saved from it fails its version
// check instead of giving a gradient of other values: a recording call tells a change by the
// arguments' `fingerprints`; a call that took none counts the arguments Forward marked dirty (it said
// it wrote them). Never throws (the Forward's error is the one raised).
[[gnu::cold]] static void AfterForwardError(const Runtime &rt, const ContextState &st, const FunctionCall &f,
                                            const ProtectedArgs *guard, const std::uint64_t *fingerprints,
                                            double phase) noexcept {
  try {
    if (guard != nullptr) guard->Restore();
    for (std::size_t i = 0; i < f.nargs; ++i) {
      Tensor *a = f.args[i];
      if (a == nullptr || f.originals[i] != nullptr) continue;  // (a private copy: the caller's is as it was)
      if (guard != nullptr && guard->RefusalOf(i) != Refusal::kNone) continue;  // put back
      const bool wrote = fingerprints != nullptr ? Fingerprint(*a, phase) != fingerprints[i] : st.IsDirty(a);
      if (!wrote) continue;
      if (a->py_object() != nullptr) BumpVersion(rt, a->py_object());
      if (void *h = ForeignHandle(*a)) (*rt.bridge_slot)->bump_version(h);
      BumpProducerVersion(*a, *rt.api);
    }
  } catch (...) {
  }
}

// f.forward, with AfterForwardError if it raises (inlined: the calls that raise nothing pay nothing).
[[gnu::always_inline]] static inline void ForwardCounted(const Runtime &rt, const FunctionCall &f, AutogradContext *ctx, TensorPtr *single,
                           TensorPtrList *list, const ProtectedArgs *guard = nullptr,
                           const std::uint64_t *fingerprints = nullptr, double phase = 0) {
  try {
    f.forward(ctx, f.call, single, list);
  } catch (...) {
    AfterForwardError(rt, State(*ctx), f, guard, fingerprints, phase);
    throw;
  }
}

static TensorPtr ForeignOutput(const ForeignApi &api, const ContextState &st, const FunctionCall &f, TensorPtr out,
                               bool differentiable, PyObject **attach, int *own, PyObject *view_of = nullptr) {
  const int ai = st.ArgIndex(out.get());
  const std::size_t a = static_cast<std::size_t>(ai);
  void *dirty = ai >= 0 && st.IsDirty(out.get()) ? ForeignHandle(*CallerArg(f, a)) : nullptr;
  // an argument returned unchanged (the caller's own, not a private copy): a view of the caller's
  // tensor, as torch's Functions return it, so that the two share a version counter
  void *same = ai >= 0 && dirty == nullptr && f.originals[a] == nullptr ? ForeignHandle(*CallerArg(f, a)) : nullptr;
  // a new tensor Forward built on an argument's storage (ViewedArg; or, given, an earlier output's): a
  // view of the caller's tensor, as torch's Function's x[:1] is (its counter, its base)
  PyRef base;
  if (ai < 0 && view_of == nullptr) {
    const int vi = ViewedArg(st, out.get());
    void *h = vi >= 0 && st.args[vi]->dtype() == out->dtype() ? ForeignHandle(*CallerArg(f, static_cast<std::size_t>(vi)))
                                                               : nullptr;
    if (h != nullptr) {
      base = PyRef::Steal(Check(api.object_of(h)));
      view_of = base.get();
    }
  }
  // bound to its object below: never a tensor Forward (or ctx) holds. One that nothing else holds (a new
  // output) and that is bound to no object is bound itself: no other owner can see the difference.
  TensorPtr o = out.use_count() == 1 && out->py_object() == nullptr ? std::move(out) : Alias(out);
  PyRef obj;
  if (dirty != nullptr) {
    if (own != nullptr) *own = 1;
    obj = PyRef::Steal(Check(api.object_of(dirty)));
  } else if (same != nullptr) {
    obj = PyRef::Steal(Check(api.alias(same)));
  } else if (view_of != nullptr) {
    const ForeignTensor like = ForeignOf(*o);  // (its handle, a ForeignKeep, is dropped below)
    obj = PyRef::Steal(api.view(view_of, &like));
    DropForeignKeep(like.handle);
    if (obj.get() == nullptr && PyErr_Occurred() != nullptr) throw PythonError();
  }
  if (obj.get() == nullptr) {  // new memory, or a view the framework has no form of (negative strides)
    obj = PyRef::Steal(WrapForeign(api, *o));
  }
  if (attach != nullptr && differentiable && IsDifferentiable(o->dtype())) *attach = obj.get();
  TensorAccess::BindPython(*o, std::move(obj));
  return o;
}

OB_CORE_FN void RunFunctionForeign(const Runtime &rt, const ForeignApi &api, const FunctionCall &f,
                                   TensorPtr *single, TensorPtrList *list) {
  bool wants = false;
  for (std::size_t i = 0; i < f.nargs; ++i) wants = wants || ForeignWantsGrad(CallerArg(f, i));
  const bool record = wants && api.grad_enabled() != 0;
  // a recorded call's context goes to its node (heap); a no-grad call's ends with the call (stack)
  std::unique_ptr<AutogradContext, ContextDeleter> heap_ctx(record ? new AutogradContext : nullptr);
  std::optional<AutogradContext> local_ctx;
  AutogradContext *const ctx = record ? heap_ctx.get() : &local_ctx.emplace();
  ContextState &st = State(*ctx);
  BeginContext(st, f);
  std::vector<void *> inputs;  // filled only while recording (as attach and dirty below): no allocation otherwise
  std::vector<std::uint64_t> fingerprints;
  double phase = 0;
  // torch's rule, decided before Forward (call_rules.h): an expanded (stride-0) argument is never
  // written; a refused write is undone before the error (torch's leaf and view rules: record()).
  // What a write would be refused for is kept only where the Function type may write (KeepsArguments).
  const bool keeps = KeepsArguments(f.writes);
  std::optional<ProtectedArgs> guard;  // made only for a call with an argument to protect
  std::vector<std::string> refused;  // per argument while recording: torch's refusal of a write into it, if any
  for (std::size_t i = 0; keeps && i < f.nargs; ++i) {
    if (f.args[i] != nullptr && HasInternalOverlap(*CallerArg(f, i))) {
      ProtectArg(guard ? *guard : guard.emplace(), f, i, Refusal::kOverlap);
    } else if (record && ForeignWantsGrad(CallerArg(f, i))) {  // a leaf that requires grad, a view of one, ...
      if (const char *why = api.write_refusal(ForeignHandle(*CallerArg(f, i)))) {
        refused.resize(f.nargs);
        refused[i] = why;
        ProtectArg(guard ? *guard : guard.emplace(), f, i, Refusal::kLeaf);
      }
    }
  }
  if (record) {
    inputs.assign(f.nargs, nullptr);
    fingerprints.assign(f.nargs + 1, 0);
    st.needs.assign(f.nargs, false);
    for (std::size_t i = 0; i < f.nargs; ++i) {
      if (!ForeignWantsGrad(CallerArg(f, i))) continue;
      st.needs[i] = true;
      inputs[i] = ForeignHandle(*CallerArg(f, i));
    }
    phase = NextFingerprintPhase();
    for (std::size_t i = 0; i < f.nargs; ++i) {
      if (f.args[i] != nullptr) fingerprints[i] = Fingerprint(*f.args[i], phase);
    }
    const int prev = api.set_grad_enabled(0);
    try {
      ForwardCounted(rt, f, ctx, single, list, guard ? &*guard : nullptr, fingerprints.data(), phase);
    } catch (...) {
      api.set_grad_enabled(prev);
      throw;
    }
    api.set_grad_enabled(prev);
  } else {
    ForwardCounted(rt, f, ctx, single, list, guard ? &*guard : nullptr);
  }
  for (const auto &d : st.dirty) {  // torch's refusal, in its words, with what Forward wrote undone
    const int i = st.ArgIndex(d.get());
    if (i < 0 || static_cast<std::size_t>(i) >= refused.size() || refused[i].empty()) continue;
    guard->Restore();
    throw std::runtime_error(*f.name + ": " + refused[i]);
  }
  if (guard) {
    CheckRefusals(st, *guard);
  } else if (!keeps && !st.dirty.empty()) {  // the same rules, decided now: nothing was kept
    LateRefusal(rt, st, f, false, [&](std::size_t i) -> std::string {
      if (f.args[i] != nullptr && HasInternalOverlap(*CallerArg(f, i))) return RefusalMessage(Refusal::kOverlap, *f.name, i);
      if (!record || !ForeignWantsGrad(CallerArg(f, i))) return std::string();
      const char *why = api.write_refusal(ForeignHandle(*CallerArg(f, i)));
      return why == nullptr ? std::string() : *f.name + ": " + why;
    });
  }
  if (!record && single != nullptr && st.dirty.empty()) {  // the common call: one output, nothing written
    if (!*single) throw std::runtime_error(*f.name + "::Forward returned a null tensor as output 0");
    *single = ForeignOutput(api, st, f, std::move(*single), false, nullptr, nullptr);
    return;
  }
  const TensorPtrList outs = single != nullptr ? AsList(std::move(*single)) : std::move(*list);
  CheckOutputs(outs, *f.name);
  if (record) {
    CheckForwardWrites(rt, st, outs, fingerprints.data(), phase);
  } else if (!st.dirty.empty()) {
    FinishDirty(rt, st, outs);
  }
  TensorPtrList result(outs.size());
  std::vector<PyObject *> attach;
  std::vector<int> dirty;
  if (record) {
    attach.assign(outs.size(), nullptr);
    dirty.assign(outs.size(), 0);
  }
  // views of other outputs after their bases ({y[2:], y}: y first), repeats after what they repeat
  std::vector<int> base(outs.size(), -1);
  for (std::size_t j = 0; j < outs.size(); ++j) base[j] = RepeatOf(outs, j) < 0 ? ViewBase(st, outs, j) : -1;
  for (int pass = 0; pass < 2; ++pass) {
    for (std::size_t j = 0; j < outs.size(); ++j) {
      const int first = st.ArgIndex(outs[j].get()) < 0 ? RepeatOf(outs, j) : -1;
      if ((base[j] >= 0 || first >= 0) != (pass == 1)) continue;
      if (first >= 0) {  // a new tensor returned again: the same framework tensor, as torch's Function returns it
        const std::size_t k = static_cast<std::size_t>(first);
        result[j] = result[k];
        if (record) {  // the node's later output (torch gives its gradient to the last)
          attach[j] = attach[k];
          dirty[j] = dirty[k];
        }
        continue;
      }
      int own = 0;
      PyObject *view_of = base[j] >= 0 ? result[static_cast<std::size_t>(base[j])]->py_object() : nullptr;
      result[j] = ForeignOutput(api, st, f, outs[j], record && !st.IsNonDifferentiable(outs[j].get()),
                                record ? &attach[j] : nullptr, &own, view_of);
      if (record && own != 0) {  // 1 + the argument's index (the bridge puts a written view's edge first)
        const int ai = st.ArgIndex(outs[j].get());
        dirty[j] = ai >= 0 ? 1 + ai : 1;
      }
    }
  }

  if (record) {
    auto state = std::make_unique<ForeignNodeState>();
    state->api = &api;
    state->backward = f.backward;
    state->set_error = f.set_error;
    state->in_meta.reserve(f.nargs);
    for (std::size_t i = 0; i < f.nargs; ++i) state->in_meta.push_back(MetaOf(f.args[i]));
    st.saved.clear();
    st.saved.reserve(st.saved_raw.size());
    const bool hooked = api.hooks_active() != 0;  // saved_tensors_hooks: what is saved goes through them
    for (const auto &s : st.saved_raw) {
      SavedSlot slot;
      if (s && hooked) {
        // a new framework tensor over the saved memory (a dirty one's as Forward left it) is packed
        PyRef obj = PyRef::Steal(WrapForeign(api, st.IsDirty(s.get()) ? *s->contiguous_copy() : *s));
        void *packed = api.pack(obj.get());
        if (packed == nullptr) throw PythonError();
        slot.packed = std::shared_ptr<void>(packed, [drop = api.drop_saved](void *p) { drop(p); });
        st.saved.push_back(std::move(slot));
        continue;
      }
      const int oj = s ? IndexOf(outs, s.get()) : -1;
      if (s && st.IsDirty(s.get())) {
        slot.tensor = s->contiguous_copy();  // the caller's tensor now has this node as its history
        // torch checks a saved dirty tensor's version as any other's: the caller's counter, as the
        // write left it (a later write into it, or into its base, is refused at backward)
        const int ai = oj < 0 ? st.ArgIndex(s.get()) : -1;
        PyObject *caller = oj >= 0 ? result[static_cast<std::size_t>(oj)]->py_object() : nullptr;
        PyRef held;
        if (caller == nullptr && ai >= 0) {
          if (void *h = ForeignHandle(*CallerArg(f, static_cast<std::size_t>(ai)))) {
            held = PyRef::Steal(Check(api.object_of(h)));
            caller = held.get();
          }
        }
        if (caller != nullptr) WatchVersion(api, caller, slot);
      } else if (oj >= 0) {
        // an output: held without its object (that would hold the node), its version counter watched
        slot.tensor = Alias(s);
        WatchVersion(api, result[static_cast<std::size_t>(oj)]->py_object(), slot);
      } else if (s) {
        slot.tensor = s;
        if (void *h = ForeignHandle(*s)) WatchVersion(api, PyRef::Steal(Check(api.object_of(h))).get(), slot);
      }
      st.saved.push_back(std::move(slot));
    }
    st.saved_raw.clear();
    st.saved_final = true;
    // the arguments written in place whose framework tensor the node is attached to: they require grad
    // from now on (torch's x.add_(y) makes x require grad when y does), so a later Apply in the same
    // bound function takes them with their new history (ForeignWantsGrad)
    std::vector<Tensor *> rebased;
    for (std::size_t j = 0; j < outs.size(); ++j) {
      const int ai = dirty[j] != 0 && attach[j] != nullptr ? st.ArgIndex(outs[j].get()) : -1;
      if (ai >= 0) rebased.push_back(CallerArg(f, static_cast<std::size_t>(ai)));
    }
    st.args = nullptr;
    st.originals = nullptr;
    st.nargs = 0;
    TensorPtrList().swap(st.dirty);
    TensorPtrList().swap(st.non_differentiable);
    const int materialize = st.materialize_grads ? 1 : 0;
    state->ctx = std::move(heap_ctx);
    const ForeignNode node{state.release(), f.name->c_str(), f.nargs,     inputs.data(),   outs.size(),
                           attach.data(),   dirty.data(),     materialize, &ForeignBackward, &DropForeignKeep,
                           &ForeignRelease, &ForeignDestroy};
    if (api.record(&node) != 0) throw PythonError();
    // an output the node is attached to is that framework tensor from now on, as an argument unpacked
    // from the caller is: a later Apply in the same bound function (Mul::Apply(Mul::Apply(x, y), y))
    // then takes it with its history (ForeignWantsGrad, its handle as the input edge)
    for (std::size_t j = 0; j < outs.size(); ++j) {
      if (attach[j] == nullptr || dirty[j] != 0) continue;  // a dirty output is the caller's own tensor
      ForeignTensor ft;
      const int got = api.unpack(attach[j], &ft);
      if (got < 0) throw PythonError();
      if (got == 0) continue;
      TensorPtr over = TensorFromForeign(api, ft, true);
      TensorAccess::BindPython(*over, PyRef::Borrow(attach[j]));
      result[j] = std::move(over);
    }
    for (Tensor *t : rebased) TensorAccess::SetRequiresGrad(*t, true);
    NoteReadOnlyCall(f.writes);  // a recorded call completed: unless MarkDirty said otherwise, it wrote none
  }
  if (single != nullptr) {
    *single = std::move(result[0]);
  } else {
    *list = std::move(result);
  }
}

// A no-grad call's result: a written argument, an argument returned, a view Forward built of one, or a
// null result is finished by the rules of FinishNoGrad; any other single output is returned as Forward made it.
static void FinishNoGradCall(const Runtime &rt, ContextState &st, TensorPtr *single, TensorPtrList *list) {
  if (single == nullptr) {
    *list = FinishNoGrad(rt, st, std::move(*list));
  } else if (!st.dirty.empty() || !*single || st.ArgIndex(single->get()) >= 0 ||
             ((*single)->py_object() == nullptr && ViewedArg(st, single->get()) >= 0)) {
    *single = std::move(FinishNoGrad(rt, st, AsList(std::move(*single)))[0]);
  }
}

// A no-grad call with an argument a write would be refused for (internal overlap, a view made under
// no_grad; `no_grad_views` by index): that argument is kept before Forward and put back before the
// refusal is raised. Apart from RunFunction so that the common call does not build the guard.
[[gnu::noinline]] static void RunNoGradGuarded(const Runtime &rt, const FunctionCall &f, TensorPtr *single,
                                               TensorPtrList *list, std::uint64_t no_grad_views,
                                               std::vector<std::string> &foreign) {
  ProtectedArgs guard;
  for (std::size_t i = 0; i < f.nargs; ++i) {
    if (f.args[i] == nullptr) continue;
    const bool view = i < 64 && ((no_grad_views >> i) & 1U) != 0;
    const bool refused = i < foreign.size() && !foreign[i].empty();  // another framework's rule
    const Refusal why = HasInternalOverlap(*CallerArg(f, i)) ? Refusal::kOverlap
                        : view                               ? Refusal::kNoGradView
                        : refused                            ? Refusal::kForeign
                                                             : Refusal::kNone;
    ProtectArg(guard, f, i, why, refused ? std::move(foreign[i]) : std::string());
  }
  AutogradContext ctx;
  ContextState &st = State(ctx);
  BeginContext(st, f);
  ForwardCounted(rt, f, &ctx, single, list, &guard);
  CheckRefusals(st, guard);
  if (st.dirty.empty()) NoteNoDirtyCall(f.writes);
  FinishNoGradCall(rt, st, single, list);
}

OB_CORE_FN void RunFunction(const Runtime &rt, const FunctionCall &f, TensorPtr *single,
                            TensorPtrList *list) {
  if (const ForeignApi *api = ActiveBridge(rt)) return RunFunctionForeign(rt, *api, f, single, list);
  bool wants = false;
  bool strided = false;             // an argument that is not contiguous (it may overlap itself)
  std::uint64_t no_grad_views = 0;  // arguments a write is refused for: views made under no_grad (call_rules.h)
  for (std::size_t i = 0; i < f.nargs; ++i) {
    Tensor *t = f.args[i];
    if (t == nullptr) continue;
    // a view read after a write into its base gets its history anew (call_rules.h RefreshViewArg)
    if (IsViewObject(rt, t->py_object()) && RefreshViewArg(t, f.originals[i]) && i < 64) {
      no_grad_views |= std::uint64_t{1} << i;
    }
    strided = strided || !CallerArg(f, i)->is_contiguous();
    wants = wants || WantsGrad(t);
    const Tensor *c = CallerArg(f, i);
    if (c->requires_grad() && c->py_object() == nullptr) {
      // a torch tensor a to_torch call unpacked, on a thread its bridge's call marker does not reach (a
      // std::thread in the bound function): the call is that bridge's, recorded in torch's graph as
      // torch records its own ops on any thread (with that thread's grad mode, as torch's)
      if (const auto *o = std::get_deleter<ForeignOwner>(c->storage())) {
        return RunFunctionForeign(rt, *o->api, f, single, list);
      }
    }
  }
  auto no_grad_view = [&](std::size_t i) { return i < 64 && ((no_grad_views >> i) & 1U) != 0; };
  // a torch tensor taken straight (DLPack) that torch would not let the op write now (call_rules.h)
  std::vector<std::string> foreign;
  if (KeepsForeign(f.writes)) ForeignRefusals(rt, f, &foreign);
  if (!wants || !GradEnabled(rt)) {  // the fast path: nothing to record
    const bool keeps = KeepsArguments(f.writes);
    if ((keeps && (strided || no_grad_views != 0)) || !foreign.empty()) {
      return RunNoGradGuarded(rt, f, single, list, no_grad_views, foreign);
    }
    AutogradContext ctx;
    ContextState &st = State(ctx);
    BeginContext(st, f);
    ForwardCounted(rt, f, &ctx, single, list);
    if (st.dirty.empty()) NoteNoDirtyCall(f.writes);
    if (!keeps && !st.dirty.empty()) {  // the same rule, decided now: nothing was kept
      LateRefusal(rt, st, f, true, [&](std::size_t i) {
        if (f.args[i] != nullptr && HasInternalOverlap(*CallerArg(f, i))) {
          return RefusalMessage(Refusal::kOverlap, *f.name, i);
        }
        return no_grad_view(i) ? RefusalMessage(Refusal::kNoGradView, *f.name, i) : std::string();
      });
    }
    FinishNoGradCall(rt, st, single, list);
    return;
  }

  std::unique_ptr<AutogradContext, ContextDeleter> ctx(new AutogradContext);
  ContextState &st = State(*ctx);
  BeginContext(st, f);
  st.needs.assign(f.nargs, false);
  PyRef edges = PyRef::Steal(Check(PyTuple_New(static_cast<Py_ssize_t>(f.nargs))));
  // the arguments a write would be refused for, decided now (call_rules.h), kept where the type may write
  const bool keeps = KeepsArguments(f.writes);
  std::optional<ProtectedArgs> guard;
  auto refusal = [&](std::size_t i, PyObject *edge) {
    if (f.args[i] != nullptr && HasInternalOverlap(*CallerArg(f, i))) return Refusal::kOverlap;
    if (no_grad_view(i)) return Refusal::kNoGradView;
    if (i < foreign.size() && !foreign[i].empty()) return Refusal::kForeign;
    return WantsGrad(f.args[i]) ? RecordingRefusal(f.args[i]->py_object(), edge) : Refusal::kNone;
  };
  for (std::size_t i = 0; i < f.nargs; ++i) {
    PyObject *e = Py_None;
    if (WantsGrad(f.args[i])) {
      st.needs[i] = true;
      e = EdgeOf(rt, f.args[i]->py_object());
    } else {
      Py_INCREF(e);
    }
    PyTuple_SET_ITEM(edges.get(), static_cast<Py_ssize_t>(i), e);
    if (!keeps && foreign.empty()) continue;
    const Refusal why = refusal(i, e);
    if (why != Refusal::kNone) {
      ProtectArg(guard ? *guard : guard.emplace(), f, i, why, why == Refusal::kForeign ? foreign[i] : std::string());
    }
  }
  const double phase = NextFingerprintPhase();
  std::vector<std::uint64_t> fingerprints(f.nargs + 1, 0);
  for (std::size_t i = 0; i < f.nargs; ++i) {
    if (f.args[i] != nullptr) fingerprints[i] = Fingerprint(*f.args[i], phase);
  }
  {
    GradModeGuard off(rt, false, true);  // recording: grad mode was on
    ForwardCounted(rt, f, ctx.get(), single, list, guard ? &*guard : nullptr, fingerprints.data(), phase);
  }
  if (guard) {
    CheckRefusals(st, *guard);
  } else if (!keeps && !st.dirty.empty()) {  // the same rules, decided now: nothing was kept
    LateRefusal(rt, st, f, true, [&](std::size_t i) {
      const Refusal why = refusal(i, PyTuple_GET_ITEM(edges.get(), static_cast<Py_ssize_t>(i)));
      if (why == Refusal::kForeign) return foreign[i];
      return why == Refusal::kNone ? std::string() : RefusalMessage(why, *f.name, i);
    });
  }
  TensorPtrList outs = RecordOutputs(rt, std::move(ctx), single != nullptr ? AsList(std::move(*single)) : *list,
                                     edges.get(), fingerprints.data(), phase, f.backward, f.set_error, f.name_py());
  NoteReadOnlyCall(f.writes);  // a recorded call completed: unless MarkDirty said otherwise, it wrote none
  if (single != nullptr) {
    *single = std::move(outs[0]);
  } else {
    *list = std::move(outs);
  }
}

OB_CORE_FN void PrepareBackward(AutogradContext &ctx, TensorPtrList &grads, bool views) {
  if (State(ctx).released) {
    throw std::runtime_error("backward through " + ctx.function_name() +
                             " a second time: its saved tensors were freed after the first backward; "
                             "pass retain_graph=True the first time");
  }
  if (views) return;
  for (auto &g : grads) {
    if (g && NeedsPrivateCopy(*g)) g = g->contiguous_copy();  // a broadcast gradient, say
  }
}

}  // namespace detail
}  // namespace opbuilder

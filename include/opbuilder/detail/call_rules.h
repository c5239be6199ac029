// One place decides, for Function<T>::Apply (RunFunction, src/core/autograd.cpp), the rules every route of an op
// call honours; runtime/call_rules.py is the Python side and says the same (not for operator authors):
//  * which arguments may be written (MarkDirty): torch's check_inplace. An argument with internal
//    overlap (an expanded, stride-0 tensor) never; while the call records a node, not a leaf that
//    requires grad, nor a view of one. Decided from the arguments before Forward runs (WriteRefusal);
//  * what a refusal leaves untouched: everything. The memory Forward could write for a refused
//    argument is kept (ProtectedArgs) and put back before the error is raised. Kept only where a
//    write can happen (WriteKnowledge): until a recorded call of the Function type completed without
//    writing, and always once a call of it wrote. The one hole: a type that writes only on some calls
//    is protected from the first call that writes on (that call's refusal is raised after the write,
//    as torch raises its own for a custom Function only after forward);
//  * an argument returned unchanged comes back as a new tensor over its memory that shares its
//    version counter (ShareVersion), as a torch view does;
//  * MarkDirty on a view rebases the base's history (RebaseView, runtime/call_rules.py rebase_view);
//    a view argument made before a recorded write into its base (or into another view of it) gets its
//    history anew from the base's before its edge is taken (RefreshViewArg, call_rules.py refresh_view);
//  * an argument that is another framework's tensor (a torch tensor called straight, through DLPack)
//    is written only where that framework allows it now (runtime/dlpack_host.py torch_write_refusal:
//    not one that requires grad while its grad mode is on, an inference tensor outside InferenceMode,
//    a conjugate or negative view). Decided before Forward for a type that may write (KeepsForeign),
//    as the other refusals are (Refusal::kForeign, its words the rule's).
#pragma once

#include "opbuilder/detail/visibility.h"

#include <Python.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "opbuilder/detail/errors.h"
#include "opbuilder/detail/pyref.h"
#include "opbuilder/detail/runtime_bridge.h"
#include "opbuilder/tensor.h"

namespace opbuilder {
namespace detail OB_HIDDEN {

// torch's words for a write into memory that several elements share (at::assert_no_internal_overlap).
constexpr const char *kOverlapMessage =
    "unsupported operation: more than one element of the written-to tensor refers to a single memory location. "
    "Please clone() the tensor before performing the operation.";

// Two elements share one memory location: a stride of 0 over a dimension of size > 1 (torch's rule: other
// overlaps are too costly to prove and pass).
inline bool HasInternalOverlap(const Tensor &t) {
  if (t.is_contiguous()) return false;
  const ShapeVector strides = t.strides();
  for (std::size_t d = 0; d < strides.size(); ++d) {
    if (strides[d] == 0 && t.shape()[d] > 1) return true;
  }
  return false;
}

enum class Refusal { kNone, kOverlap, kLeaf, kViewOfLeaf, kNoGradView, kForeign };

inline std::string RefusalMessage(Refusal why, const std::string &who, std::size_t index) {
  const std::string head = who + " modifies argument " + std::to_string(index) + " in place (MarkDirty)";
  switch (why) {
    case Refusal::kOverlap:
      return head + ": " + kOverlapMessage;
    case Refusal::kLeaf:
      return head + ", but it is a leaf that requires grad; in-place changes of such leaves are not allowed "
                    "(use a copy, e.g. x * 1)";
    case Refusal::kViewOfLeaf:
      return head + ", but it is a view of a leaf that requires grad; in-place changes of such views are not "
                    "allowed (use a copy, e.g. x * 1)";
    case Refusal::kNoGradView:  // runtime/call_rules.py NO_GRAD_VIEW_WRITE
      return head + ": a view was created in no_grad mode and is being modified in place with grad mode "
                    "enabled; whether that write should be differentiated is ambiguous, so it is refused. Make "
                    "the view and the write both inside the no_grad block (the write is not recorded) or both "
                    "outside it";
    default:
      return head;
  }
}

// The interned name of a runtime.Tensor's weak reference to its view base (runtime/_native.py
// TENSOR_ATTRS), made once: None (a class attribute, read without a call) for a tensor that is no view.
inline PyObject *BaseRefAttr() {
  static std::atomic<PyObject *> stored{nullptr};
  PyObject *s = stored.load(std::memory_order_acquire);
  if (s != nullptr) return s;
  s = Check(PyUnicode_InternFromString("_base_ref"));
  PyObject *expected = nullptr;
  if (stored.compare_exchange_strong(expected, s, std::memory_order_acq_rel)) return s;
  Py_DECREF(s);
  return expected;
}

inline PyObject *ShareVersionRule() {
  static std::atomic<PyObject *> slot{nullptr};
  return NativeFn(slot, "share_version");
}
inline PyObject *ShareCounterRule() {
  static std::atomic<PyObject *> slot{nullptr};
  return NativeFn(slot, "share_counter");
}
inline PyObject *RebaseViewRule() {
  static std::atomic<PyObject *> slot{nullptr};
  return NativeFn(slot, "rebase_view");
}

// runtime.Tensor's `_base_ref` is a slot of the class (runtime/tensor.py), read here at its offset
// (found once, from the slot's member descriptor) for a runtime.Tensor or a subclass: each Function<T>
// call reads it for every argument, and an attribute lookup would cost more than a small op. True when
// read: `*value` is borrowed, null when unset (a tensor made without __init__: no view). False for any
// other object, or if the slot is ever gone: then look it up (BaseRefOf).
inline bool ReadBaseRefSlot(PyObject *obj, PyObject **value) {
  const Runtime &rt = Runtime::Get();
  const Py_ssize_t off = BaseRefSlot(rt);
  if (off == 0 || !PyObject_TypeCheck(obj, rt.tensor_type)) return false;
  *value = *reinterpret_cast<PyObject **>(reinterpret_cast<char *>(obj) + off);
  return true;
}

// `obj`'s `_base_ref` (new reference; None for a tensor that is no view).
inline PyRef BaseRefOf(PyObject *obj) {
  PyObject *v = nullptr;
  if (ReadBaseRefSlot(obj, &v)) return PyRef::Borrow(v != nullptr ? v : Py_None);
  return PyRef::Steal(Check(PyObject_GetAttr(obj, BaseRefAttr())));
}

// runtime._native.foreign_write_refusal (runtime/dlpack_host.py): why another framework's tensor may not be
// written now, or None.
inline PyObject *ForeignWriteRule() {
  static std::atomic<PyObject *> slot{nullptr};
  return NativeFn(slot, "foreign_write_refusal");
}

// The torch tensor (borrowed) whose memory `t` is, taken straight through DLPack's C exchange table (the
// storage's owner, dlpack_exchange.h), or null: a numpy array or capsule owner is the runtime's own.
inline PyObject *ExchangeOwner(const Tensor &t, const NumpyApi &np) {
  auto *del = std::get_deleter<PyOwnerDeleter>(t.storage());
  if (del == nullptr || np.IsArray(del->owner) || PyCapsule_CheckExact(del->owner)) return nullptr;
  return del->owner;
}

// Why `who` may not write its argument `index` now, `obj` being the framework's tensor (ExchangeOwner) or the
// runtime.Tensor over it (runtime.interop.dlpack_input): the framework's words, or empty when it may.
inline std::string ForeignRefusal(PyObject *obj, const std::string &who, std::size_t index) {
  PyRef name = PyRef::Steal(Check(PyUnicode_FromStringAndSize(who.data(), static_cast<Py_ssize_t>(who.size()))));
  PyRef i = PyRef::Steal(Check(PyLong_FromSize_t(index)));
  PyRef r = PyRef::Steal(Check(PyObject_CallFunctionObjArgs(ForeignWriteRule(), obj, name.get(), i.get(), nullptr)));
  if (r.get() == Py_None) return std::string();
  Py_ssize_t n = 0;
  const char *text = PyUnicode_AsUTF8AndSize(r.get(), &n);
  if (text == nullptr) throw PythonError();
  return std::string(text, static_cast<std::size_t>(n));
}

inline PyObject *RefreshViewRule() {
  static std::atomic<PyObject *> slot{nullptr};
  return NativeFn(slot, "refresh_view_arg");
}

// Whether `obj` (an argument's runtime.Tensor, or null) is a view: its `_base_ref` is set. One slot
// read for a runtime.Tensor (each argument of each Function<T> call is asked); a lookup for any other.
inline bool IsViewObject(const Runtime &rt, PyObject *obj) {
  if (obj == nullptr) return false;
  const Py_ssize_t off = BaseRefSlot(rt);
  if (off != 0 && PyObject_TypeCheck(obj, rt.tensor_type)) {
    PyObject *v = *reinterpret_cast<PyObject **>(reinterpret_cast<char *>(obj) + off);
    return v != nullptr && v != Py_None;
  }
  return BaseRefOf(obj).get() != Py_None;
}

// Before the edge to argument `t` is taken, for a view (IsViewObject): if its base was written in place
// since its history was set, its history becomes a part of the base's current one (runtime/call_rules.py
// refresh_view), and `t` (and `caller`, the caller's tensor where `t` is a private copy) learn whether it
// requires grad now. True when a write into it is refused (Refusal::kNoGradView: a view made under
// no_grad of a base that requires grad, grad mode on).
inline bool RefreshViewArg(Tensor *t, Tensor *caller) {
  PyRef r = PyRef::Steal(Check(PyObject_CallFunctionObjArgs(RefreshViewRule(), t->py_object(), nullptr)));
  const long how = PyLong_AsLong(r.get());
  if (how == -1 && PyErr_Occurred()) throw PythonError();
  const bool wants = (how & 1) != 0;
  TensorAccess::SetRequiresGrad(*t, wants);
  if (caller != nullptr && caller != t) TensorAccess::SetRequiresGrad(*caller, wants);
  return (how & 2) != 0;
}

// The object a weak reference points to, or None if it is gone (also the saved slots' check, detail/function_runner.h).
inline PyRef WeakTarget(PyObject *ref) {
#if defined(Py_LIMITED_API) && Py_LIMITED_API < 0x030D0000  // the stable ABI of 3.12: calling it gives the target
  return PyRef::Steal(Check(PyObject_CallNoArgs(ref)));
#elif PY_VERSION_HEX >= 0x030D0000
  PyObject *o = nullptr;
  if (PyWeakref_GetRef(ref, &o) < 0) throw PythonError();
  return o == nullptr ? PyRef::Borrow(Py_None) : PyRef::Steal(o);
#else
  return PyRef::Borrow(PyWeakref_GetObject(ref));
#endif
}

// Why the argument `caller` (the caller's tensor, bound to the runtime.Tensor `obj` or to none) may
// not be written while the call records a node, given the edge RunFunction took for it (`edge` is `obj`
// itself for a leaf, a (node, index) tuple otherwise); kOverlap is decided apart (HasInternalOverlap).
inline Refusal RecordingRefusal(PyObject *obj, PyObject *edge) {
  if (obj == nullptr) return Refusal::kNone;
  if (edge == obj) return Refusal::kLeaf;
  PyRef ref = BaseRefOf(obj);
  if (ref.get() == Py_None) return Refusal::kNone;
  PyRef base = WeakTarget(ref.get());
  if (base.get() == Py_None) return Refusal::kNone;
  const Runtime &rt = Runtime::Get();
  PyRef node = PyRef::Steal(Check(PyObject_GetAttr(base.get(), rt.s_node)));
  if (node.get() != Py_None) return Refusal::kNone;
  PyRef rg = PyRef::Steal(Check(PyObject_GetAttr(base.get(), rt.s_requires_grad)));
  return PyObject_IsTrue(rg.get()) == 1 ? Refusal::kViewOfLeaf : Refusal::kNone;
}

// What the calls of one Function type showed of its writes into arguments (one per type, Function<T>'s
// WriteState): nothing yet, that it writes none (a recorded call completed without MarkDirty and without
// a write the checks saw), or that it writes (MarkDirty, or a write found without it). Arguments a write
// would be refused for are kept before Forward (ProtectedArgs) only while a write can happen: copying
// every parameter of every op on every call would cost more than the op for most of them.
// kNoDirtySeen (a bit beside the first two) says a call that recorded nothing completed without MarkDirty:
// another framework's tensors (KeepsForeign) are then no longer asked about before Forward.
enum WriteKnowledge : unsigned char { kWritesUnknown = 0, kWritesNone = 1, kWritesArgs = 2, kNoDirtySeen = 4 };
using WriteState = std::atomic<unsigned char>;

// Keep the arguments a write would be refused for, for a call of the type whose state is `w`
// (null: a caller that learns nothing, always kept).
inline bool KeepsArguments(const WriteState *w) {
  return w == nullptr || (w->load(std::memory_order_relaxed) & 3) != kWritesNone;
}
// Ask, before Forward, whether another framework's tensor may be written (ForeignRefusal): until a call of
// the type completed without writing (recorded or not), and always once one wrote. Reading a torch tensor's
// requires_grad is then off the path of types that write nothing.
inline bool KeepsForeign(const WriteState *w) {
  if (w == nullptr) return true;
  const unsigned char v = w->load(std::memory_order_relaxed);
  return v == kWritesUnknown || v == kWritesArgs;
}
// A call that recorded nothing completed without MarkDirty (KeepsForeign).
inline void NoteNoDirtyCall(WriteState *w) {
  if (w == nullptr || w->load(std::memory_order_relaxed) != kWritesUnknown) return;
  unsigned char expected = kWritesUnknown;
  w->compare_exchange_strong(expected, kNoDirtySeen, std::memory_order_relaxed);
}
// A call of the type wrote an argument (MarkDirty, or a write the checks found): keep from now on.
inline void NoteWrites(WriteState *w) {
  if (w != nullptr && w->load(std::memory_order_relaxed) != kWritesArgs) w->store(kWritesArgs, std::memory_order_relaxed);
}
// A recorded call of the type completed without writing: unless one wrote, later calls keep nothing.
inline void NoteReadOnlyCall(WriteState *w) {
  if (w == nullptr) return;
  unsigned char expected = w->load(std::memory_order_relaxed);
  if ((expected & 3) != kWritesUnknown) return;
  w->compare_exchange_strong(expected, static_cast<unsigned char>(expected | kWritesNone), std::memory_order_relaxed);
}

// `out` (a new runtime.Tensor over the memory of the argument `arg`, returned unchanged) counts writes
// on `arg`'s version counter from now on.
inline void ShareVersion(PyObject *out, PyObject *arg) {
  if (out == nullptr || arg == nullptr || out == arg) return;
  PyRef r = PyRef::Steal(Check(PyObject_CallFunctionObjArgs(ShareVersionRule(), out, arg, nullptr)));
}

// `out` (a new runtime.Tensor over the memory of `first`, one tensor Forward returned again) counts writes on
// `first`'s version counter from now on; it is no view of it (each is an output of the node).
inline void ShareCounter(PyObject *out, PyObject *first) {
  PyRef r = PyRef::Steal(Check(PyObject_CallFunctionObjArgs(ShareCounterRule(), out, first, nullptr)));
}

// `view` (a runtime.Tensor) was written in place as argument `index` of the node now its history:
// if it is a view of a base, the base's history becomes the write (runtime/call_rules.py rebase_view).
inline void RebaseView(PyObject *view, std::size_t index) {
  if (view == nullptr) return;
  PyRef ref = BaseRefOf(view);
  if (ref.get() == Py_None) return;
  PyRef i = PyRef::Steal(Check(PyLong_FromSize_t(index)));
  PyRef r = PyRef::Steal(Check(PyObject_CallFunctionObjArgs(RebaseViewRule(), view, i.get(), nullptr)));
}

// The arguments a write would be refused for, with the values Forward could overwrite: kept before
// Forward runs, put back (Restore) before a refusal is raised, so the caller's data never changes.
// Small contiguous arguments are kept in an inline buffer (no allocation on the common path).
class ProtectedArgs {
 public:
  ProtectedArgs() = default;
  ProtectedArgs(const ProtectedArgs &) = delete;
  ProtectedArgs &operator=(const ProtectedArgs &) = delete;

  // Argument `index`: Forward writes `target` (the caller's tensor, or a private copy of it).
  // A private copy needs no keeping (the caller's memory is not Forward's); nor does device memory.
  // `note`: the refusal's words where `why` is kForeign.
  void Add(std::size_t index, Refusal why, Tensor *target, bool private_copy, std::string note = std::string()) {
    Item &it = n_ < kInline ? inline_[n_] : (more_.emplace_back(), more_.back());
    ++n_;
    it.index = index;
    it.why = why;
    it.note = std::move(note);
    if (private_copy || target == nullptr || target->is_cuda()) return;
    it.target = target;
    // the memory its elements span, kept as bytes: for a strided target (an expanded one above all) that is
    // its memory, not its logical size (a [2^31] broadcast of one element keeps one element)
    it.start = static_cast<char *>(target->data_ptr());
    const std::size_t n = SpanBytes(*target, &it.start);
    if (used_ + n <= kBuffer) {
      it.bytes = buffer_ + used_;
      used_ += n;
    } else {
      heap_.emplace_back(new char[n]);
      it.bytes = heap_.back().get();
    }
    it.nbytes = n;
    if (n != 0) std::memcpy(it.bytes, it.start, n);
  }
  bool empty() const { return n_ == 0; }

  Refusal RefusalOf(std::size_t index) const {
    for (std::size_t k = 0; k < n_; ++k) {
      if (At(k).index == index) return At(k).why;
    }
    return Refusal::kNone;
  }

  // The words of argument `index`'s refusal (its Refusal's message, or the framework's for kForeign).
  std::string MessageOf(std::size_t index, const std::string &who) const {
    for (std::size_t k = 0; k < n_; ++k) {
      const Item &it = At(k);
      if (it.index == index) return it.why == Refusal::kForeign ? it.note : RefusalMessage(it.why, who, index);
    }
    return std::string();
  }

  // Argument `index` is kept and its values differ from before Forward.
  bool Changed(std::size_t index) const {
    for (std::size_t k = 0; k < n_; ++k) {
      const Item &it = At(k);
      if (it.index == index && it.target != nullptr) return !Same(it);
    }
    return false;
  }

  void Restore() const {
    for (std::size_t k = 0; k < n_; ++k) {
      const Item &it = At(k);
      if (it.target == nullptr || Same(it)) continue;
      std::memcpy(it.start, it.bytes, it.nbytes);  // elements that share memory get the one value they all had
    }
  }

 private:
  struct Item {
    std::size_t index = 0;
    Refusal why = Refusal::kNone;
    std::string note;          // kForeign: the framework's words
    Tensor *target = nullptr;  // null: nothing kept (a private copy, device memory)
    char *start = nullptr;     // the lowest address its elements span
    char *bytes = nullptr;     // the bytes from `start` its elements span, as they were
    std::size_t nbytes = 0;
  };
  static bool Same(const Item &it) { return it.nbytes == 0 || std::memcmp(it.start, it.bytes, it.nbytes) == 0; }
  // The bytes `t`'s elements span (0 for no element), from its lowest addressed element (`*start`).
  static std::size_t SpanBytes(const Tensor &t, char **start) {
    if (t.numel() == 0) return 0;
    if (t.is_contiguous()) return t.nbytes();
    const ShapeVector shape = t.shape(), strides = t.strides();
    std::int64_t lo = 0, hi = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      const std::int64_t reach = (shape[d] - 1) * strides[d];
      (reach < 0 ? lo : hi) += reach;
    }
    const auto size = static_cast<std::int64_t>(t.element_size());
    *start += lo * size;
    return static_cast<std::size_t>((hi - lo + 1) * size);
  }
  const Item &At(std::size_t k) const { return k < kInline ? inline_[k] : more_[k - kInline]; }

  static constexpr std::size_t kInline = 2;  // most calls protect one or two arguments
  static constexpr std::size_t kBuffer = 64;
  Item inline_[kInline];
  std::vector<Item> more_;
  std::size_t n_ = 0;
  std::size_t used_ = 0;
  alignas(16) char buffer_[kBuffer];
  std::vector<std::unique_ptr<char[]>> heap_;
};

}  // namespace detail
}  // namespace opbuilder

// The bridge to the Python runtime: runtime.Tensor <-> opbuilder::Tensor
// without copying data, the runtime's grad-mode switch, tensor versions.
//
// Binding-neutral: it uses the Python C API only (numpy through its C API
// table, numpy_api.h), so operators bound with pybind11 and with nanobind share
// it. A runtime.Tensor is a Python object whose `_data` attribute is a numpy
// array (see runtime/tensor.py). Going in, the tensor views the array's buffer
// and keeps the array alive; going out, a tensor allocated in C++ becomes a
// numpy array whose base is a capsule owning the storage.
#pragma once

#include "opbuilder/detail/visibility.h"

#include <Python.h>

#include "opbuilder/detail/limited_api.h"
#include "opbuilder/detail/native_fn.h"
#include <structmember.h>  // T_OBJECT_EX: the type of a __slots__ member

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "opbuilder/detail/errors.h"
#include "opbuilder/detail/foreign_api.h"
#include "opbuilder/detail/numpy_api.h"
#include "opbuilder/detail/pyref.h"
#include "opbuilder/tensor.h"

namespace opbuilder {
namespace detail OB_HIDDEN {

// Cached objects of the runtime and numpy, looked up once per module.
struct Runtime {
  PyTypeObject *tensor_type = nullptr;
  PyObject *grad_state = nullptr;
  PyObject *empty_tuple = nullptr;
  PyObject *s_data = nullptr;
  PyObject *s_requires_grad = nullptr;
  PyObject *s_node = nullptr;
  PyObject *s_out_index = nullptr;
  PyObject *s_version = nullptr;
  PyObject *s_enabled = nullptr;
  PyObject *descr[kNumDataTypes] = {};  // bfloat16's stays null: BFloat16Descr() loads it when first needed
  NumpyApi np;
  const NumpyApi *api = &np;
  // runtime.jit: non-zero while a trace records ops (runtime/jit/tracing.py owns the int),
  // and the function a traced Function<T>::Apply hands itself to.
  const volatile int *trace_flag = nullptr;
  // non-zero while any thread has saved_tensors_hooks open (runtime/autograd/grad_mode.py hooks_flag)
  const volatile int *hooks_flag = nullptr;
  PyObject *trace_hook = nullptr;
  // A framework bridge's table (foreign_api.h), null until one is loaded (runtime._native.bridge_slot).
  const ForeignApi *const volatile *bridge_slot = nullptr;

#if OB_CORE_SHARED
  static Runtime &Get();  // inline: reads the core library's pointer, Load() on first use
  OB_CORE_FN static Runtime &Load();
#else
  OB_CORE_FN static Runtime &Get();
#endif
};

// Calls `fn(args...)` (a tuple it builds from new references it steals); new reference.
inline PyObject *CallSteal(PyObject *fn, PyObject *args) {
  PyRef a = PyRef::Steal(Check(args));
  return Check(PyObject_Call(fn, a.get(), nullptr));
}

// numpy's dtype of bfloat16 (ml_dtypes', through runtime._native.bfloat16, imported on first use): borrowed, kept for the
// life of the process. Callers hold the GIL.
inline PyObject *BFloat16Descr() {
  static std::atomic<PyObject *> stored{nullptr};
  PyObject *d = stored.load(std::memory_order_acquire);
  if (d != nullptr) return d;
  PyRef dtype = PyRef::Steal(ImportAttr("runtime._native", "bfloat16"));
  PyObject *loaded = Check(PyObject_GetAttrString(dtype.get(), "np"));  // a new reference, kept
  PyObject *expected = nullptr;
  if (stored.compare_exchange_strong(expected, loaded, std::memory_order_acq_rel)) return loaded;
  Py_DECREF(loaded);
  return expected;
}

// numpy's dtype for `t` (borrowed).
inline PyObject *DescrOf(const Runtime &rt, DataType t) { return t == kBFloat16 ? BFloat16Descr() : rt.descr[t]; }

// Loaded on first use and kept for the life of the process. Callers hold the GIL;
// loading may release it (imports), so two threads may both load: one result is kept.
#if OB_CORE_SHARED
// The core library's Runtime, published once by Load(). Get() reads it inline, so an op call does
// not call into libobcore.so for it (issue 21: an out-of-line Get cost a 1-element call ~30 ns).
extern OB_CORE_VAR std::atomic<Runtime *> core_runtime;

inline Runtime &Runtime::Get() {
  Runtime *r = core_runtime.load(std::memory_order_acquire);
  return r != nullptr ? *r : Load();
}
#endif

// ---- grad mode ----------------------------------------------------------
OB_CORE_FN bool GradEnabled(const Runtime &rt);

// Sets the grad mode for a scope and puts the previous one back.
class GradModeGuard {
 public:
  GradModeGuard(const Runtime &rt, bool mode) : GradModeGuard(rt, mode, GradEnabled(rt)) {}
  GradModeGuard(const Runtime &rt, bool mode, bool prev) : rt_(rt), prev_(prev) {
    Check(PyObject_SetAttr(rt_.grad_state, rt_.s_enabled, mode ? Py_True : Py_False));
  }
  ~GradModeGuard() {
    // restoring cannot fail for a threading.local attribute; keep any pending error
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyObject_SetAttr(rt_.grad_state, rt_.s_enabled, prev_ ? Py_True : Py_False);
    PyErr_Restore(t, v, tb);
  }
  GradModeGuard(const GradModeGuard &) = delete;
  GradModeGuard &operator=(const GradModeGuard &) = delete;

 private:
  const Runtime &rt_;
  bool prev_;
};

// ---- numpy -> Tensor ----------------------------------------------------
inline DataType DataTypeOfDescr(const Runtime &rt, PyObject *descr) {
  (void)rt;
  const NpyDescr *d = DescrFields(descr);
  if (d->byteorder == '>') throw TypeError("opbuilder: big-endian arrays are not supported");
  const int tn = d->type_num;
  if (tn == kNpyBool) return kBool;
  if (tn == kNpyByte) return kInt8;
  if (tn == kNpyUByte) return kUInt8;
  if (tn == kNpyShort) return kInt16;
  if (tn == kNpyInt && sizeof(int) == 4) return kInt32;
  if ((tn == kNpyLongLong && sizeof(long long) == 8) || (tn == kNpyLong && sizeof(long) == 8)) return kInt64;
  if (tn == kNpyHalf) return kFloat16;
  if (tn == kNpyFloat) return kFloat32;
  if (tn == kNpyDouble) return kFloat64;
  if (tn == kNpyCFloat) return kComplex64;
  if (tn == kNpyCDouble) return kComplex128;
  if (tn == kNpyUShort) return kUInt16;
  if (tn == kNpyUInt && sizeof(unsigned) == 4) return kUInt32;
  if ((tn == kNpyULongLong && sizeof(long long) == 8) || (tn == kNpyULong && sizeof(long) == 8)) return kUInt64;
  // a run-time registered dtype: ml_dtypes is imported already if an array has one of its dtypes
  if (tn >= kNpyUserDef && d->kind == 'V' && tn == DescrFields(BFloat16Descr())->type_num) return kBFloat16;
  PyRef s = PyRef::Steal(Check(PyObject_Str(descr)));
  const char *name = PyUnicode_AsUTF8(s.get());
  if (name == nullptr) throw PythonError();
  std::string supported;
  for (int t = 0; t < kNumDataTypes; ++t) {
    supported += (t ? ", " : "") + std::string(DataTypeName(static_cast<DataType>(t)));
  }
  throw TypeError(std::string("opbuilder: unsupported tensor dtype ") + name + "; supported: " + supported);
}

// A Tensor viewing `array`'s buffer; binds it to `owner` (a runtime.Tensor) if given.
OB_CORE_FN TensorPtr TensorFromArray(const Runtime &rt, PyObject *array, PyObject *owner, bool requires_grad);

// ---- GPU tensors (CuPy arrays): runtime/device_memory.py does the Python side ----

OB_CORE_FN TensorPtr TensorFromPy(const Runtime &rt, PyObject *obj);

// Any other framework's tensor (an object with `__dlpack__`: torch, JAX, CuPy, ...) as a Tensor
// over its memory, through runtime._native.dlpack_input (a runtime.Tensor sharing it); nullptr
// for an object without `__dlpack__`. Read-only and strided memory keep the boundary rules.
OB_CORE_FN TensorPtr TensorFromDlpack(const Runtime &rt, PyObject *o);

// ---- a framework bridge (to_torch's C++ fast path) ----------------------------
// The bridge whose call is active on this thread from the current Python frame, else nullptr.
inline const ForeignApi *ActiveBridge(const Runtime &rt) { return IfActive(*rt.bridge_slot); }

// A runtime.Tensor, a numpy array or any object with `__dlpack__` as a Tensor, sharing its
// memory; nullptr for anything else (the casters' load()).
OB_CORE_FN TensorPtr TensorFromObject(PyObject *o);

// A binding layer's conversion of `o` into `out`: false if `o` is no tensor. An exception the
// conversion throws is kept in `error` (and true returned), to be raised when the value is used.
OB_CORE_FN bool LoadTensor(PyObject *o, TensorPtr &out, std::exception_ptr &error) noexcept;

// The byte offset of runtime.Tensor's slot `name` (runtime/tensor.py; its member descriptor's), found
// once into `stored` (-1 until then); 0 if it is no slot. Native code reads and sets it there.
inline Py_ssize_t SlotOffset(const Runtime &rt, std::atomic<Py_ssize_t> &stored, const char *name) {
  Py_ssize_t off = stored.load(std::memory_order_acquire);
  if (off >= 0) return off;
  off = ObjectSlotOffset(rt.tensor_type, name, rt.empty_tuple);  // limited_api.h
  stored.store(off, std::memory_order_release);
  return off;
}
// `_base_ref`: a view's base, read on every Function<T> call (call_rules.h IsViewObject).
inline Py_ssize_t BaseRefSlot(const Runtime &rt) {
  static std::atomic<Py_ssize_t> stored{-1};
  return SlotOffset(rt, stored, "_base_ref");
}
// `_data`: the tensor's array (DataOf, NewPyTensor).
inline Py_ssize_t DataSlot(const Runtime &rt) {
  static std::atomic<Py_ssize_t> stored{-1};
  return SlotOffset(rt, stored, "_data");
}

// The array of the runtime.Tensor `obj` (new reference): read from its slot, or looked up (a subclass
// that is no runtime.Tensor, or a slot never set, whose lookup raises AttributeError).
inline PyObject *DataOf(const Runtime &rt, PyObject *obj) {
  const Py_ssize_t off = DataSlot(rt);
  if (off != 0 && PyObject_TypeCheck(obj, rt.tensor_type)) {
    if (PyObject *v = *reinterpret_cast<PyObject **>(reinterpret_cast<char *>(obj) + off)) {
      Py_INCREF(v);
      return v;
    }
  }
  return Check(PyObject_GetAttr(obj, rt.s_data));
}

// A new runtime.Tensor object (without running __init__) holding `array`, no view (`_base_ref` None).
inline PyObject *NewPyTensor(const Runtime &rt, PyObject *array) {
  PyObject *obj = Check(NewByTpNew(rt.tensor_type, rt.empty_tuple));
  if (const Py_ssize_t off = DataSlot(rt)) {  // a new object: the slot is unset
    Py_INCREF(array);
    *reinterpret_cast<PyObject **>(reinterpret_cast<char *>(obj) + off) = array;
  } else if (PyObject_SetAttr(obj, rt.s_data, array) < 0) {
    Py_DECREF(obj);
    throw PythonError();
  }
  if (const Py_ssize_t off = BaseRefSlot(rt)) {
    Py_INCREF(Py_None);
    *reinterpret_cast<PyObject **>(reinterpret_cast<char *>(obj) + off) = Py_None;  // unset until now
  }
  return obj;
}

// The runtime.Tensor for `t` (new reference): the one it is bound to, or a
// new one sharing its memory, to which `t` is then bound.
OB_CORE_FN PyObject *ToPython(const Runtime &rt, const TensorPtr &t);

// A module function's result `r`, bound to no Python object, that shares the storage of its argument `arg`
// (a Tensor it built on x->storage(), no Function around it): when `arg` is a runtime.Tensor over memory
// Python owns, `r` is bound to the runtime's view of it (runtime/call_rules.py returned_view), so its
// gradient reaches `arg`, as torch's `x[:2]` in a Python function does. Takes the GIL.
OB_CORE_FN void BindReturnedView(const TensorPtr &r, const Tensor &arg);

// The casters' cast(): None for a null TensorPtr (new reference). Inside a bridge call, a tensor
// bound to no Python object becomes the framework's tensor over its memory.
OB_CORE_FN PyObject *TensorToObject(const TensorPtr &t);

inline std::int64_t PyVersion(const Runtime &rt, PyObject *obj) {
  PyObject *v = Check(PyObject_GetAttr(obj, rt.s_version));
  long long n = PyLong_AsLongLong(v);
  Py_DECREF(v);
  return n;
}

// One write on `obj`'s version, when it is a runtime.Tensor. Inside a bridge call a tensor's object may be
// the framework's own (TensorToObject), whose counter is the framework's: the bridge counts those writes
// (ForeignHandle's bump_version, the framework node's mark_dirty), and torch's `_version` is read-only.
inline void BumpVersion(const Runtime &rt, PyObject *obj) {
  if (!PyObject_TypeCheck(obj, rt.tensor_type)) return;
  PyRef v = PyRef::Steal(Check(PyLong_FromLongLong(PyVersion(rt, obj) + 1)));
  Check(PyObject_SetAttr(obj, rt.s_version, v.get()));
}

}  // namespace detail
}  // namespace opbuilder

#if !OB_CORE_SHARED  // no core library: its bodies compile here, inline (detail/core_lib.h)
#if __has_include("../../../src/core/runtime_bridge.cpp")
#include "../../../src/core/runtime_bridge.cpp"
#else  // a copy of these headers (vendored): the installed ones' sources, found from the include path
#include "../src/core/runtime_bridge.cpp"
#endif
#endif

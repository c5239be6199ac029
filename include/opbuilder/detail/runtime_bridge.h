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
#include <structmember.h>  // T_OBJECT_EX: the type of a __slots__ member

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "opbuilder/detail/dlpack_exchange.h"
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

// A module's attribute (new reference).
inline PyObject *ImportAttr(const char *module, const char *name) {
  PyRef m = PyRef::Steal(Check(PyImport_ImportModule(module)));
  return Check(PyObject_GetAttrString(m.get(), name));
}

// Calls `fn(args...)` (a tuple it builds from new references it steals); new reference.
inline PyObject *CallSteal(PyObject *fn, PyObject *args) {
  PyRef a = PyRef::Steal(Check(args));
  return Check(PyObject_Call(fn, a.get(), nullptr));
}

inline Runtime LoadRuntime() {
  Runtime r;
  r.tensor_type = reinterpret_cast<PyTypeObject *>(ImportAttr("runtime._native", "Tensor"));
  r.grad_state = ImportAttr("runtime._native", "_state");
  r.empty_tuple = Check(PyTuple_New(0));
  r.s_data = Check(PyUnicode_InternFromString("_data"));
  r.s_requires_grad = Check(PyUnicode_InternFromString("requires_grad"));
  r.s_node = Check(PyUnicode_InternFromString("_node"));
  r.s_out_index = Check(PyUnicode_InternFromString("_out_index"));
  r.s_version = Check(PyUnicode_InternFromString("_version"));
  r.s_enabled = Check(PyUnicode_InternFromString("enabled"));
  r.np = NumpyApi::Load();
  PyRef flag_address = PyRef::Steal(ImportAttr("runtime._native", "flag_address"));
  PyRef addr = PyRef::Steal(Check(PyObject_CallNoArgs(flag_address.get())));
  const auto a = static_cast<std::uintptr_t>(PyLong_AsUnsignedLongLong(addr.get()));
  if (PyErr_Occurred()) throw PythonError();
  r.trace_flag = reinterpret_cast<const volatile int *>(a);
  PyRef hooks_address = PyRef::Steal(ImportAttr("runtime._native", "hooks_flag_address"));
  PyRef hooks_addr = PyRef::Steal(Check(PyObject_CallNoArgs(hooks_address.get())));
  r.hooks_flag = static_cast<const volatile int *>(PyLong_AsVoidPtr(hooks_addr.get()));
  if (PyErr_Occurred()) throw PythonError();
  r.trace_hook = ImportAttr("runtime._native", "cpp_hook");
  PyRef slot_address = PyRef::Steal(ImportAttr("runtime._native", "bridge_slot_address"));
  PyRef slot = PyRef::Steal(Check(PyObject_CallNoArgs(slot_address.get())));
  r.bridge_slot = static_cast<const ForeignApi *const volatile *>(PyLong_AsVoidPtr(slot.get()));
  if (PyErr_Occurred()) throw PythonError();
  const int int64 = sizeof(long) == 8 ? kNpyLong : kNpyLongLong;
  const int uint64 = sizeof(long) == 8 ? kNpyULong : kNpyULongLong;
  const int nums[kNumDataTypes] = {kNpyBool,  kNpyByte,   kNpyShort,   kNpyInt,   int64,   kNpyUByte, kNpyHalf,
                                   kNpyFloat, kNpyDouble, -1,          kNpyCFloat, kNpyCDouble, kNpyUShort,
                                   kNpyUInt,  uint64};  // -1: bfloat16, from ml_dtypes (BFloat16Descr)
  static_assert(kNumDataTypes == 15 && kBFloat16 == 9, "one numpy type per DataType, in enum order");
  for (int i = 0; i < kNumDataTypes; ++i) {
    if (nums[i] >= 0) r.descr[i] = Check(r.np.DescrFromType(nums[i]));
  }
  return r;
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
inline PyObject *DeviceMemoryAttr(const char *name) { return ImportAttr("runtime._native", name); }

// A Tensor over a GPU array's memory (made C-contiguous on its device first).
inline TensorPtr TensorFromDeviceArray(const Runtime &rt, PyObject *array, PyObject *owner, bool requires_grad) {
  PyRef describe = PyRef::Steal(DeviceMemoryAttr("describe"));
  PyRef d = PyRef::Steal(Check(PyObject_CallOneArg(describe.get(), array)));
  if (!PyTuple_Check(d.get()) || PyTuple_GET_SIZE(d.get()) != 5) {
    throw TypeError("opbuilder: runtime.device_memory.describe returned something other than a 5-tuple");
  }
  PyObject *arr = PyTuple_GET_ITEM(d.get(), 0);
  void *ptr = PyLong_AsVoidPtr(PyTuple_GET_ITEM(d.get(), 1));
  if (PyErr_Occurred()) throw PythonError();
  PyRef seq = PyRef::Steal(Check(PySequence_Fast(PyTuple_GET_ITEM(d.get(), 2), "shape must be a sequence")));
  ShapeVector shape;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq.get()); ++i) {
    shape.push_back(PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq.get(), i)));
  }
  if (PyErr_Occurred()) throw PythonError();
  DataType dt = DataTypeOfDescr(rt, PyTuple_GET_ITEM(d.get(), 3));
  const int device = static_cast<int>(PyLong_AsLong(PyTuple_GET_ITEM(d.get(), 4)));
  if (PyErr_Occurred()) throw PythonError();
  Py_INCREF(arr);
  std::shared_ptr<void> storage(ptr, PyOwnerDeleter{arr});
  auto t = std::make_shared<Tensor>(dt, std::move(shape), ShapeVector{}, ptr, std::move(storage), true, device);
  if (owner != nullptr) TensorAccess::BindPython(*t, PyRef::Borrow(owner));
  TensorAccess::SetRequiresGrad(*t, requires_grad);
  return t;
}

OB_CORE_FN TensorPtr TensorFromPy(const Runtime &rt, PyObject *obj);

// Any other framework's tensor (an object with `__dlpack__`: torch, JAX, CuPy, ...) as a Tensor
// over its memory, through runtime._native.dlpack_input (a runtime.Tensor sharing it); nullptr
// for an object without `__dlpack__`. Read-only and strided memory keep the boundary rules.
OB_CORE_FN TensorPtr TensorFromDlpack(const Runtime &rt, PyObject *o);

// ---- a framework bridge (to_torch's C++ fast path) ----------------------------
// The bridge whose call is active on this thread from the current Python frame, else nullptr.
inline const ForeignApi *ActiveBridge(const Runtime &rt) { return IfActive(*rt.bridge_slot); }

// A Tensor over a framework tensor's memory (it takes the reference in `f.handle`).
inline TensorPtr TensorFromForeign(const ForeignApi &api, const ForeignTensor &f, bool requires_grad) {
  std::shared_ptr<void> storage(f.data, ForeignOwner{&api, f.handle}, PoolAllocator<void>());
  ShapeVector shape = TakeShape();
  shape.assign(f.shape, f.shape + f.ndim);
  ShapeVector strides;
  if (f.strides != nullptr) strides.assign(f.strides, f.strides + f.ndim);
  auto t = NewTensor(static_cast<DataType>(f.dtype), std::move(shape), std::move(strides), f.data,
                                    std::move(storage), true, f.device);
  TensorAccess::SetRequiresGrad(*t, requires_grad && f.requires_grad != 0);
  return t;
}

// The framework's handle of a Tensor over its memory, else nullptr.
inline void *ForeignHandle(const Tensor &t) {
  auto *o = std::get_deleter<ForeignOwner>(t.storage());
  return o != nullptr ? o->handle : nullptr;
}

// What a bridge's tensor keeps alive of a Tensor: its storage, shape and strides.
struct ForeignKeep {
  std::shared_ptr<void> storage;
  ShapeVector shape, strides;
};
inline void DropForeignKeep(void *keep) { delete static_cast<ForeignKeep *>(keep); }

// `t` as a ForeignTensor whose `handle` is a new ForeignKeep (DropForeignKeep frees it).
inline ForeignTensor ForeignOf(const Tensor &t) {
  auto keep = std::make_unique<ForeignKeep>(ForeignKeep{t.storage(), t.shape(), {}});
  if (!t.is_contiguous()) keep->strides = t.strides();
  ForeignTensor f{t.data_ptr(), keep->shape.data(), keep->strides.empty() ? nullptr : keep->strides.data(),
                  static_cast<std::int32_t>(keep->shape.size()), static_cast<std::int32_t>(t.dtype()), 0, nullptr,
                  t.device_index()};
  f.handle = keep.release();
  return f;
}

// What a framework tensor made by WrapForeign keeps of a Tensor: its storage (the framework copies the
// shape and strides while it makes the tensor, ForeignApi::wrap).
inline void DropStorageKeep(void *keep) {
  auto *k = static_cast<std::shared_ptr<void> *>(keep);
  k->~shared_ptr();
  PoolGive(k, sizeof(*k));
}

// A new framework tensor over `t`'s memory (new reference); a host view with negative strides,
// which torch cannot describe, goes out as a contiguous copy.
inline PyObject *WrapForeign(const ForeignApi &api, const Tensor &t) {
  ShapeVector strides;
  if (!t.is_contiguous()) {
    strides = t.strides();
    if (!t.is_cuda()) {
      for (std::int64_t st : strides) {
        if (st < 0) return WrapForeign(api, *t.contiguous_copy());
      }
    }
  }
  void *keep = new (PoolTake(sizeof(std::shared_ptr<void>))) std::shared_ptr<void>(t.storage());
  const ForeignTensor f{t.data_ptr(), t.shape().data(), strides.empty() ? nullptr : strides.data(),
                        static_cast<std::int32_t>(t.ndim()), static_cast<std::int32_t>(t.dtype()), 0, nullptr,
                        t.device_index()};
  PyObject *o = api.wrap(&f, keep, DropStorageKeep);
  if (o == nullptr) {  // `keep` is still ours
    DropStorageKeep(keep);
    throw PythonError();
  }
  return o;  // `keep` is the framework tensor's now
}

// A runtime.Tensor, a numpy array or any object with `__dlpack__` as a Tensor, sharing its
// memory; nullptr for anything else (the casters' load()).
OB_CORE_FN TensorPtr TensorFromObject(PyObject *o);

// A binding layer's conversion of `o` into `out`: false if `o` is no tensor. An exception the
// conversion throws is kept in `error` (and true returned), to be raised when the value is used.
OB_CORE_FN bool LoadTensor(PyObject *o, TensorPtr &out, std::exception_ptr &error) noexcept;

// ---- Tensor -> numpy / runtime.Tensor ------------------------------------
inline void DeleteStorageCapsule(PyObject *capsule) {
  delete static_cast<std::shared_ptr<void> *>(PyCapsule_GetPointer(capsule, "opbuilder.storage"));
}

// The Python object that keeps `t`'s storage alive: its numpy/CuPy owner, or a new capsule (new reference).
inline PyObject *StorageOwner(const Tensor &t) {
  if (auto *del = std::get_deleter<PyOwnerDeleter>(t.storage())) {
    Py_INCREF(del->owner);
    return del->owner;
  }
  auto held = std::make_unique<std::shared_ptr<void>>(t.storage());
  PyObject *cap = Check(PyCapsule_New(held.get(), "opbuilder.storage", DeleteStorageCapsule));
  held.release();  // the capsule owns it now
  return cap;
}

// A new CuPy array over a GPU tensor's memory (new reference).
inline PyObject *DeviceArrayFromTensor(const Runtime &rt, const Tensor &t) {
  if (!t.is_contiguous()) throw ValueError("opbuilder: a strided GPU tensor cannot be returned to Python");
  PyRef owner = PyRef::Steal(StorageOwner(t));
  PyRef shape = PyRef::Steal(Check(PyTuple_New(static_cast<Py_ssize_t>(t.ndim()))));
  for (std::size_t i = 0; i < t.shape().size(); ++i) {
    PyTuple_SET_ITEM(shape.get(), static_cast<Py_ssize_t>(i), Check(PyLong_FromLongLong(t.shape()[i])));
  }
  PyRef wrap = PyRef::Steal(DeviceMemoryAttr("wrap"));
  return CallSteal(wrap.get(), Py_BuildValue("(NnOOiO)", Check(PyLong_FromVoidPtr(t.data_ptr())),
                                             static_cast<Py_ssize_t>(t.nbytes()), shape.get(), DescrOf(rt, t.dtype()),
                                             t.device_index(), owner.get()));
}

// A new numpy array over the tensor's memory (new reference); a CuPy array for a GPU tensor.
inline PyObject *ArrayFromTensor(const Runtime &rt, const Tensor &t) {
  if (t.is_cuda()) return DeviceArrayFromTensor(rt, t);
  const auto nd = static_cast<std::size_t>(t.ndim());
  const auto es = static_cast<Py_intptr_t>(t.element_size());
  Py_intptr_t small[2][8];
  std::vector<Py_intptr_t> big;
  Py_intptr_t *dims = small[0], *strides = small[1];
  if (nd > 8) {
    big.resize(2 * nd);
    dims = big.data();
    strides = big.data() + nd;
  }
  const ShapeVector &shape = t.shape();
  if (t.is_contiguous()) {
    Py_intptr_t acc = es;
    for (std::size_t i = nd; i-- > 0;) {
      dims[i] = static_cast<Py_intptr_t>(shape[i]);
      strides[i] = acc;
      acc *= shape[i] > 0 ? static_cast<Py_intptr_t>(shape[i]) : 1;
    }
  } else {
    const ShapeVector st = t.strides();
    for (std::size_t i = 0; i < nd; ++i) {
      dims[i] = static_cast<Py_intptr_t>(shape[i]);
      strides[i] = static_cast<Py_intptr_t>(st[i]) * es;
    }
  }

  int flags = kNpyWriteable;
  if (auto *del = std::get_deleter<PyOwnerDeleter>(t.storage())) {
    if (rt.api->IsArray(del->owner)) flags = ArrayFields(del->owner)->flags & kNpyWriteable;
  }
  PyObject *base = StorageOwner(t);
  if (!PyCapsule_CheckExact(base)) base = PinnedBase(base, *rt.api);  // a torch tensor's storage: pinned
  PyObject *descr = DescrOf(rt, t.dtype());
  Py_INCREF(descr);
  PyObject *arr = rt.api->NewFromDescr(rt.api->array_type, descr, static_cast<int>(nd), dims, strides, t.data_ptr(),
                                       flags, nullptr);
  if (arr == nullptr) {
    Py_DECREF(base);
    throw PythonError();
  }
  ArrayFields(arr)->base = base;  // steals our reference
  return arr;
}

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

// The casters' cast(): None for a null TensorPtr (new reference). Inside a bridge call, a tensor
// bound to no Python object becomes the framework's tensor over its memory.
OB_CORE_FN PyObject *TensorToObject(const TensorPtr &t);

inline std::int64_t PyVersion(const Runtime &rt, PyObject *obj) {
  PyObject *v = Check(PyObject_GetAttr(obj, rt.s_version));
  long long n = PyLong_AsLongLong(v);
  Py_DECREF(v);
  return n;
}

inline void BumpVersion(const Runtime &rt, PyObject *obj) {
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

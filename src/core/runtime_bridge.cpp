// The core library's bodies of the functions opbuilder/detail/runtime_bridge.h declares with OB_CORE_FN.
// Compiled once into libobcore (core_lib.cpp), or, in a build without the core library,
// inline in each operator: opbuilder/detail/runtime_bridge.h includes this file at its end (detail/core_lib.h).
#include "opbuilder/detail/runtime_bridge.h"
#include "opbuilder/detail/foreign_tensor.h"
#include "opbuilder/detail/dlpack_exchange.h"

namespace opbuilder {

namespace detail OB_HIDDEN {

namespace {  // called by this file's functions only

Runtime LoadRuntime() {
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

// A Tensor over a GPU array's memory (made C-contiguous on its device first).
TensorPtr TensorFromDeviceArray(const Runtime &rt, PyObject *array, PyObject *owner, bool requires_grad) {
  static std::atomic<PyObject *> describe{nullptr};
  PyRef d = PyRef::Steal(Check(PyObject_CallOneArg(NativeFn(describe, "describe"), array)));
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

// ---- Tensor -> numpy / runtime.Tensor ------------------------------------
void DeleteStorageCapsule(PyObject *capsule) {
  delete static_cast<std::shared_ptr<void> *>(PyCapsule_GetPointer(capsule, "opbuilder.storage"));
}

// The Python object that keeps `t`'s storage alive: its numpy/CuPy owner, or a new capsule (new reference).
PyObject *StorageOwner(const Tensor &t) {
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
PyObject *DeviceArrayFromTensor(const Runtime &rt, const Tensor &t) {
  if (!t.is_contiguous()) throw ValueError("opbuilder: a strided GPU tensor cannot be returned to Python");
  PyRef owner = PyRef::Steal(StorageOwner(t));
  PyRef shape = PyRef::Steal(Check(PyTuple_New(static_cast<Py_ssize_t>(t.ndim()))));
  for (std::size_t i = 0; i < t.shape().size(); ++i) {
    PyTuple_SET_ITEM(shape.get(), static_cast<Py_ssize_t>(i), Check(PyLong_FromLongLong(t.shape()[i])));
  }
  static std::atomic<PyObject *> wrap{nullptr};
  return CallSteal(NativeFn(wrap, "wrap"), Py_BuildValue("(NnOOiO)", Check(PyLong_FromVoidPtr(t.data_ptr())),
                                             static_cast<Py_ssize_t>(t.nbytes()), shape.get(), DescrOf(rt, t.dtype()),
                                             t.device_index(), owner.get()));
}

// A new numpy array over the tensor's memory (new reference); a CuPy array for a GPU tensor.
PyObject *ArrayFromTensor(const Runtime &rt, const Tensor &t) {
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

}  // namespace

#if OB_CORE_SHARED
OB_CORE_VAR std::atomic<Runtime *> core_runtime{nullptr};

OB_CORE_FN Runtime &Runtime::Load() {
  std::atomic<Runtime *> &stored = core_runtime;
#else
OB_CORE_FN Runtime &Runtime::Get() {
  static std::atomic<Runtime *> stored{nullptr};
#endif
  Runtime *r = stored.load(std::memory_order_acquire);
  if (r != nullptr) return *r;
  auto loaded = std::make_unique<Runtime>(LoadRuntime());
  loaded->api = &loaded->np;
  Runtime *expected = nullptr;
  if (stored.compare_exchange_strong(expected, loaded.get(), std::memory_order_acq_rel)) return *loaded.release();
  return *expected;
}

OB_CORE_FN bool GradEnabled(const Runtime &rt) {
  PyObject *v = PyObject_GetAttr(rt.grad_state, rt.s_enabled);
  if (v == nullptr) throw PythonError();
  bool on = (v == Py_True);
  Py_DECREF(v);
  return on;
}

OB_CORE_FN TensorPtr TensorFromArray(const Runtime &rt, PyObject *array, PyObject *owner, bool requires_grad) {
  NpyArray *a = ArrayFields(array);
  DataType dt = DataTypeOfDescr(rt, a->descr);
  const auto es = static_cast<std::int64_t>(ElementSize(dt));
  const int nd = a->nd;
  bool usable = (a->flags & kNpyAligned) != 0;
  const bool writable = (a->flags & kNpyWriteable) != 0;  // the copy below, if any, stands for it
  ShapeVector shape = TakeShape();
  shape.assign(a->dimensions, a->dimensions + nd);
  ShapeVector strides;
  if (!(a->flags & kNpyCContiguous)) {
    strides.resize(static_cast<std::size_t>(nd));
    for (int i = 0; i < nd; ++i) {
      if (a->strides[i] % es != 0) usable = false;
      strides[static_cast<std::size_t>(i)] = a->strides[i] / es;
    }
  }
  PyObject *src = array;
  PyRef copy;
  if (!usable) {  // unaligned or odd strides: work on an aligned contiguous copy
    copy = PyRef::Steal(Check(rt.api->NewCopy(array, 0)));
    src = copy.get();
    a = ArrayFields(src);
    strides.clear();
  }
  Py_INCREF(src);
  std::shared_ptr<void> storage(a->data, PyOwnerDeleter{src}, PoolAllocator<void>());
  auto t = NewTensor(dt, std::move(shape), std::move(strides), a->data, std::move(storage), writable);
  if (owner != nullptr) TensorAccess::BindPython(*t, PyRef::Borrow(owner));
  TensorAccess::SetRequiresGrad(*t, requires_grad);
  return t;
}

OB_CORE_FN TensorPtr TensorFromPy(const Runtime &rt, PyObject *obj) {
  PyRef arr = PyRef::Steal(DataOf(rt, obj));
  PyObject *rg = Check(PyObject_GetAttr(obj, rt.s_requires_grad));
  const bool requires_grad = PyObject_IsTrue(rg) == 1;
  Py_DECREF(rg);
  if (!rt.api->IsArray(arr.get())) {
    if (!PyObject_HasAttrString(arr.get(), "__cuda_array_interface__")) {
      throw TypeError("opbuilder: runtime.Tensor._data is neither a numpy array nor a GPU array");
    }
    return TensorFromDeviceArray(rt, arr.get(), obj, requires_grad);
  }
  return TensorFromArray(rt, arr.get(), obj, requires_grad);
}

OB_CORE_FN TensorPtr TensorFromDlpack(const Runtime &rt, PyObject *o) {
  static PyObject *const s_dlpack = Check(PyUnicode_InternFromString("__dlpack__"));
  PyObject *method = nullptr;
#if defined(Py_LIMITED_API) && Py_LIMITED_API < 0x030D0000  // no lookup that keeps AttributeError quiet
  method = PyObject_GetAttr(o, s_dlpack);
  if (method == nullptr) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) throw PythonError();
    PyErr_Clear();
  }
#elif PY_VERSION_HEX >= 0x030D0000
  if (PyObject_GetOptionalAttr(o, s_dlpack, &method) < 0) throw PythonError();
#else
  if (_PyObject_LookupAttr(o, s_dlpack, &method) < 0) throw PythonError();
#endif
  if (method == nullptr) return nullptr;
  Py_DECREF(method);
  // looked up once; the import may release the GIL, so no static-init guard (see Runtime::Get)
  static std::atomic<PyObject *> stored{nullptr};
  PyObject *convert = stored.load(std::memory_order_acquire);
  if (convert == nullptr) {
    PyObject *loaded = ImportAttr("runtime._native", "dlpack_input");
    PyObject *expected = nullptr;
    if (stored.compare_exchange_strong(expected, loaded, std::memory_order_acq_rel)) {
      convert = loaded;
    } else {
      Py_DECREF(loaded);
      convert = expected;
    }
  }
  PyRef t = PyRef::Steal(Check(PyObject_CallOneArg(convert, o)));
  if (!PyObject_TypeCheck(t.get(), rt.tensor_type)) {
    throw TypeError("opbuilder: runtime.interop.dlpack_input returned something other than a runtime.Tensor");
  }
  return TensorFromPy(rt, t.get());
}

OB_CORE_FN TensorPtr TensorFromObject(PyObject *o) {
  const Runtime &rt = Runtime::Get();
  // a torch tensor, called through to_torch (asked first: unpack takes only the framework's exact tensor
  // type, which is neither a runtime.Tensor nor a numpy array)
  const ForeignApi *api = ActiveBridge(rt);
  if (api != nullptr) {
    ForeignTensor f;
    const int got = api->unpack(o, &f);
    if (got < 0) throw PythonError();
    if (got > 0) return TensorFromForeign(*api, f, true, true);  // (an argument: ReturnedArgument)
  }
  if (PyObject_TypeCheck(o, rt.tensor_type)) return TensorFromPy(rt, o);
  if (rt.api->IsArray(o)) return TensorFromArray(rt, o, nullptr, false);
  if (TensorPtr t = TensorFromExchange(o)) return t;  // a CPU torch tensor, through DLPack's C table
  return TensorFromDlpack(rt, o);
}

OB_CORE_FN bool LoadTensor(PyObject *o, TensorPtr &out, std::exception_ptr &error) noexcept {
  try {
    out = TensorFromObject(o);
    return out != nullptr;
  } catch (...) {
    error = std::current_exception();
    return true;
  }
}

// A framework argument the function returns as it came (not through a Function, which binds its outputs), as
// to_torch's Python path returns it: the caller's tensor itself, as torch's `return x` (or `x.mul_(3); return
// x` after a Function wrote it); a Tensor the function built over the argument's memory (a slice, a
// reshape on x->storage()) is the framework's view of the argument over those elements (torch's x[:2]),
// not a new tensor with a version counter and history of its own; nullptr when `t` is neither.
static PyObject *ReturnedArgument(const ForeignApi &api, const Tensor &t) {
  auto *owner = std::get_deleter<ForeignOwner>(t.storage());
  if (owner == nullptr || !owner->argument) return nullptr;  // (new memory: device outputs are foreign too)
  PyRef arg = PyRef::Steal(Check(api.object_of(owner->handle)));
  ForeignTensor f;
  const int got = api.unpack(arg.get(), &f);  // (host or device memory; its handle released right away)
  if (got < 0) throw PythonError();
  if (got == 0) return nullptr;
  api.release(f.handle);  // `arg` keeps the tensor, and so f's shape and strides
  if (f.dtype != static_cast<std::int32_t>(t.dtype()) || f.device != t.device_index()) return nullptr;
  const ShapeVector strides = t.strides();
  bool same = f.data == t.data_ptr() && f.ndim == static_cast<std::int32_t>(t.ndim()) &&
              (f.strides != nullptr || t.is_contiguous());
  for (std::int32_t d = 0; same && d < f.ndim; ++d) {  // (a size-1 dimension's stride says nothing)
    const std::int64_t fs = f.strides != nullptr ? f.strides[d] : strides[d];
    same = f.shape[d] == t.shape()[d] && (f.shape[d] == 1 || fs == strides[d]);
  }
  if (same) return arg.release();
  const auto item = static_cast<std::ptrdiff_t>(t.element_size());
  const std::ptrdiff_t bytes = static_cast<const char *>(t.data_ptr()) - static_cast<const char *>(f.data);
  if (item == 0 || bytes % item != 0) return nullptr;
  PyRef first = PyRef::Steal(Check(PyObject_CallMethod(arg.get(), "storage_offset", nullptr)));
  long long offset = PyLong_AsLongLong(first.get()) + bytes / item;
  // negative strides, which torch has no view for: the flip of the view with them turned (x.flip(0))
  PyRef back = PyRef::Steal(Check(PyList_New(0)));
  PyRef shape = PyRef::Steal(Check(PyTuple_New(static_cast<Py_ssize_t>(t.ndim()))));
  PyRef steps = PyRef::Steal(Check(PyTuple_New(static_cast<Py_ssize_t>(t.ndim()))));
  for (std::int64_t d = 0; d < t.ndim(); ++d) {
    const std::int64_t n = t.shape()[static_cast<std::size_t>(d)], st = strides[static_cast<std::size_t>(d)];
    if (st < 0 && n > 1) {
      offset += (n - 1) * st;
      PyRef dim = PyRef::Steal(Check(PyLong_FromLongLong(d)));
      if (PyList_Append(back.get(), dim.get()) != 0) throw PythonError();
    }
    PyTuple_SET_ITEM(shape.get(), d, Check(PyLong_FromLongLong(n)));
    PyTuple_SET_ITEM(steps.get(), d, Check(PyLong_FromLongLong(st < 0 ? -st : st)));
  }
  if (offset < 0 || PyErr_Occurred()) {
    PyErr_Clear();
    return nullptr;
  }
  PyRef view = PyRef::Steal(PyObject_CallMethod(arg.get(), "as_strided", "OOL", shape.get(), steps.get(), offset));
  if (!view) {  // elements outside the argument's storage (torch's RuntimeError): a tensor of its own
    if (!PyErr_ExceptionMatches(PyExc_RuntimeError)) throw PythonError();
    PyErr_Clear();
    return nullptr;
  }
  if (PyList_GET_SIZE(back.get()) == 0) return view.release();
  return Check(PyObject_CallMethod(view.get(), "flip", "O", back.get()));
}

OB_CORE_FN void BindReturnedView(const TensorPtr &r, const Tensor &arg) {
  if (std::get_deleter<PyOwnerDeleter>(r->storage()) == nullptr) return;  // (another framework's memory)
  if (arg.py_object() == nullptr || arg.is_cuda() != r->is_cuda()) return;
  GilForRefcount gil;
  const Runtime &rt = Runtime::Get();
  if (!PyObject_TypeCheck(arg.py_object(), rt.tensor_type)) return;
  PyRef arr = PyRef::Steal(Check(ArrayFromTensor(rt, *r)));
  static std::atomic<PyObject *> slot{nullptr};
  PyRef view = PyRef::Steal(
      Check(PyObject_CallFunctionObjArgs(NativeFn(slot, "returned_view"), arg.py_object(), arr.get(), nullptr)));
  if (view.get() != Py_None) TensorAccess::BindPython(*r, std::move(view));
}

OB_CORE_FN PyObject *TensorToObject(const TensorPtr &t) {
  if (!t) {
    Py_INCREF(Py_None);
    return Py_None;
  }
  const Runtime &rt = Runtime::Get();
  if (const ForeignApi *api = ActiveBridge(rt)) {  // a runtime.Tensor is no answer for a torch caller
    PyObject *o = t->py_object();
    if (o == nullptr) {
      if (PyObject *view = ReturnedArgument(*api, *t)) return view;
      return WrapForeign(*api, *t);
    }
    if (PyObject_TypeCheck(o, rt.tensor_type)) return WrapForeign(*api, *t);
  }
  return ToPython(rt, t);
}

OB_CORE_FN PyObject *ToPython(const Runtime &rt, const TensorPtr &t) {
  if (PyObject *o = t->py_object()) {
    Py_INCREF(o);
    return o;
  }
  PyRef arr = PyRef::Steal(ArrayFromTensor(rt, *t));
  PyObject *obj = NewPyTensor(rt, arr.get());
  TensorAccess::BindPython(*t, PyRef::Borrow(obj));
  return obj;
}

}  // namespace detail
}  // namespace opbuilder

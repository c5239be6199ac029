// The core library's bodies of the functions opbuilder/detail/runtime_bridge.h declares with OB_CORE_FN.
// Compiled once into libobcore (core_lib.cpp), or, in a build without the core library,
// inline in each operator: opbuilder/detail/runtime_bridge.h includes this file at its end (detail/core_lib.h).
#include "opbuilder/detail/runtime_bridge.h"
#include "opbuilder/detail/dlpack_exchange.h"

namespace opbuilder {

namespace detail OB_HIDDEN {

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
    if (got > 0) return TensorFromForeign(*api, f, true);
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

OB_CORE_FN PyObject *TensorToObject(const TensorPtr &t) {
  if (!t) {
    Py_INCREF(Py_None);
    return Py_None;
  }
  const Runtime &rt = Runtime::Get();
  if (const ForeignApi *api = ActiveBridge(rt)) {  // a runtime.Tensor is no answer for a torch caller
    PyObject *o = t->py_object();
    if (o == nullptr || PyObject_TypeCheck(o, rt.tensor_type)) return WrapForeign(*api, *t);
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

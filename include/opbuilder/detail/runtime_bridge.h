// The bridge to the Python runtime: runtime.Tensor <-> opbuilder::Tensor
// without copying data, and the runtime's grad-mode switch.
//
// A runtime.Tensor is a Python object whose `_data` attribute is a numpy
// array (see runtime/tensor.py). Going in, the tensor views the array's
// buffer and keeps the array alive; going out, a tensor allocated in C++
// becomes a numpy array whose base is a capsule owning the storage.
#pragma once

#include "opbuilder/detail/visibility.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "opbuilder/tensor.h"

namespace opbuilder {
namespace detail OB_HIDDEN {

namespace py = pybind11;

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
  PyObject *descr[kNumDataTypes] = {};
  py::detail::npy_api *api = nullptr;
  // runtime.jit: non-zero while a trace records ops (runtime/jit/tracing.py owns the int),
  // and the function a traced Function<T>::Apply hands itself to.
  const volatile int *trace_flag = nullptr;
  PyObject *trace_hook = nullptr;

  static Runtime &Get();
};

inline Runtime LoadRuntime() {
  Runtime r;
  r.tensor_type = reinterpret_cast<PyTypeObject *>(
      py::object(py::module_::import("runtime.tensor").attr("Tensor")).release().ptr());
  r.grad_state = py::object(py::module_::import("runtime.autograd.grad_mode").attr("_state")).release().ptr();
  r.empty_tuple = PyTuple_New(0);
  r.s_data = PyUnicode_InternFromString("_data");
  r.s_requires_grad = PyUnicode_InternFromString("requires_grad");
  r.s_node = PyUnicode_InternFromString("_node");
  r.s_out_index = PyUnicode_InternFromString("_out_index");
  r.s_version = PyUnicode_InternFromString("_version");
  r.s_enabled = PyUnicode_InternFromString("enabled");
  r.api = &py::detail::npy_api::get();
  py::module_ tracing = py::module_::import("runtime.jit.tracing");
  r.trace_flag = reinterpret_cast<const volatile int *>(tracing.attr("flag_address")().cast<std::uintptr_t>());
  r.trace_hook = py::object(tracing.attr("cpp_hook")).release().ptr();
  using A = py::detail::npy_api;
  const int nums[kNumDataTypes] = {A::NPY_BOOL_,  A::NPY_INT8_,  A::NPY_INT16_,   A::NPY_INT32_,  A::NPY_INT64_,
                                   A::NPY_UINT8_, 23 /*HALF*/,   A::NPY_FLOAT_,   A::NPY_DOUBLE_};
  for (int i = 0; i < kNumDataTypes; ++i) {
    r.descr[i] = r.api->PyArray_DescrFromType_(nums[i]);
    if (r.descr[i] == nullptr) throw py::error_already_set();
  }
  return r;
}

inline Runtime &Runtime::Get() {
  PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<Runtime> storage;
  return storage.call_once_and_store_result(LoadRuntime).get_stored();
}

inline py::object Steal(PyObject *o) {
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(o);
}

// ---- grad mode ----------------------------------------------------------
inline bool GradEnabled(const Runtime &rt) {
  PyObject *v = PyObject_GetAttr(rt.grad_state, rt.s_enabled);
  if (v == nullptr) throw py::error_already_set();
  bool on = (v == Py_True);
  Py_DECREF(v);
  return on;
}

// Sets the grad mode for a scope and puts the previous one back.
class GradModeGuard {
 public:
  GradModeGuard(const Runtime &rt, bool mode) : GradModeGuard(rt, mode, GradEnabled(rt)) {}
  GradModeGuard(const Runtime &rt, bool mode, bool prev) : rt_(rt), prev_(prev) {
    if (PyObject_SetAttr(rt_.grad_state, rt_.s_enabled, mode ? Py_True : Py_False) < 0) {
      throw py::error_already_set();
    }
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
  using A = py::detail::npy_api;
  auto *d = reinterpret_cast<py::detail::PyArrayDescr_Proxy *>(descr);
  if (d->byteorder == '>') throw py::type_error("opbuilder: big-endian arrays are not supported");
  const int tn = d->type_num;
  if (tn == A::NPY_BOOL_) return kBool;
  if (tn == A::NPY_BYTE_) return kInt8;
  if (tn == A::NPY_UBYTE_) return kUInt8;
  if (tn == A::NPY_SHORT_) return kInt16;
  if (tn == A::NPY_INT32_ || (tn == A::NPY_INT_ && sizeof(int) == 4)) return kInt32;
  if (tn == A::NPY_INT64_ || (tn == A::NPY_LONGLONG_ && sizeof(long long) == 8) ||
      (tn == A::NPY_LONG_ && sizeof(long) == 8)) {
    return kInt64;
  }
  if (tn == 23) return kFloat16;
  if (tn == A::NPY_FLOAT_) return kFloat32;
  if (tn == A::NPY_DOUBLE_) return kFloat64;
  (void)rt;
  std::string name = py::str(py::handle(descr)).cast<std::string>();
  throw py::type_error("opbuilder: unsupported tensor dtype " + name +
                       "; supported: bool, int8, int16, int32, int64, uint8, float16, float32, float64");
}

// A Tensor viewing `array`'s buffer; binds it to `owner` (a runtime.Tensor) if given.
inline TensorPtr TensorFromArray(const Runtime &rt, PyObject *array, PyObject *owner, bool requires_grad) {
  using A = py::detail::npy_api;
  auto *a = py::detail::array_proxy(array);
  DataType dt = DataTypeOfDescr(rt, a->descr);
  const auto es = static_cast<std::int64_t>(ElementSize(dt));
  const int nd = a->nd;
  bool usable = (a->flags & A::NPY_ARRAY_ALIGNED_) != 0;
  const bool writable = (a->flags & A::NPY_ARRAY_WRITEABLE_) != 0;  // the copy below, if any, stands for it
  ShapeVector shape(a->dimensions, a->dimensions + nd);
  ShapeVector strides;
  if (!(a->flags & A::NPY_ARRAY_C_CONTIGUOUS_)) {
    strides.resize(static_cast<std::size_t>(nd));
    for (int i = 0; i < nd; ++i) {
      if (a->strides[i] % es != 0) usable = false;
      strides[static_cast<std::size_t>(i)] = a->strides[i] / es;
    }
  }
  PyObject *src = array;
  py::object copy;
  if (!usable) {  // unaligned or odd strides: work on an aligned contiguous copy
    copy = Steal(rt.api->PyArray_NewCopy_(array, 0));
    src = copy.ptr();
    a = py::detail::array_proxy(src);
    strides.clear();
  }
  Py_INCREF(src);
  std::shared_ptr<void> storage(a->data, PyOwnerDeleter{src});
  auto t = std::make_shared<Tensor>(dt, std::move(shape), std::move(strides), a->data, std::move(storage), writable);
  if (owner != nullptr) t->BindPython(PyRef::Borrow(owner));
  t->set_requires_grad(requires_grad);
  return t;
}

// ---- GPU tensors (CuPy arrays): runtime/device_memory.py does the Python side ----
inline py::object DeviceMemoryModule() { return py::module_::import("runtime.device_memory"); }

// A Tensor over a GPU array's memory (made C-contiguous on its device first).
inline TensorPtr TensorFromDeviceArray(const Runtime &rt, PyObject *array, PyObject *owner, bool requires_grad) {
  py::tuple d = DeviceMemoryModule().attr("describe")(py::handle(array));
  py::object arr = d[0];
  void *ptr = reinterpret_cast<void *>(d[1].cast<std::uintptr_t>());
  ShapeVector shape = d[2].cast<ShapeVector>();
  DataType dt = DataTypeOfDescr(rt, d[3].ptr());
  const int device = d[4].cast<int>();
  std::shared_ptr<void> storage(ptr, PyOwnerDeleter{arr.release().ptr()});
  auto t = std::make_shared<Tensor>(dt, std::move(shape), ShapeVector{}, ptr, std::move(storage), true, device);
  if (owner != nullptr) t->BindPython(PyRef::Borrow(owner));
  t->set_requires_grad(requires_grad);
  return t;
}

inline TensorPtr TensorFromPy(const Runtime &rt, PyObject *obj) {
  py::object arr = Steal(PyObject_GetAttr(obj, rt.s_data));
  if (!rt.api->PyArray_Check_(arr.ptr())) {
    if (!PyObject_HasAttrString(arr.ptr(), "__cuda_array_interface__")) {
      throw py::type_error("opbuilder: runtime.Tensor._data is neither a numpy array nor a GPU array");
    }
    PyObject *rg = PyObject_GetAttr(obj, rt.s_requires_grad);
    if (rg == nullptr) throw py::error_already_set();
    const bool requires_grad = PyObject_IsTrue(rg) == 1;
    Py_DECREF(rg);
    return TensorFromDeviceArray(rt, arr.ptr(), obj, requires_grad);
  }
  PyObject *rg = PyObject_GetAttr(obj, rt.s_requires_grad);
  if (rg == nullptr) throw py::error_already_set();
  const bool requires_grad = PyObject_IsTrue(rg) == 1;
  Py_DECREF(rg);
  return TensorFromArray(rt, arr.ptr(), obj, requires_grad);
}

// ---- Tensor -> numpy / runtime.Tensor ------------------------------------
inline void DeleteStorageCapsule(PyObject *capsule) {
  delete static_cast<std::shared_ptr<void> *>(PyCapsule_GetPointer(capsule, "opbuilder.storage"));
}

// A new CuPy array over a GPU tensor's memory (new reference).
inline PyObject *DeviceArrayFromTensor(const Runtime &rt, const Tensor &t) {
  if (!t.is_contiguous()) throw py::value_error("opbuilder: a strided GPU tensor cannot be returned to Python");
  py::object owner;
  if (auto *del = std::get_deleter<PyOwnerDeleter>(t.storage())) {
    owner = py::reinterpret_borrow<py::object>(del->owner);
  } else {
    auto held = std::make_unique<std::shared_ptr<void>>(t.storage());
    owner = Steal(PyCapsule_New(held.get(), "opbuilder.storage", DeleteStorageCapsule));
    held.release();
  }
  py::object dtype = py::reinterpret_borrow<py::object>(rt.descr[t.dtype()]);
  py::tuple shape(static_cast<std::size_t>(t.ndim()));
  for (std::size_t i = 0; i < t.shape().size(); ++i) shape[i] = t.shape()[i];
  py::object arr = DeviceMemoryModule().attr("wrap")(reinterpret_cast<std::uintptr_t>(t.data_ptr()), t.nbytes(), shape,
                                                      dtype, t.device_index(), owner);
  return arr.release().ptr();
}

// A new numpy array over the tensor's memory (new reference); a CuPy array for a GPU tensor.
inline PyObject *ArrayFromTensor(const Runtime &rt, const Tensor &t) {
  if (t.is_cuda()) return DeviceArrayFromTensor(rt, t);
  using A = py::detail::npy_api;
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

  PyObject *base = nullptr;
  int flags = A::NPY_ARRAY_WRITEABLE_;
  if (auto *del = std::get_deleter<PyOwnerDeleter>(t.storage())) {
    base = del->owner;
    if (rt.api->PyArray_Check_(base)) flags = py::detail::array_proxy(base)->flags & A::NPY_ARRAY_WRITEABLE_;
    Py_INCREF(base);
  } else {
    auto owned = std::make_unique<std::shared_ptr<void>>(t.storage());
    base = PyCapsule_New(owned.get(), "opbuilder.storage", DeleteStorageCapsule);
    if (base == nullptr) throw py::error_already_set();
    owned.release();  // the capsule owns it now
  }
  PyObject *descr = rt.descr[t.dtype()];
  Py_INCREF(descr);
  PyObject *arr = rt.api->PyArray_NewFromDescr_(rt.api->PyArray_Type_, descr, static_cast<int>(nd), dims, strides,
                                                t.data_ptr(), flags, nullptr);
  if (arr == nullptr) {
    Py_DECREF(base);
    throw py::error_already_set();
  }
  py::detail::array_proxy(arr)->base = base;  // steals our reference
  return arr;
}

// A new runtime.Tensor object (without running __init__) holding `array`.
inline PyObject *NewPyTensor(const Runtime &rt, PyObject *array) {
  PyObject *obj = rt.tensor_type->tp_new(rt.tensor_type, rt.empty_tuple, nullptr);
  if (obj == nullptr) throw py::error_already_set();
  if (PyObject_SetAttr(obj, rt.s_data, array) < 0) {
    Py_DECREF(obj);
    throw py::error_already_set();
  }
  return obj;
}

// The runtime.Tensor for `t` (new reference): the one it is bound to, or a
// new one sharing its memory, to which `t` is then bound.
inline PyObject *ToPython(const Runtime &rt, const TensorPtr &t) {
  if (PyObject *o = t->py_object()) {
    Py_INCREF(o);
    return o;
  }
  py::object arr = Steal(ArrayFromTensor(rt, *t));
  PyObject *obj = NewPyTensor(rt, arr.ptr());
  t->BindPython(PyRef::Borrow(obj));
  return obj;
}

inline std::int64_t PyVersion(const Runtime &rt, PyObject *obj) {
  PyObject *v = PyObject_GetAttr(obj, rt.s_version);
  if (v == nullptr) throw py::error_already_set();
  long long n = PyLong_AsLongLong(v);
  Py_DECREF(v);
  return n;
}

inline void BumpVersion(const Runtime &rt, PyObject *obj) {
  py::object v = Steal(PyLong_FromLongLong(PyVersion(rt, obj) + 1));
  if (PyObject_SetAttr(obj, rt.s_version, v.ptr()) < 0) throw py::error_already_set();
}

}  // namespace detail
}  // namespace opbuilder

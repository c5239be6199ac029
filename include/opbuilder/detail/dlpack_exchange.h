// A torch tensor passed straight to an operator, read through DLPack's C exchange table.
//
// A framework whose tensor type carries `__dlpack_c_exchange_api__` (torch >= 2.10: a capsule
// named "dlpack_exchange_api") hands out a C function that describes a tensor as a DLTensor
// without allocating anything: a few hundred instructions, where torch's Python `__dlpack__` or
// `Tensor.numpy()` cost microseconds. TensorFromObject (src/core/runtime_bridge.cpp) tries this
// before runtime.interop.dlpack_input, for torch.Tensor and torch.nn.Parameter objects on the
// CPU; anything else, and any tensor this path cannot take as it is, goes the Python way, which
// says what is wrong (a conjugate or negative view, float8, another device, a subclass). Once
// to_torch's C++ bridge is loaded in the process, its ForeignApi::peek reads the tensor instead
// (torch's C++: no is_neg method call, which alone costs more than numpy's whole read).
//
// The Tensor made here keeps the torch tensor object alive (its storage's owner), as
// Tensor.numpy()'s array did. torch tensors are writable memory. An operator's write into one
// (MarkDirty) bumps torch's version counter too (BumpProducerVersion), so torch's autograd sees
// the change. Only the DLPack ABI's layout is spelled out here: its structs as dlpack.h v1 lays
// them out, up to the fields read.
#pragma once

#include "opbuilder/detail/visibility.h"

#include <Python.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>

#include "opbuilder/detail/errors.h"
#include "opbuilder/detail/foreign_api.h"
#include "opbuilder/detail/numpy_api.h"
#include "opbuilder/detail/pyref.h"
#include "opbuilder/dtype.h"
#include "opbuilder/tensor.h"

namespace opbuilder {
namespace detail OB_HIDDEN {
namespace dlpack {

struct Device {
  std::int32_t type;  // kDLCPU is 1
  std::int32_t id;
};

struct DataTypeCode {
  std::uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat, 5 complex, 6 bool; others are not taken here
  std::uint8_t bits;
  std::uint16_t lanes;
};

struct DLTensor {
  void *data;
  Device device;
  std::int32_t ndim;
  DataTypeCode dtype;
  std::int64_t *shape;
  std::int64_t *strides;  // in elements; null: C-contiguous
  std::uint64_t byte_offset;
};

// The exchange table's head and the functions used here; its other entries follow and are not read.
struct ExchangeApi {
  std::uint32_t major, minor;
  void *prev_api;
  void *managed_tensor_allocator;
  void *managed_tensor_from_py_object_no_sync;
  void *managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void *py_object, DLTensor *out);  // may be null
};

constexpr std::int32_t kCpu = 1;

// The opbuilder dtype of a DLPack dtype; false for one no operator takes (float8, vectors, ...).
inline bool DataTypeOf(DataTypeCode t, DataType *out) {
  if (t.lanes != 1) return false;
  switch (t.code) {
    case 0:
      *out = t.bits == 8 ? kInt8 : t.bits == 16 ? kInt16 : t.bits == 32 ? kInt32 : t.bits == 64 ? kInt64 : kTypeUnknown;
      break;
    case 1:
      *out = t.bits == 8 ? kUInt8 : t.bits == 16 ? kUInt16 : t.bits == 32 ? kUInt32 : t.bits == 64 ? kUInt64
                                                                                                    : kTypeUnknown;
      break;
    case 2: *out = t.bits == 16 ? kFloat16 : t.bits == 32 ? kFloat32 : t.bits == 64 ? kFloat64 : kTypeUnknown; break;
    case 4: *out = t.bits == 16 ? kBFloat16 : kTypeUnknown; break;
    case 5: *out = t.bits == 64 ? kComplex64 : t.bits == 128 ? kComplex128 : kTypeUnknown; break;
    case 6: *out = t.bits == 8 ? kBool : kTypeUnknown; break;
    default: return false;
  }
  return *out != kTypeUnknown;
}

// What this path knows of one Python type: its exchange table (null: the type is not taken here)
// and its unbound is_neg and is_conj methods.
struct KnownType {
  PyTypeObject *type = nullptr;  // a strong reference: the address is never reused for another type
  const ExchangeApi *api = nullptr;
  PyObject *is_neg = nullptr;
  PyObject *is_conj = nullptr;
  PyCFunction is_neg_fn = nullptr;  // is_neg's C function, called without the descriptor's dispatch
};

// An attribute of `o`, or null with no error set.
inline PyObject *AttrOrNull(PyObject *o, const char *name) {
  PyObject *v = o != nullptr ? PyObject_GetAttrString(o, name) : nullptr;
  if (v == nullptr) PyErr_Clear();
  return v;
}

// torch.Tensor or torch.nn.Parameter (`type`) as this path knows it: its exchange table if usable
// (DLPack major version 1, with the DLTensor function), else none. Errors met on the way are cleared.
inline KnownType LookUpType(PyTypeObject *type) {
  KnownType k;
  PyObject *t = reinterpret_cast<PyObject *>(type);
  Py_INCREF(t);
  k.type = type;
  PyRef capsule = PyRef::Steal(AttrOrNull(t, "__dlpack_c_exchange_api__"));
  if (capsule.get() == nullptr || !PyCapsule_IsValid(capsule.get(), "dlpack_exchange_api")) return k;
  // the table lives as long as the process (the protocol's rule), not just the capsule
  auto *api = static_cast<const ExchangeApi *>(PyCapsule_GetPointer(capsule.get(), "dlpack_exchange_api"));
  PyObject *is_neg = AttrOrNull(t, "is_neg");
  PyObject *is_conj = AttrOrNull(t, "is_conj");
  if (api == nullptr || api->major != 1 || api->dltensor_from_py_object_no_sync == nullptr || is_neg == nullptr ||
      is_conj == nullptr) {
    PyErr_Clear();
    Py_XDECREF(is_neg);
    Py_XDECREF(is_conj);
    return k;
  }
  k.api = api;
  k.is_neg = is_neg;  // kept for the process, as the type is
  k.is_conj = is_conj;
#if !defined(Py_LIMITED_API)
  if (Py_IS_TYPE(is_neg, &PyMethodDescr_Type)) {
    const PyMethodDef *def = reinterpret_cast<PyMethodDescrObject *>(is_neg)->d_method;
    if (def->ml_flags == METH_NOARGS) k.is_neg_fn = def->ml_meth;
  }
#endif
  return k;
}

// The KnownType of `type` if it is torch.Tensor or torch.nn.Parameter (the only types this path takes),
// else nullptr. The two are looked up once torch is imported and compared by address after: any other
// type costs two comparisons. (A table of the first types met, whatever they were, missed torch's in a
// process that met many types first: its writes then skipped torch's version counter.) Called with the
// GIL held; a lookup runs Python code, so two threads may both look up, with the same result.
inline const KnownType *FindType(PyTypeObject *type) {
  static KnownType tensor, parameter;
  static bool ready = false;
  if (!ready) {
    static PyObject *const name = PyUnicode_FromString("torch");  // a module name, made once, under the GIL
    PyRef torch = PyRef::Steal(name != nullptr ? PyImport_GetModule(name) : nullptr);
    if (torch.get() == nullptr) {  // not imported (yet): no tensor here is torch's
      PyErr_Clear();
      return nullptr;
    }
    PyRef t = PyRef::Steal(AttrOrNull(torch.get(), "Tensor"));
    PyRef nn = PyRef::Steal(AttrOrNull(torch.get(), "nn"));
    PyRef p = PyRef::Steal(AttrOrNull(nn.get(), "Parameter"));
    if (t.get() == nullptr || p.get() == nullptr || !PyType_Check(t.get()) || !PyType_Check(p.get())) {
      return nullptr;  // torch is still importing: looked up again on the next call
    }
    KnownType kt = LookUpType(reinterpret_cast<PyTypeObject *>(t.get()));
    KnownType kp = LookUpType(reinterpret_cast<PyTypeObject *>(p.get()));
    if (!ready) {
      tensor = kt;
      parameter = kp;
      ready = true;
    }
  }
  if (type == tensor.type) return &tensor;
  if (type == parameter.type) return &parameter;
  return nullptr;
}

// The DLTensor's strides are C order's, as IsContiguousLayout (tensor_details.h) decides it for a
// Tensor's: then the Tensor gets no strides vector to allocate and drop.
inline bool IsCContiguous(const DLTensor &dl) {
  std::int64_t want = 1;
  for (std::int32_t i = dl.ndim; i-- > 0;) {
    if (dl.shape[i] == 0) return true;
    if (dl.shape[i] != 1 && dl.strides[i] != want) return false;
    want *= dl.shape[i];
  }
  return true;
}

// `method(o)` is True (through `fn`, its C function, if given); an error counts as true (the Python
// path then reports what is wrong).
inline bool Says(PyObject *method, PyObject *o, PyCFunction fn = nullptr) {
  PyObject *r = fn != nullptr ? fn(o, nullptr) : PyObject_CallOneArg(method, o);
  if (r == nullptr) {
    PyErr_Clear();
    return true;
  }
  const bool yes = r != Py_False;
  Py_DECREF(r);
  return yes;
}

}  // namespace dlpack

// A Tensor over `data` (the torch tensor `o`'s memory, `o` kept alive as its owner), or nullptr where
// numpy would not take it as it is (misaligned: the Python path copies it). `strides` in elements, null
// or C order's: no strides vector.
inline TensorPtr TensorOverTorch(PyObject *o, char *data, DataType dt, const std::int64_t *shape, std::int32_t ndim,
                                 const std::int64_t *strides) {
  const std::size_t es = ElementSize(dt);
  const std::size_t align = (dt == kComplex64 || dt == kComplex128) ? es / 2 : es;  // numpy's alignment
  if (reinterpret_cast<std::uintptr_t>(data) % align != 0) return nullptr;  // the Python path copies it
  ShapeVector shape_v = TakeShape();
  shape_v.assign(shape, shape + ndim);
  ShapeVector strides_v;
  if (strides != nullptr) strides_v.assign(strides, strides + ndim);
  Py_INCREF(o);
  std::shared_ptr<void> storage(data, PyOwnerDeleter{o}, PoolAllocator<void>());
  return NewTensor(dt, std::move(shape_v), std::move(strides_v), data, std::move(storage), true);
}

// Once per process (per core library): a torch tensor reached an operator straight while no bridge is
// loaded. opbuilder's `_torch_tensor_seen` (torch_bridge.request, a lazy name of the package) then loads to_torch's C++ bridge on a thread if the cache
// has it (else starts its build in a detached process, for later processes), so that the next
// tensors are read by peek, without torch's Python is_neg. It never fails the call: errors are cleared.
inline void AskForTorchBridge() {
  static std::atomic<bool> asked{false};
  // a plain load on every later call (this path's per-call cost), the exchange once
  if (asked.load(std::memory_order_relaxed) || asked.exchange(true, std::memory_order_relaxed)) return;
  PyRef pkg = PyRef::Steal(PyImport_ImportModule("opbuilder"));
  PyRef r = PyRef::Steal(pkg.get() != nullptr ? PyObject_CallMethod(pkg.get(), "_torch_tensor_seen", nullptr)
                                              : nullptr);
  if (r.get() == nullptr) PyErr_Clear();
}

// `o` as a Tensor over its memory if it is a CPU torch tensor this path takes as it is; else nullptr,
// and the caller goes the Python way. Called with the GIL held. Once to_torch's C++ bridge is loaded,
// torch's own C++ reads the tensor (ForeignApi::peek: a few field reads); before, the exchange table
// does, after torch's is_neg (a method call that releases and takes back the GIL: most of the cost),
// and the first such call asks for the bridge (AskForTorchBridge).
inline TensorPtr TensorFromExchange(PyObject *o) {
  const dlpack::KnownType *k = dlpack::FindType(Py_TYPE(o));
  if (k == nullptr) return nullptr;
  if (const ForeignApi *bridge = LoadedForeign()) {
    ForeignTensor f;
    if (bridge->peek(o, &f) != 1) return nullptr;  // a conjugate or negative view, another device, ...
    return TensorOverTorch(o, static_cast<char *>(f.data), static_cast<DataType>(f.dtype), f.shape, f.ndim,
                           f.strides);
  }
  AskForTorchBridge();
  if (k->api == nullptr) return nullptr;
  if (dlpack::Says(k->is_neg, o, k->is_neg_fn)) return nullptr;  // a lazily negated view: DLPack cannot say so
  dlpack::DLTensor dl;
  if (k->api->dltensor_from_py_object_no_sync(o, &dl) != 0) {  // no storage (a functorch wrapper, meta), ...
    PyErr_Clear();
    return nullptr;
  }
  DataType dt = kTypeUnknown;
  if (dl.device.type != dlpack::kCpu || dl.ndim < 0 || !dlpack::DataTypeOf(dl.dtype, &dt)) return nullptr;
  if (dt == kComplex64 || dt == kComplex128) {  // only a complex tensor can be a conjugate view
    if (dlpack::Says(k->is_conj, o)) return nullptr;
    if (k->api->dltensor_from_py_object_no_sync(o, &dl) != 0) {  // again: is_conj ran Python's machinery
      PyErr_Clear();
      return nullptr;
    }
  }
  // C order's strides are left out (torch always gives strides): no vector to drop
  const std::int64_t *strides = dl.strides != nullptr && !dlpack::IsCContiguous(dl) ? dl.strides : nullptr;
  return TensorOverTorch(o, static_cast<char *>(dl.data) + dl.byte_offset, dt, dl.shape, dl.ndim, strides);
}

// The base of a numpy array over a Tensor's memory whose storage `owner` keeps alive (StorageOwner's
// new reference, stolen): `owner` itself, or, for a torch tensor taken by TensorFromExchange, torch's
// own numpy view of it (runtime._native.torch_array, from runtime.dlpack_host), for which torch keeps the storage where it
// is: a resize_ of the torch tensor would otherwise free memory the array still points to (it raises
// instead, as after Tensor.numpy()). Only an argument an op hands back gets here.
inline PyObject *PinnedBase(PyObject *owner, const NumpyApi &np) {
  if (np.IsArray(owner) || PyCapsule_CheckExact(owner)) return owner;
  PyRef held = PyRef::Steal(owner);
  PyRef name = PyRef::Steal(Check(PyUnicode_FromString("torch")));
  PyRef torch = PyRef::Steal(PyImport_GetModule(name.get()));
  if (torch.get() == nullptr) {
    if (PyErr_Occurred()) throw PythonError();
    return held.release();
  }
  PyRef tensor = PyRef::Steal(dlpack::AttrOrNull(torch.get(), "Tensor"));
  if (tensor.get() == nullptr || !PyType_Check(tensor.get()) ||
      !PyObject_TypeCheck(owner, reinterpret_cast<PyTypeObject *>(tensor.get()))) {
    return held.release();
  }
  PyRef native = PyRef::Steal(Check(PyImport_ImportModule("runtime._native")));
  PyRef view = PyRef::Steal(Check(PyObject_GetAttrString(native.get(), "torch_array")));
  return Check(PyObject_CallOneArg(view.get(), owner));
}

// After an operator wrote a tensor's memory in place (MarkDirty, or a write its checks found): if
// that memory is a torch tensor's, taken by TensorFromExchange (the storage's owner; a numpy owner,
// the usual one, is told without a lookup), torch's version counter goes up too, so torch's autograd
// sees the write. Throws PythonError if torch refuses.
inline void BumpProducerVersion(const Tensor &t, const NumpyApi &np) {
  auto *del = std::get_deleter<PyOwnerDeleter>(t.storage());
  if (del == nullptr || np.IsArray(del->owner)) return;
  PyRef name = PyRef::Steal(PyUnicode_FromString("torch"));
  PyRef torch = PyRef::Steal(name ? PyImport_GetModule(name.get()) : nullptr);
  if (torch.get() == nullptr) {
    PyErr_Clear();
    return;
  }
  PyRef tensor = PyRef::Steal(dlpack::AttrOrNull(torch.get(), "Tensor"));
  if (tensor.get() == nullptr || !PyType_Check(tensor.get()) ||
      !PyObject_TypeCheck(del->owner, reinterpret_cast<PyTypeObject *>(tensor.get()))) {
    return;
  }
  PyRef c = PyRef::Steal(dlpack::AttrOrNull(torch.get(), "_C"));
  PyRef bump = PyRef::Steal(dlpack::AttrOrNull(c.get(), "_increment_version"));
  if (bump.get() == nullptr) return;
  PyRef one = PyRef::Steal(Check(PyTuple_Pack(1, del->owner)));  // it takes tensors; a tensor alone is
  PyRef r = PyRef::Steal(PyObject_CallOneArg(bump.get(), one.get()));  // iterated, one bump per row
  if (r.get() == nullptr) throw PythonError();
}

}  // namespace detail
}  // namespace opbuilder

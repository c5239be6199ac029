// The call path of aot operators (runtime.ops.Custom): numpy arrays in, the C
// ABI `int f(int nparam, void **params, int *ndims, int64_t **shapes, const
// char **dtypes, void *stream, void *extra)` called, numpy arrays out.
//
// Built once per machine by the builder (runtime/ops/aot_trampoline.py) and
// kept, like any operator. Written against the CPython and numpy C APIs
// directly: a call costs well under a microsecond here, where setting up the
// same call through ctypes costs about ten.
//
//   run(fn, extra, inputs, out_specs, scratch) -> tuple of outputs
//   call(fn, extra, nparam, params, ndims, shapes, dtypes, stream) -> None: the
//       same call on argument arrays made by the caller (addresses; the GPU
//       path, aot_device.py, which has device pointers, not numpy arrays)
//   init(fn, extra, inputs, out_specs) -> int status of <Symbol>Init
//   run_tensors(fn, extra, tensors, out_specs, Tensor, grad[, with_shapes]) -> the op's result: run on
//       the tensors' arrays, each output wrapped as a new Tensor (the one, or a tuple); None, having called
//       nothing, when an input is not a Tensor or (grad true) one requires grad: the caller's general path
//       then runs the call (Custom.__call__'s fast path for a ready host op). out_specs is the op's fixed
//       specs, or a dict of the specs remembered per input signature (memo_key's bytes: the arrays' dtype
//       numbers, and shapes if with_shapes): a signature not in it is None too, and the general path
//       works its specs out (the op's out_shape/out_dtype callables, its op-info check) and adds them
//   memo_key(signature, with_shapes) -> the bytes run_tensors looks a call up by, from the Python
//       signature of its inputs: ((shape, dtype), ...) with shapes, (dtype, ...) without
//
// A kernel call that fails (a non-zero status, or an error recorded in its
// extra, or a C++ exception it let out: "threw a C++ exception: <what()>")
// raises KernelFailed(status, error text). Each call gets its own copy
// of the op's extra header with an empty error buffer (CallExtra), so the text
// is that call's, whatever other threads' calls of the op record meanwhile;
// nothing of it is left in the op's buffer.
//
// fn and extra are addresses (int); inputs a tuple of ndarrays (copied here
// when they are not C-contiguous, aligned and writable: a read-only input
// reaches the kernel as a private copy, so a kernel that writes into it
// neither faults on nor changes read-only memory); out_specs a tuple of (shape tuple,
// numpy dtype) for the outputs this call allocates; scratch a tuple of
// ndarrays passed after the outputs (Init's workspaces).
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>  // T_OBJECT_EX: the type of a __slots__ member
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <type_traits>
#include <vector>

#include "opbuilder/aot.h"

#ifndef OB_EXTENSION_NAME
#define OB_EXTENSION_NAME _aot_call
#endif
#define OB_CAT2(a, b) a##b
#define OB_CAT(a, b) OB_CAT2(a, b)
#define OB_STR2(a) #a
#define OB_STR(a) OB_STR2(a)

namespace {

using KernelFn = int (*)(int, void **, int *, int64_t **, const char **, void *, void *);
using InitFn = int (*)(int *, int64_t **, const char **, opbuilder::AotExtra *);

// A few slots on the stack, more on the heap: most ops have under 16 params.
template <typename T>
class Slots {
 public:
  explicit Slots(size_t n) : ptr_(stack_) {
    if (n > kStack) {
      heap_.resize(n);
      ptr_ = heap_.data();
    }
  }
  T &operator[](size_t i) { return ptr_[i]; }
  T *data() { return ptr_; }

 private:
  static constexpr size_t kStack = 16;
  T stack_[kStack];
  std::vector<T> heap_;
  T *ptr_;
};

// ml_dtypes' bfloat16: a run-time registered numpy dtype of kind 'V' whose scalar type is named bfloat16.
bool IsBFloat16(const PyArray_Descr *d, int size) {
  if (d->type_num < NPY_USERDEF || size != 2) return false;
  const char *name = reinterpret_cast<PyTypeObject *>(d->typeobj)->tp_name;
  const char *dot = std::strrchr(name, '.');
  return std::strcmp(dot != nullptr ? dot + 1 : name, "bfloat16") == 0;
}

// The ABI's name of an array's dtype (opbuilder::DataTypeName's names); nullptr for one aot ops do not take.
const char *DtypeName(PyArrayObject *a) {
  const PyArray_Descr *d = PyArray_DESCR(a);
  const int size = static_cast<int>(PyArray_ITEMSIZE(a));
  if (d->byteorder == '>') return nullptr;
  switch (d->kind) {
    case 'f': return size == 2 ? "float16" : size == 4 ? "float32" : size == 8 ? "float64" : nullptr;
    case 'i': return size == 1 ? "int8" : size == 2 ? "int16" : size == 4 ? "int32" : size == 8 ? "int64" : nullptr;
    case 'u': return size == 1 ? "uint8" : size == 2 ? "uint16" : size == 4 ? "uint32" : size == 8 ? "uint64" : nullptr;
    case 'c': return size == 8 ? "complex64" : size == 16 ? "complex128" : nullptr;
    case 'b': return "bool";
    case 'V': return IsBFloat16(d, size) ? "bfloat16" : nullptr;
    default: return nullptr;
  }
}

// The arguments of one call: pointers into arrays this object keeps alive.
class CallArgs {
 public:
  explicit CallArgs(size_t n) : params_(n), ndims_(n), shapes_(n), dtypes_(n), owned_(n) {}
  CallArgs(const CallArgs &) = delete;
  CallArgs &operator=(const CallArgs &) = delete;
  ~CallArgs() {
    for (size_t i = 0; i < filled_; ++i) Py_XDECREF(owned_[i]);
  }

  // Add an array (a new reference is taken); false with a Python error set.
  bool Add(PyObject *obj, bool make_contiguous, const char *what, Py_ssize_t index) {
    if (!PyArray_Check(obj)) {
      PyErr_Format(PyExc_TypeError, "%s %zd is a %s, not a numpy array", what, index, Py_TYPE(obj)->tp_name);
      return false;
    }
    PyArrayObject *a = reinterpret_cast<PyArrayObject *>(obj);
    if (make_contiguous && !PyArray_ISCARRAY(a)) {  // not C-contiguous, aligned and writable: a private copy
      a = reinterpret_cast<PyArrayObject *>(PyArray_NewCopy(a, NPY_CORDER));
      if (a == nullptr) return false;
    } else {
      Py_INCREF(a);
    }
    owned_[filled_++] = reinterpret_cast<PyObject *>(a);
    const char *name = DtypeName(a);
    if (name == nullptr) {
      PyErr_Format(PyExc_TypeError, "%s %zd has a dtype aot operators do not take; they take float16, bfloat16, "
                   "float32, float64, complex64, complex128, int8, int16, int32, int64, uint8, uint16, uint32, "
                   "uint64, bool", what, index);
      return false;
    }
    const size_t i = filled_ - 1;
    params_[i] = PyArray_DATA(a);
    ndims_[i] = PyArray_NDIM(a);
    dtypes_[i] = name;
    if constexpr (std::is_same_v<npy_intp, int64_t>) {
      shapes_[i] = ndims_[i] > 0 ? PyArray_DIMS(a) : &zero_dim_;
    } else {
      dims_copy_.emplace_back(PyArray_DIMS(a), PyArray_DIMS(a) + ndims_[i]);
      shapes_[i] = dims_copy_.back().data();
    }
    return true;
  }

  // Allocate an output from (shape tuple, dtype); it is kept here and returned by Take.
  bool AddOutput(PyObject *spec, Py_ssize_t index) {
    PyObject *shape = nullptr, *dtype = nullptr;
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 2) {
      PyErr_SetString(PyExc_TypeError, "out_specs entries must be (shape, dtype)");
      return false;
    }
    shape = PyTuple_GET_ITEM(spec, 0);
    dtype = PyTuple_GET_ITEM(spec, 1);
    PyArray_Descr *descr = nullptr;
    if (!PyArray_DescrConverter(dtype, &descr)) return false;
    if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) > NPY_MAXDIMS) {
      Py_DECREF(descr);
      PyErr_SetString(PyExc_TypeError, "an output shape must be a tuple of at most NPY_MAXDIMS ints");
      return false;
    }
    const int nd = static_cast<int>(PyTuple_GET_SIZE(shape));
    npy_intp dims[NPY_MAXDIMS];
    for (int k = 0; k < nd; ++k) {
      dims[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, k));
      if (dims[k] == -1 && PyErr_Occurred()) {
        Py_DECREF(descr);
        return false;
      }
    }
    PyObject *out = PyArray_Empty(nd, dims, descr, 0);  // steals descr
    if (out == nullptr) return false;
    bool ok = Add(out, false, "output", index);
    Py_DECREF(out);
    return ok;
  }

  size_t filled() const { return filled_; }
  PyObject *owned(size_t i) { return owned_[i]; }
  void **params() { return params_.data(); }
  int *ndims() { return ndims_.data(); }
  int64_t **shapes() { return shapes_.data(); }
  const char **dtypes() { return dtypes_.data(); }

  // The arrays [begin, end) as a new tuple.
  PyObject *Take(size_t begin, size_t end) {
    PyObject *t = PyTuple_New(static_cast<Py_ssize_t>(end - begin));
    if (t == nullptr) return nullptr;
    for (size_t i = begin; i < end; ++i) {
      Py_INCREF(owned_[i]);
      PyTuple_SET_ITEM(t, static_cast<Py_ssize_t>(i - begin), owned_[i]);
    }
    return t;
  }

 private:
  size_t filled_ = 0;
  Slots<void *> params_;
  Slots<int> ndims_;
  Slots<int64_t *> shapes_;
  Slots<const char *> dtypes_;
  Slots<PyObject *> owned_;
  std::vector<std::vector<int64_t>> dims_copy_;
  int64_t zero_dim_ = 0;
};

bool AsAddress(PyObject *obj, void **out) {
  *out = PyLong_AsVoidPtr(obj);
  return !(*out == nullptr && PyErr_Occurred());
}

bool Gather(CallArgs *args, PyObject *inputs, PyObject *out_specs, PyObject *scratch) {
  const Py_ssize_t nin = PyTuple_GET_SIZE(inputs);
  for (Py_ssize_t i = 0; i < nin; ++i) {
    if (!args->Add(PyTuple_GET_ITEM(inputs, i), true, "input", i)) return false;
  }
  const Py_ssize_t nout = PyTuple_GET_SIZE(out_specs);
  for (Py_ssize_t i = 0; i < nout; ++i) {
    if (!args->AddOutput(PyTuple_GET_ITEM(out_specs, i), i)) return false;
  }
  const Py_ssize_t nscratch = scratch != nullptr ? PyTuple_GET_SIZE(scratch) : 0;
  for (Py_ssize_t i = 0; i < nscratch; ++i) {
    if (!args->Add(PyTuple_GET_ITEM(scratch, i), false, "workspace", i)) return false;
  }
  return true;
}

// The arguments run and init share: count, the two addresses, tuples after them.
bool ParseCall(PyObject *const *a, Py_ssize_t n, Py_ssize_t want, const char *usage, void **fn, void **extra) {
  if (n != want) {
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, got %zd", usage, want, n);
    return false;
  }
  if (!AsAddress(a[0], fn) || !AsAddress(a[1], extra)) return false;
  for (Py_ssize_t i = 2; i < want; ++i) {
    if (!PyTuple_Check(a[i])) {
      PyErr_Format(PyExc_TypeError, "%s: argument %zd must be a tuple", usage, i);
      return false;
    }
  }
  return true;
}

PyObject *g_kernel_failed = nullptr;  // the KernelFailed exception type
PyObject *g_data = nullptr;           // "_data": a Tensor's array
PyObject *g_requires_grad = nullptr;  // "requires_grad"
PyObject *g_empty = nullptr;          // ()

// The `extra` one kernel call gets: the op's attributes, kernel data and workspace sizes,
// with an error buffer of its own, so that an error a call records (AotExtra::Attr) is
// that call's, never another thread's running the same op at the same time.
class CallExtra {
 public:
  explicit CallExtra(void *shared) : shared_(static_cast<opbuilder::aot::ExtraData *>(shared)) {
    if (shared_ == nullptr) return;
    std::memcpy(&local_, shared_, offsetof(opbuilder::aot::ExtraData, error));
    local_.error[0] = '\0';
  }
  void *get() { return shared_ != nullptr ? &local_ : nullptr; }
  // After the call, with the GIL held: kernel data the call replaced goes to the op.
  // The error it recorded ("" if none) stays the call's own.
  const char *Finish() {
    if (shared_ == nullptr) return "";
    if (local_.kernel_data != shared_->kernel_data) {
      shared_->kernel_data = local_.kernel_data;
      shared_->kernel_data_deleter = local_.kernel_data_deleter;
    }
    local_.error[sizeof(local_.error) - 1] = '\0';
    return local_.error;
  }

 private:
  opbuilder::aot::ExtraData *shared_;
  opbuilder::aot::ExtraData local_;
};

// A C++ exception a kernel or Init let out (aot.h: none may cross the C ABI) as error text, so it
// is raised as a RuntimeError instead of unwinding into the interpreter (std::terminate). Called in
// a catch block; writes into the call's error buffer unless the call recorded an error first.
void Thrown(char *error) {
  if (error[0] != '\0') return;
  try {
    throw;
  } catch (const std::exception &e) {
    std::snprintf(error, opbuilder::aot::kErrorSize, "threw a C++ exception: %s", e.what());
  } catch (...) {
    std::snprintf(error, opbuilder::aot::kErrorSize, "threw a C++ exception (not a std::exception)");
  }
}

// One kernel call, the one way run and call make it: on its own CallExtra, with the GIL
// released. False with KernelFailed(status, error text) set when the kernel failed.
bool Invoke(KernelFn fn, void *extra, int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
            void *stream) {
  CallExtra call_extra(extra);
  int status = 0;
  char thrown[opbuilder::aot::kErrorSize] = "";
  Py_BEGIN_ALLOW_THREADS
  try {
    status = fn(nparam, params, ndims, shapes, dtypes, stream, call_extra.get());
  } catch (...) {
    Thrown(thrown);
  }
  Py_END_ALLOW_THREADS
  const char *recorded = call_extra.Finish();  // an error recorded before a throw was the first
  const char *error = recorded[0] != '\0' ? recorded : thrown;
  if (status == 0 && error[0] == '\0') return true;
  PyObject *args = Py_BuildValue("(is)", status, error);
  if (args == nullptr) {  // text that is not UTF-8: its bytes, escaped
    PyErr_Clear();
    PyObject *text = PyUnicode_DecodeUTF8(error, static_cast<Py_ssize_t>(std::strlen(error)), "replace");
    if (text == nullptr) return false;
    args = Py_BuildValue("(iN)", status, text);
    if (args == nullptr) return false;
  }
  PyErr_SetObject(g_kernel_failed, args);
  Py_DECREF(args);
  return false;
}

PyObject *Run(PyObject *, PyObject *const *a, Py_ssize_t n) {
  void *fn_addr = nullptr, *extra = nullptr;
  if (!ParseCall(a, n, 5, "run(fn, extra, inputs, out_specs, scratch)", &fn_addr, &extra)) return nullptr;
  const size_t nin = static_cast<size_t>(PyTuple_GET_SIZE(a[2]));
  const size_t nout = static_cast<size_t>(PyTuple_GET_SIZE(a[3]));
  CallArgs args(nin + nout + static_cast<size_t>(PyTuple_GET_SIZE(a[4])));
  if (!Gather(&args, a[2], a[3], a[4])) return nullptr;
  if (!Invoke(reinterpret_cast<KernelFn>(fn_addr), extra, static_cast<int>(args.filled()), args.params(),
              args.ndims(), args.shapes(), args.dtypes(), nullptr)) {
    return nullptr;
  }
  return args.Take(nin, nin + nout);
}

// New references, dropped when this goes out of scope.
class Refs {
 public:
  explicit Refs(size_t n) : refs_(n) {}
  Refs(const Refs &) = delete;
  Refs &operator=(const Refs &) = delete;
  ~Refs() {
    for (size_t i = 0; i < filled_; ++i) Py_DECREF(refs_[i]);
  }
  void Add(PyObject *obj) { refs_[filled_++] = obj; }
  PyObject *operator[](size_t i) { return refs_[i]; }

 private:
  size_t filled_ = 0;
  Slots<PyObject *> refs_;
};

// The byte offset of runtime.Tensor's `_base_ref` slot in `type` (runtime/tensor.py: set by every way a
// Tensor is made), found once from the slot's member descriptor; 0 if it is no slot.
Py_ssize_t BaseRefSlot(PyTypeObject *type) {
  static Py_ssize_t offset = -1;
  if (offset >= 0) return offset;
  offset = 0;
  PyObject *d = PyObject_GetAttrString(reinterpret_cast<PyObject *>(type), "__dict__");
  PyObject *m = d != nullptr ? PyMapping_GetItemString(d, "_base_ref") : nullptr;
  if (m != nullptr && Py_IS_TYPE(m, &PyMemberDescr_Type)) {
    const PyMemberDef *def = reinterpret_cast<PyMemberDescrObject *>(m)->d_member;
    if (def->type == T_OBJECT_EX && def->offset > 0) offset = def->offset;
  }
  Py_XDECREF(m);
  Py_XDECREF(d);
  PyErr_Clear();
  return offset;
}

// A new instance of `type` holding `array` as its _data, no view (`_base_ref` None): object.__new__(type),
// then the attributes.
PyObject *Wrap(PyTypeObject *type, PyObject *array) {
  PyObject *t = PyBaseObject_Type.tp_new(type, g_empty, nullptr);
  if (t == nullptr) return nullptr;
  if (PyObject_SetAttr(t, g_data, array) < 0) {
    Py_DECREF(t);
    return nullptr;
  }
  if (const Py_ssize_t off = BaseRefSlot(type)) {
    Py_INCREF(Py_None);
    *reinterpret_cast<PyObject **>(reinterpret_cast<char *>(t) + off) = Py_None;  // unset until now
  } else if (PyObject_SetAttrString(t, "_base_ref", Py_None) < 0) {
    Py_DECREF(t);
    return nullptr;
  }
  return t;
}

// The dtype in a memo key: numpy gives one integer type two numbers where two C types have its size (int64 is
// 'l' and 'q' on Linux), and the two dtypes compare equal, as they do in custom.py's memo: one number for both.
int64_t DtypeKey(const PyArray_Descr *d) {
  int t = d->type_num;
  if (sizeof(long long) == sizeof(long) && (t == NPY_LONGLONG || t == NPY_ULONGLONG)) {
    t = t == NPY_LONGLONG ? NPY_LONG : NPY_ULONG;
  } else if (sizeof(int) == sizeof(long) && (t == NPY_INT || t == NPY_UINT)) {
    t = t == NPY_INT ? NPY_LONG : NPY_ULONG;
  }
  return t;
}

// Builds a memo key: int64s, the number of inputs first, then per input its dtype (DtypeKey) and, with
// shapes, its ndim and dims. memo_key and run_tensors both build it this way, so they agree.
class MemoKey {
 public:
  explicit MemoKey(size_t nin) { Put(static_cast<int64_t>(nin)); }
  void Put(int64_t v) {
    if (n_ == kStack && heap_.empty()) heap_.assign(stack_, stack_ + kStack);
    if (!heap_.empty()) {
      heap_.push_back(v);
    } else {
      stack_[n_] = v;
    }
    ++n_;
  }
  PyObject *Bytes() const {
    const int64_t *p = heap_.empty() ? stack_ : heap_.data();
    return PyBytes_FromStringAndSize(reinterpret_cast<const char *>(p),
                                     static_cast<Py_ssize_t>(n_ * sizeof(int64_t)));
  }

 private:
  static constexpr size_t kStack = 32;
  int64_t stack_[kStack];
  std::vector<int64_t> heap_;
  size_t n_ = 0;
};

// The memo key of a call on `arrays` (new reference); nullptr with no error set when an input is no
// array of a dtype aot operators take (the general path then says what is wrong).
PyObject *ArraysKey(Refs &arrays, size_t nin, bool with_shapes) {
  MemoKey key(nin);
  for (size_t i = 0; i < nin; ++i) {
    if (!PyArray_Check(arrays[i])) return nullptr;
    PyArrayObject *x = reinterpret_cast<PyArrayObject *>(arrays[i]);
    if (DtypeName(x) == nullptr) return nullptr;  // a byte-swapped array, say: never looked up
    key.Put(DtypeKey(PyArray_DESCR(x)));
    if (with_shapes) {
      key.Put(PyArray_NDIM(x));
      for (int d = 0; d < PyArray_NDIM(x); ++d) key.Put(PyArray_DIMS(x)[d]);
    }
  }
  return key.Bytes();
}

// memo_key(signature, with_shapes): the key Custom adds remembered specs under (custom.py _prepare).
PyObject *MemoKeyOf(PyObject *, PyObject *const *a, Py_ssize_t n) {
  if (n != 2 || !PyTuple_Check(a[0])) {
    PyErr_SetString(PyExc_TypeError, "memo_key(signature: tuple, with_shapes: bool)");
    return nullptr;
  }
  const int with_shapes = PyObject_IsTrue(a[1]);
  if (with_shapes < 0) return nullptr;
  const Py_ssize_t nin = PyTuple_GET_SIZE(a[0]);
  MemoKey key(static_cast<size_t>(nin));
  for (Py_ssize_t i = 0; i < nin; ++i) {
    PyObject *item = PyTuple_GET_ITEM(a[0], i);
    PyObject *dtype = item, *shape = nullptr;
    if (with_shapes) {
      if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 || !PyTuple_Check(PyTuple_GET_ITEM(item, 0))) {
        PyErr_SetString(PyExc_TypeError, "memo_key: a signature with shapes holds (shape tuple, dtype) pairs");
        return nullptr;
      }
      shape = PyTuple_GET_ITEM(item, 0);
      dtype = PyTuple_GET_ITEM(item, 1);
    }
    if (!PyArray_DescrCheck(dtype)) {
      PyErr_SetString(PyExc_TypeError, "memo_key: dtypes must be numpy dtypes");
      return nullptr;
    }
    key.Put(DtypeKey(reinterpret_cast<PyArray_Descr *>(dtype)));
    if (shape != nullptr) {
      key.Put(PyTuple_GET_SIZE(shape));
      for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(shape); ++d) {
        const long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
        if (v == -1 && PyErr_Occurred()) return nullptr;
        key.Put(v);
      }
    }
  }
  return key.Bytes();
}

PyObject *RunTensors(PyObject *, PyObject *const *a, Py_ssize_t n) {
  void *fn_addr = nullptr, *extra = nullptr;
  const char *usage = "run_tensors(fn, extra, tensors, out_specs, Tensor, grad[, with_shapes])";
  if (n != 6 && n != 7) {
    PyErr_Format(PyExc_TypeError, "%s takes 6 or 7 arguments, got %zd", usage, n);
    return nullptr;
  }
  PyObject *memo = PyDict_Check(a[3]) ? a[3] : nullptr;
  if (memo == nullptr && !PyTuple_Check(a[3])) {
    PyErr_Format(PyExc_TypeError, "%s: out_specs must be a tuple or a dict", usage);
    return nullptr;
  }
  if (!ParseCall(a, 3, 3, usage, &fn_addr, &extra)) return nullptr;  // the first three: addresses, a tuple
  if (!PyType_Check(a[4])) {
    PyErr_SetString(PyExc_TypeError, "run_tensors: argument 4 must be the Tensor type");
    return nullptr;
  }
  PyTypeObject *type = reinterpret_cast<PyTypeObject *>(a[4]);
  const int grad = PyObject_IsTrue(a[5]);
  if (grad < 0) return nullptr;
  PyObject *tensors = a[2];
  const size_t nin = static_cast<size_t>(PyTuple_GET_SIZE(tensors));
  Refs arrays(nin + 1);  // and the remembered specs, held while the outputs are made
  for (size_t i = 0; i < nin; ++i) {
    PyObject *x = PyTuple_GET_ITEM(tensors, static_cast<Py_ssize_t>(i));
    if (!PyObject_TypeCheck(x, type)) Py_RETURN_NONE;
    if (grad) {
      PyObject *flag = PyObject_GetAttr(x, g_requires_grad);
      if (flag == nullptr) return nullptr;
      const int on = PyObject_IsTrue(flag);
      Py_DECREF(flag);
      if (on < 0) return nullptr;
      if (on) Py_RETURN_NONE;  // a graph node to record: the general path
    }
    PyObject *data = PyObject_GetAttr(x, g_data);
    if (data == nullptr) return nullptr;
    arrays.Add(data);
  }
  PyObject *specs = a[3];
  if (memo != nullptr) {  // the specs remembered for this signature; None (the general path) if none yet
    int with_shapes = 1;
    if (n == 7 && (with_shapes = PyObject_IsTrue(a[6])) < 0) return nullptr;
    PyObject *key = ArraysKey(arrays, nin, with_shapes != 0);
    if (key == nullptr) {
      if (PyErr_Occurred()) return nullptr;
      Py_RETURN_NONE;
    }
    specs = PyDict_GetItemWithError(memo, key);  // borrowed
    Py_DECREF(key);
    if (specs == nullptr) {
      if (PyErr_Occurred()) return nullptr;
      Py_RETURN_NONE;
    }
    if (!PyTuple_Check(specs)) {
      PyErr_SetString(PyExc_TypeError, "run_tensors: remembered out_specs must be tuples");
      return nullptr;
    }
    Py_INCREF(specs);
    arrays.Add(specs);
  }
  const size_t nout = static_cast<size_t>(PyTuple_GET_SIZE(specs));
  CallArgs args(nin + nout);
  for (size_t i = 0; i < nin; ++i) {
    if (!args.Add(arrays[i], true, "input", static_cast<Py_ssize_t>(i))) return nullptr;
  }
  for (size_t i = 0; i < nout; ++i) {
    if (!args.AddOutput(PyTuple_GET_ITEM(specs, static_cast<Py_ssize_t>(i)), static_cast<Py_ssize_t>(i))) {
      return nullptr;
    }
  }
  if (!Invoke(reinterpret_cast<KernelFn>(fn_addr), extra, static_cast<int>(args.filled()), args.params(),
              args.ndims(), args.shapes(), args.dtypes(), nullptr)) {
    return nullptr;
  }
  if (nout == 1) return Wrap(type, args.owned(nin));
  PyObject *res = PyTuple_New(static_cast<Py_ssize_t>(nout));
  if (res == nullptr) return nullptr;
  for (size_t i = 0; i < nout; ++i) {
    PyObject *t = Wrap(type, args.owned(nin + i));
    if (t == nullptr) {
      Py_DECREF(res);
      return nullptr;
    }
    PyTuple_SET_ITEM(res, static_cast<Py_ssize_t>(i), t);
  }
  return res;
}

// The kernel call on memory the caller holds (device arrays): tuples of addresses, shapes (tuples of
// ints) and dtype names (str), one item per param, and the stream. No array is read or kept here.
PyObject *CallAt(PyObject *, PyObject *const *a, Py_ssize_t n) {
  static const char *const kUsage = "call_at(fn, extra, pointers, shapes, dtypes, stream)";
  void *fn = nullptr, *extra = nullptr, *stream = nullptr;
  if (n != 6) {
    PyErr_Format(PyExc_TypeError, "%s takes 6 arguments, got %zd", kUsage, n);
    return nullptr;
  }
  if (!AsAddress(a[0], &fn) || !AsAddress(a[1], &extra) || !AsAddress(a[5], &stream)) return nullptr;
  for (Py_ssize_t i = 2; i < 5; ++i) {
    if (!PyTuple_Check(a[i]) || PyTuple_GET_SIZE(a[i]) != PyTuple_GET_SIZE(a[2])) {
      PyErr_Format(PyExc_TypeError, "%s: pointers, shapes and dtypes must be tuples of one length", kUsage);
      return nullptr;
    }
  }
  const size_t count = static_cast<size_t>(PyTuple_GET_SIZE(a[2]));
  Slots<void *> params(count);
  Slots<int> ndims(count);
  Slots<int64_t *> shapes(count);
  Slots<const char *> dtypes(count);
  std::vector<std::vector<int64_t>> dims(count);
  for (size_t i = 0; i < count; ++i) {
    const Py_ssize_t k = static_cast<Py_ssize_t>(i);
    if (!AsAddress(PyTuple_GET_ITEM(a[2], k), &params[i])) return nullptr;
    PyObject *shape = PyTuple_GET_ITEM(a[3], k);
    if (!PyTuple_Check(shape)) {
      PyErr_Format(PyExc_TypeError, "%s: shape %zd must be a tuple", kUsage, k);
      return nullptr;
    }
    const Py_ssize_t nd = PyTuple_GET_SIZE(shape);
    dims[i].resize(static_cast<size_t>(nd > 0 ? nd : 1), 0);
    for (Py_ssize_t d = 0; d < nd; ++d) {
      dims[i][static_cast<size_t>(d)] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
      if (PyErr_Occurred()) return nullptr;
    }
    ndims[i] = static_cast<int>(nd);
    shapes[i] = dims[i].data();
    dtypes[i] = PyUnicode_AsUTF8(PyTuple_GET_ITEM(a[4], k));  // the tuple keeps the str alive
    if (dtypes[i] == nullptr) return nullptr;
  }
  if (!Invoke(reinterpret_cast<KernelFn>(fn), extra, static_cast<int>(count), params.data(), ndims.data(),
              shapes.data(), dtypes.data(), stream)) {
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject *Init(PyObject *, PyObject *const *a, Py_ssize_t n) {
  void *fn_addr = nullptr, *extra = nullptr;
  if (!ParseCall(a, n, 4, "init(fn, extra, inputs, out_specs)", &fn_addr, &extra)) return nullptr;
  CallArgs args(static_cast<size_t>(PyTuple_GET_SIZE(a[2]) + PyTuple_GET_SIZE(a[3])));
  if (!Gather(&args, a[2], a[3], nullptr)) return nullptr;
  InitFn fn = reinterpret_cast<InitFn>(fn_addr);
  int status = 0;
  Py_BEGIN_ALLOW_THREADS
  try {
    status = fn(args.ndims(), args.shapes(), args.dtypes(), static_cast<opbuilder::AotExtra *>(extra));
  } catch (...) {  // its text in the op's error buffer, which the caller reads (ExtraBlock.take_error)
    if (extra != nullptr) {
      Thrown(static_cast<opbuilder::aot::ExtraData *>(extra)->error);
    } else {
      status = -1;
    }
  }
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(status);
}

// Free what an Init kept with SetKernelData (called when the op goes away).
PyObject *Release(PyObject *, PyObject *arg) {
  void *extra = nullptr;
  if (!AsAddress(arg, &extra)) return nullptr;
  auto *data = static_cast<opbuilder::aot::ExtraData *>(extra);
  if (data != nullptr && data->kernel_data != nullptr && data->kernel_data_deleter != nullptr) {
    data->kernel_data_deleter(data->kernel_data);
    data->kernel_data = nullptr;
  }
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"run", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&Run)), METH_FASTCALL,
     "run(fn, extra, inputs, out_specs, scratch) -> outputs tuple; KernelFailed(status, error) on failure"},
    {"call_at", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&CallAt)), METH_FASTCALL,
     "call_at(fn, extra, pointers, shapes, dtypes, stream) -> None; KernelFailed(status, error)"},
    {"init", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&Init)), METH_FASTCALL,
     "init(fn, extra, inputs, out_specs) -> int status"},
    {"run_tensors", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&RunTensors)), METH_FASTCALL,
     "run_tensors(fn, extra, tensors, out_specs, Tensor, grad[, with_shapes]) -> Tensor(s), or None for the "
     "general path"},
    {"memo_key", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&MemoKeyOf)), METH_FASTCALL,
     "memo_key(signature, with_shapes) -> the bytes run_tensors looks remembered specs up by"},
    {"release", &Release, METH_O, "release(extra): delete the kernel data an Init kept"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, OB_STR(OB_EXTENSION_NAME), "aot operator call path", -1, kMethods,
                       nullptr, nullptr, nullptr, nullptr};

}  // namespace

extern "C" __attribute__((visibility("default"))) PyObject *OB_CAT(PyInit_, OB_EXTENSION_NAME)(void) {
  import_array();
  if (g_data == nullptr) g_data = PyUnicode_InternFromString("_data");
  if (g_requires_grad == nullptr) g_requires_grad = PyUnicode_InternFromString("requires_grad");
  if (g_empty == nullptr) g_empty = PyTuple_New(0);
  if (g_data == nullptr || g_requires_grad == nullptr || g_empty == nullptr) return nullptr;
  PyObject *m = PyModule_Create(&kModule);
  if (m == nullptr) return nullptr;
  if (g_kernel_failed == nullptr) {
    g_kernel_failed = PyErr_NewExceptionWithDoc(OB_STR(OB_EXTENSION_NAME) ".KernelFailed",
                                                "An aot kernel call failed: args are (status, error text).",
                                                nullptr, nullptr);
  }
  if (g_kernel_failed == nullptr) {
    Py_DECREF(m);
    return nullptr;
  }
  Py_INCREF(g_kernel_failed);
  if (PyModule_AddObject(m, "KernelFailed", g_kernel_failed) < 0) {  // steals the reference only on success
    Py_DECREF(g_kernel_failed);
    Py_DECREF(m);
    return nullptr;
  }
  if (PyModule_AddIntConstant(m, "ABI_VERSION", opbuilder::aot::kAbiVersion) < 0 ||
      PyModule_AddIntConstant(m, "EXTRA_SIZE", sizeof(opbuilder::aot::ExtraData)) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}

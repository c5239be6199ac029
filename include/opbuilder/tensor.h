// opbuilder::Tensor: an n-d array of one DataType over shared storage.
//
// A Tensor is either allocated here (64-byte aligned, freed when the last
// owner goes) or a view of a Python runtime.Tensor's numpy buffer (the Python
// owner is kept alive). Either way it crosses to Python and back without
// copying its data. Shape and strides are fixed at construction.
#pragma once

#include "opbuilder/detail/visibility.h"

#include <Python.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "opbuilder/detail/errors.h"
#include "opbuilder/detail/foreign_api.h"
#include "opbuilder/detail/pyref.h"
#include "opbuilder/dtype.h"

namespace opbuilder {

using ShapeVector = std::vector<std::int64_t>;
class Tensor;
using TensorPtr = std::shared_ptr<Tensor>;
using TensorPtrList = std::vector<TensorPtr>;

}  // namespace opbuilder

#include "opbuilder/detail/tensor_details.h"  // needs TensorPtr; Tensor needs it

namespace opbuilder {

class Tensor : public std::enable_shared_from_this<Tensor> {
 public:
  // A new tensor with uninitialised memory (as torch::empty); see zeros().
  // MemoryError (naming shape and dtype) when its size overflows or malloc fails.
  OB_CORE_FN Tensor(DataType dtype, ShapeVector shape);

  // A new tensor on `device` ("cpu", "cuda:N" / "GPU:N"); device memory comes from
  // the runtime's allocator (CuPy's pool) and is uninitialised.
  Tensor(DataType dtype, ShapeVector shape, const std::string &device)
      : Tensor(dtype, std::move(shape), detail::ParseDevice(device), false) {}

  // A view of memory kept alive by `storage`; `strides` in elements (empty: contiguous);
  // `writable` false for memory that must not be written (a read-only numpy array).
  // `device`: -1 for host memory, else the CUDA device `data` is on.
  Tensor(DataType dtype, ShapeVector shape, ShapeVector strides, void *data, std::shared_ptr<void> storage,
         bool writable = true, int device = -1)
      : storage_(std::move(storage)), data_(data), dtype_(dtype), shape_(std::move(shape)), writable_(writable),
        device_(device) {
    CheckDtype(dtype);
    numel_ = detail::CheckedNumel(shape_);
    if (!strides.empty()) {
      if (strides.size() != shape_.size()) {
        throw std::invalid_argument("opbuilder::Tensor: strides and shape differ in length");
      }
      if (!detail::IsContiguousLayout(shape_, strides)) strides_ = std::move(strides);
    }
  }

  // Copies share the storage but not the binding to a Python object. (Lent memory first becomes the
  // tensor's private copy: the copy may outlive the call that lent it.)
  Tensor(const Tensor &other) : Tensor(other, other.UnlentData()) {}
  Tensor &operator=(const Tensor &) = delete;

  static TensorPtr empty(DataType dtype, ShapeVector shape) {
    return std::make_shared<Tensor>(dtype, std::move(shape));
  }
  static TensorPtr zeros(DataType dtype, ShapeVector shape) {
    auto t = std::make_shared<Tensor>(dtype, std::move(shape));
    std::memset(t->data_, 0, t->nbytes());
    return t;
  }
  // On t's device (device memory from the runtime's pool, ordered on the current stream).
  OB_CORE_FN static TensorPtr empty_like(const TensorPtr &t);
  OB_CORE_FN static TensorPtr zeros_like(const TensorPtr &t);

  const ShapeVector &shape() const { return shape_; }
  std::int64_t shape(std::int64_t dim) const { return shape_[NormDim(dim)]; }
  ShapeVector strides() const { return strides_.empty() ? detail::ContiguousStrides(shape_) : strides_; }
  DataType dtype() const { return dtype_; }
  DataType data_type() const { return dtype_; }
  std::int64_t numel() const { return numel_; }
  std::int64_t ndim() const { return static_cast<std::int64_t>(shape_.size()); }
  std::size_t element_size() const { return ElementSize(dtype_); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel_) * ElementSize(dtype_); }
  bool is_contiguous() const { return strides_.empty(); }
  // False for a view of read-only memory (numpy writeable=False, a bytes
  // buffer, a read-only memory map): never write through data_ptr() then.
  // (Memory to_jax lends is read-only to a kConstArgs Function, writable elsewhere.)
  bool is_writable() const { return lent_.load(std::memory_order_acquire) == 0 ? writable_ : LentWritable(); }
  // "cpu", or "cuda:N" for a tensor in the memory of CUDA device N (then data_ptr() is a device pointer).
  std::string device() const { return device_ < 0 ? std::string("cpu") : "cuda:" + std::to_string(device_); }
  int device_index() const { return device_; }  // -1 on the host
  bool is_cuda() const { return device_ >= 0; }
  bool requires_grad() const { return requires_grad_; }

  // The first element's address, whatever the layout (index it with strides()). On memory to_jax lends,
  // outside a kConstArgs Function, the first call makes the tensor a private copy (it allocates).
  void *data_ptr() const { return lent_.load(std::memory_order_acquire) == 0 ? data_ : LentData(); }

  // Typed pointer to the data of a C-contiguous tensor, for flat loops over
  // numel() elements. TypeError if T is not the dtype; ValueError if the
  // tensor is a strided view (a flat loop would read the wrong elements).
  template <typename T>
  T *data() const {
    if (DataTypeOf<T>::value != dtype_) ThrowDtypeMismatch(DataTypeOf<T>::value);
    CheckContiguous("data<T>()");
    return static_cast<T *>(data_ptr());
  }

  // This tensor if already C-contiguous, else a contiguous copy.
  TensorPtr contiguous() const {
    if (is_contiguous()) return std::const_pointer_cast<Tensor>(shared_from_this());
    return contiguous_copy();
  }

  // A new C-contiguous, writable copy (always copies).
  OB_CORE_FN TensorPtr contiguous_copy() const;

  // Writes `src` (same dtype and shape, any layout) into this tensor's memory.
  OB_CORE_FN void copy_from(const Tensor &src);

  // ---- MindSpore-compatible names (see ms_extension.h) ----
  // as data<T>(): the data of a C-contiguous tensor (ValueError for a strided view)
  void *data_c() const {
    CheckContiguous("data_c()");
    return data_ptr();
  }
  std::int64_t DataSize() const { return numel_; }
  std::size_t Size() const { return nbytes(); }

  // ---- read by the Python bridge ----
  const std::shared_ptr<void> &storage() const {
    if (lent_.load(std::memory_order_acquire) != 0) (void)LentData();  // a private copy, where data_ptr() takes one
    return storage_;
  }
  PyObject *py_object() const { return py_.get(); }  // the runtime.Tensor this tensor is, if any

 private:
  friend struct detail::TensorAccess;
  static void CheckDtype(DataType t) {
    if (static_cast<int>(t) < 0 || t >= kTypeUnknown) {
      throw std::invalid_argument("opbuilder::Tensor: unknown DataType " + std::to_string(static_cast<int>(t)));
    }
  }
  // Device allocation: storage from the runtime's allocator.
  OB_CORE_FN Tensor(DataType dtype, ShapeVector shape, int device, bool zero);
  // Lent memory made this tensor's private copy (whoever runs this); the address.
  void *UnlentData() const {
    if (lent_.load(std::memory_order_acquire) != 0) {
      detail::LentScope untrusted(false);
      return LentData();
    }
    return data_;
  }
  // The copy constructor's work, `data` being other's address once it is not lent.
  Tensor(const Tensor &other, void *data)
      : std::enable_shared_from_this<Tensor>(),
        storage_(other.storage_), data_(data), dtype_(other.dtype_), shape_(other.shape_),
        strides_(other.strides_), numel_(other.numel_), writable_(other.writable_), device_(other.device_),
        requires_grad_(other.requires_grad_) {}
  // Lent memory (detail/tensor_details.h LentScope): the address, after taking a private copy when this
  // thread does not run code trusted with it; whether it may be written, as this thread sees it.
  OB_CORE_FN void *LentData() const;
  OB_CORE_FN bool LentWritable() const;
  // The address for reading (never takes a copy; LentData may swap it on another thread).
  const void *ReadPtr() const { return __atomic_load_n(&data_, __ATOMIC_ACQUIRE); }
  void CheckHost(const char *what) const {
    if (device_ >= 0) ThrowNotHost(what);
  }
  void CheckContiguous(const char *what) const {
    if (!is_contiguous()) ThrowNotContiguous(what);
  }
  // The errors of the checks above, compiled once (the core library).
  [[noreturn]] OB_CORE_FN void ThrowDtypeMismatch(DataType want) const;
  [[noreturn]] OB_CORE_FN void ThrowNotHost(const char *what) const;
  [[noreturn]] OB_CORE_FN void ThrowNotContiguous(const char *what) const;
  [[noreturn]] OB_CORE_FN void ThrowDimOutOfRange(std::int64_t dim) const;
  std::size_t NormDim(std::int64_t d) const {  // an index into shape_; out of range: IndexError, as torch's
    if (d < -ndim() || d >= ndim()) ThrowDimOutOfRange(d);
    return static_cast<std::size_t>(d < 0 ? d + ndim() : d);
  }

  std::shared_ptr<void> storage_;
  void *data_ = nullptr;
  DataType dtype_;
  ShapeVector shape_;
  ShapeVector strides_;  // empty when contiguous
  std::int64_t numel_ = 0;
  bool writable_ = true;
  int device_ = -1;  // -1: host memory; else the CUDA device
  bool requires_grad_ = false;
  // 1: memory lent by an XLA FFI handler to a module function (JAX's immutable input buffer), read in
  // place by code trusted with it and copied to a private buffer on any other access (then 0); 2 while
  // that copy is made.
  mutable std::atomic<std::uint8_t> lent_{0};
  detail::PyRef py_;  // the runtime.Tensor this tensor is, if any
};


namespace detail OB_HIDDEN {
// A Tensor made by the core (a view of an argument, an alias), from the per-thread block lists (PoolTake).
template <typename... A>
TensorPtr NewTensor(A &&...args) {
  return std::allocate_shared<Tensor>(PoolAllocator<Tensor>(), std::forward<A>(args)...);
}

// What only the bridge and Function<T> change on a Tensor.
struct TensorAccess {
  static void BindPython(Tensor &t, PyRef obj) { t.py_ = std::move(obj); }
  static void SetRequiresGrad(Tensor &t, bool r) { t.requires_grad_ = r; }
  static ShapeVector &Shape(Tensor &t) { return t.shape_; }
  // Marks `t` (read-only, contiguous, host memory the caller does not own) as lent (LentScope).
  static void Lend(Tensor &t) { t.lent_.store(1, std::memory_order_release); }
  static bool IsLent(const Tensor &t) { return t.lent_.load(std::memory_order_acquire) != 0; }
  // The address for reading only: never a copy, and no question of trust (the handlers' own reads).
  static const void *Read(const Tensor &t) { return t.ReadPtr(); }
  // Makes a lent `t` its private copy, whoever runs this (as an access from untrusted code does).
  static void Unlend(const Tensor &t) { (void)t.UnlentData(); }
  // One storage under both (a view made on the other's storage()): its owner, not its address.
  static bool SameStorage(const Tensor &a, const Tensor &b) {
    return a.storage_ && !a.storage_.owner_before(b.storage_) && !b.storage_.owner_before(a.storage_);
  }
};
}  // namespace detail

}  // namespace opbuilder

#if !OB_CORE_SHARED  // no core library: its bodies compile here, inline (detail/core_lib.h)
#if __has_include("../../src/core/tensor.cpp")
#include "../../src/core/tensor.cpp"
#else  // a copy of these headers (vendored): the installed ones' sources, found from the include path
#include "../src/core/tensor.cpp"
#endif
#endif

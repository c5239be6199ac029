// The core library's bodies of the functions opbuilder/tensor.h declares with OB_CORE_FN.
// Compiled once into libobcore (core_lib.cpp), or, in a build without the core library,
// inline in each operator: opbuilder/tensor.h includes this file at its end (detail/core_lib.h).
#include "opbuilder/tensor.h"
#include "opbuilder/detail/native_fn.h"

#include <pthread.h>
#include <sched.h>

namespace opbuilder {

namespace detail OB_HIDDEN {

OB_CORE_FN std::string ShapeString(const ShapeVector &shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

OB_CORE_FN void CopyStrided(char *dst, const ShapeVector &dst_strides, const char *src, const ShapeVector &src_strides,
                        const ShapeVector &shape, std::size_t esize) {
  if (CheckedNumel(shape) == 0) return;
  const std::size_t nd = shape.size();
  if (nd == 0) {
    std::memcpy(dst, src, esize);
    return;
  }
  const auto es = static_cast<std::int64_t>(esize);
  const std::int64_t rows = CheckedNumel(shape) / shape[nd - 1];
  const std::int64_t n = shape[nd - 1], ds = dst_strides[nd - 1], ss = src_strides[nd - 1];
  std::vector<std::int64_t> idx(nd, 0);
  std::int64_t doff = 0, soff = 0;  // in elements
  for (std::int64_t r = 0; r < rows; ++r) {
    char *d = dst + doff * es;
    const char *s = src + soff * es;
    switch (esize) {
      case 1: CopyRow<std::uint8_t>(d, ds, s, ss, n); break;
      case 2: CopyRow<std::uint16_t>(d, ds, s, ss, n); break;
      case 4: CopyRow<std::uint32_t>(d, ds, s, ss, n); break;
      case 8: CopyRow<std::uint64_t>(d, ds, s, ss, n); break;
      default: CopyRow<Element16>(d, ds, s, ss, n); break;  // complex128: 16 bytes, not 8
    }
    for (std::size_t k = nd - 1; k-- > 0;) {  // the next row: odometer over the outer dimensions
      if (++idx[k] < shape[k]) {
        doff += dst_strides[k];
        soff += src_strides[k];
        break;
      }
      doff -= dst_strides[k] * (shape[k] - 1);
      soff -= src_strides[k] * (shape[k] - 1);
      idx[k] = 0;
    }
  }
}

#if OB_CORE_SHARED
namespace {
constexpr std::size_t kPoolClasses = 4;      // blocks of 64, 128, 192 and 256 bytes
constexpr std::uint32_t kPoolKeep = 64;      // kept per class and thread
// A thread's kept blocks and shape buffers. `state`: 1 keeping (the reaper is set), 2 the thread is ending
// (pool_ended: its blocks freed; later ones go back to free()).
constexpr std::uint32_t kShapeKeep = 16;     // shape buffers kept per thread (RecycleTensor)
constexpr std::size_t kShapeMaxRank = 8;      // ... of at most this many dimensions
struct PoolLists {
  void *head[kPoolClasses];
  std::uint32_t count[kPoolClasses];
  std::uint32_t state;
  std::uint32_t nshapes;
  alignas(ShapeVector) unsigned char shapes[kShapeKeep][sizeof(ShapeVector)];  // live vectors: [0, nshapes)
};
PoolLists pool_ended = {{}, {}, 2, 0, {}};  // an ended thread's: nothing kept, blocks go back to free()
// The thread's lists: zero-initialised and trivially destructible (TLS, freed with the thread).
thread_local PoolLists pool_storage;
// &pool_storage once the thread keeps its first block (PoolStart), else null. A pointer of initial-exec TLS:
// 8 bytes of the static TLS surplus, read with one instruction; in the default model of a shared library
// each read calls __tls_get_addr (~15 instructions), about 17 times per op call.
thread_local PoolLists *pool_lists __attribute__((tls_model("initial-exec"))) = nullptr;
// Frees the thread's kept blocks as it ends: the destructor of a pthread key, which runs after the thread's
// thread_local destructors and again for a key set while such destructors run (a thread that first keeps a
// block in another key's destructor frees it too; a thread_local reaper made then never ran). Later blocks
// go back to free() (pool_ended).
void PoolReap(void *lists) {
  auto *l = static_cast<PoolLists *>(lists);
  pool_lists = &pool_ended;
  for (std::size_t c = 0; c < kPoolClasses; ++c) {
    while (void *p = l->head[c]) {
      l->head[c] = *static_cast<void **>(p);
      std::free(p);
    }
  }
  while (l->nshapes > 0) {
    --l->nshapes;
    std::launder(reinterpret_cast<ShapeVector *>(l->shapes[l->nshapes]))->~ShapeVector();
  }
}

// The thread's lists, for its first kept block, with PoolReap set to free them when the thread ends;
// pool_ended (nothing kept) if no pthread key can be had.
[[gnu::noinline]] PoolLists *PoolStart() {
  static pthread_key_t key;
  static const bool have_key = pthread_key_create(&key, &PoolReap) == 0;
  PoolLists *l = &pool_storage;
  if (have_key && pthread_setspecific(key, l) == 0) {
    l->state = 1;
  } else {
    l = &pool_ended;
  }
  pool_lists = l;
  return l;
}
}  // namespace

OB_CORE_FN void *PoolTake(std::size_t nbytes) {
  const std::size_t c = nbytes == 0 ? 0 : (nbytes - 1) / 64;
  if (c < kPoolClasses) {
    if (PoolLists *l = pool_lists) {
      if (void *p = l->head[c]) {
        l->head[c] = *static_cast<void **>(p);
        --l->count[c];
        return p;
      }
    }
    nbytes = (c + 1) * 64;  // the class's size: any block of the class serves any request of it
  }
  void *p = std::malloc(nbytes);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}


OB_CORE_FN void PoolGive(void *p, std::size_t nbytes) noexcept {
  const std::size_t c = nbytes == 0 ? 0 : (nbytes - 1) / 64;
  PoolLists *l = pool_lists;
  if (c < kPoolClasses && (l != nullptr || (l = PoolStart()) != nullptr) && l->state == 1 && l->count[c] < kPoolKeep) {
    *static_cast<void **>(p) = l->head[c];
    l->head[c] = p;
    ++l->count[c];
    return;
  }
  std::free(p);
}

OB_CORE_FN void RecycleTensor(Tensor *t) noexcept {
  ShapeVector &shape = TensorAccess::Shape(*t);
  PoolLists *l = pool_lists;
  if (shape.capacity() != 0 && shape.capacity() <= kShapeMaxRank && (l != nullptr || (l = PoolStart()) != nullptr) &&
      l->state == 1 && l->nshapes < kShapeKeep) {
    new (l->shapes[l->nshapes]) ShapeVector(std::move(shape));
    ++l->nshapes;
  }
  t->~Tensor();
}

OB_CORE_FN ShapeVector TakeShape() noexcept {
  PoolLists *l = pool_lists;
  if (l == nullptr || l->nshapes == 0) return ShapeVector();
  --l->nshapes;
  ShapeVector *kept = std::launder(reinterpret_cast<ShapeVector *>(l->shapes[l->nshapes]));
  ShapeVector out(std::move(*kept));
  kept->~ShapeVector();
  out.clear();
  return out;
}
#else
OB_CORE_FN void *PoolTake(std::size_t nbytes) {
  void *p = std::malloc(nbytes == 0 ? 1 : nbytes);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

OB_CORE_FN void PoolGive(void *p, std::size_t) noexcept { std::free(p); }

OB_CORE_FN void RecycleTensor(Tensor *t) noexcept { t->~Tensor(); }

OB_CORE_FN ShapeVector TakeShape() noexcept { return ShapeVector(); }
#endif

OB_CORE_FN OfferedBuffers &Offered() {
  static thread_local OfferedBuffers offered;
  return offered;
}

OB_CORE_FN bool &TrustsLent() noexcept {
  static thread_local bool trusted = false;
  return trusted;
}

OB_CORE_FN std::shared_ptr<void> AllocateStorage(std::size_t nbytes) {
  if (nbytes > std::numeric_limits<std::size_t>::max() - 64) throw std::bad_alloc();
  constexpr std::size_t kOneBlockBelow = std::size_t{4} << 20;  // the huge-page threshold below
  if (nbytes < kOneBlockBelow) {
    void *data = nullptr;
    const std::shared_ptr<StorageBlock> block =
        std::allocate_shared<StorageBlock>(StorageBlockAllocator<StorageBlock>(nbytes + 64, &data));
    return std::shared_ptr<void>(block, data);
  }
  void *base = std::malloc(nbytes + 64);
  if (base == nullptr) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr std::size_t kHugeFrom = std::size_t{4} << 20;
  if (nbytes >= kHugeFrom) {
    const std::uintptr_t b = reinterpret_cast<std::uintptr_t>(base);
    const std::uintptr_t page = (b + 4095) & ~std::uintptr_t{4095};
    (void)madvise(reinterpret_cast<void *>(page), nbytes + 64 - (page - b), MADV_HUGEPAGE);  // a hint only
  }
#endif
  auto *p = reinterpret_cast<void *>((reinterpret_cast<std::uintptr_t>(base) + 63) & ~std::uintptr_t{63});
  return std::shared_ptr<void>(p, [base](void *) { std::free(base); });
}

OB_CORE_FN int ParseDevice(const std::string &device) {
  std::string d;
  for (char c : device) d += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  if (d == "cpu") return -1;
  for (const char *kind : {"cuda", "gpu"}) {
    const std::string k(kind);
    if (d == k) return 0;
    if (d.size() > k.size() + 1 && d.compare(0, k.size() + 1, k + ":") == 0 &&
        d.find_first_not_of("0123456789", k.size() + 1) == std::string::npos && d.size() - k.size() - 1 <= 6) {
      return std::stoi(d.substr(k.size() + 1));
    }
  }
  throw ValueError("opbuilder::Tensor: device '" + device +
                   "' is not a device name; accepted: 'cpu', 'cuda', 'cuda:N', 'GPU', 'GPU:N'");
}

OB_CORE_FN std::shared_ptr<void> AllocateDeviceStorage(std::size_t nbytes, int device, bool zero) {
  GilForRefcount gil;
  if (const ForeignApi *api = ActiveForeign()) {
    void *handle = nullptr;
    void *p = api->allocate(static_cast<std::int64_t>(nbytes), device, zero ? 1 : 0, &handle);
    if (handle == nullptr) throw PythonError();
    return std::shared_ptr<void>(p, ForeignOwner{api, handle});
  }
  static std::atomic<PyObject *> allocate{nullptr};
  PyRef r = PyRef::Steal(Check(PyObject_CallFunction(NativeFn(allocate, "allocate"), "nii",
                                                      static_cast<Py_ssize_t>(nbytes), device, zero ? 1 : 0)));
  if (!PyTuple_Check(r.get()) || PyTuple_GET_SIZE(r.get()) != 2) {
    throw TypeError("opbuilder: runtime.device_memory.allocate returned something other than a 2-tuple");
  }
  void *p = PyLong_AsVoidPtr(PyTuple_GET_ITEM(r.get(), 1));
  if (PyErr_Occurred()) throw PythonError();
  PyObject *block = PyTuple_GET_ITEM(r.get(), 0);
  Py_INCREF(block);
  return std::shared_ptr<void>(p, PyOwnerDeleter{block});
}

OB_CORE_FN void *CurrentDeviceStream() {
  GilForRefcount gil;
  if (const ForeignApi *api = ActiveForeign()) {
    void *s = api->stream(-1);
    if (s == nullptr && PyErr_Occurred()) throw PythonError();
    return s;
  }
  static std::atomic<PyObject *> current{nullptr};
  PyRef ptr = PyRef::Steal(Check(PyObject_CallNoArgs(NativeFn(current, "current_stream_ptr"))));
  void *p = PyLong_AsVoidPtr(ptr.get());
  if (PyErr_Occurred()) throw PythonError();
  return p;
}

}  // namespace detail

OB_CORE_FN void Tensor::ThrowDtypeMismatch(DataType want) const {
  throw detail::TypeError(std::string("opbuilder::Tensor::data<T>(): tensor has dtype ") + DataTypeName(dtype_) +
                          ", but T is " + DataTypeName(want));
}
OB_CORE_FN void Tensor::ThrowDimOutOfRange(std::int64_t dim) const {
  throw std::out_of_range("opbuilder::Tensor::shape(" + std::to_string(dim) + "): dimension out of range for a " +
                          std::to_string(ndim()) + "-d tensor (expected " +
                          (ndim() == 0 ? std::string("none") : std::to_string(-ndim()) + " to " +
                                                                   std::to_string(ndim() - 1)) + ")");
}

OB_CORE_FN void Tensor::ThrowNotHost(const char *what) const {
  throw detail::ValueError(std::string("opbuilder::Tensor::") + what + " runs on host memory, and this tensor is on " +
                           device() + "; do it in your CUDA code (the runtime hands Function ops contiguous "
                           "device tensors)");
}
OB_CORE_FN void Tensor::ThrowNotContiguous(const char *what) const {
  throw detail::ValueError(std::string("opbuilder::Tensor::") + what + ": the tensor is not contiguous (shape " +
                           detail::ShapeString(shape_) + ", strides " + detail::ShapeString(strides_) +
                           "); call contiguous() first, or index data_ptr() with strides()");
}
OB_CORE_FN void *Tensor::LentData() const {
  for (;;) {
    std::uint8_t state = lent_.load(std::memory_order_acquire);
    if (state == 0 || detail::TrustsLent()) return __atomic_load_n(&data_, __ATOMIC_ACQUIRE);
    if (state == 1 && lent_.compare_exchange_strong(state, 2, std::memory_order_acq_rel)) {
      // this thread copies the lent memory; others wait for it (state 2), then read the copy
      auto *self = const_cast<Tensor *>(this);  // every Tensor is made non-const (make_shared)
      std::shared_ptr<void> copy;
      try {
        copy = detail::AllocateStorage(nbytes());
      } catch (const std::bad_alloc &) {
        lent_.store(1, std::memory_order_release);
        throw detail::AllocationError("opbuilder::Tensor: out of memory making a private copy (" +
                                      std::to_string(nbytes()) + " bytes) of memory to_jax lent");
      }
      const void *from = __atomic_load_n(&data_, __ATOMIC_ACQUIRE);
      if (nbytes() != 0) std::memcpy(copy.get(), from, nbytes());  // a lent tensor is contiguous
      self->storage_ = copy;
      self->writable_ = true;
      __atomic_store_n(&self->data_, copy.get(), __ATOMIC_RELEASE);
      lent_.store(0, std::memory_order_release);
      return copy.get();
    }
    sched_yield();
  }
}
OB_CORE_FN bool Tensor::LentWritable() const {
  if (detail::TrustsLent()) return false;
  return lent_.load(std::memory_order_acquire) == 0 ? writable_ : true;  // a private copy once asked for
}
OB_CORE_FN Tensor::Tensor(DataType dtype, ShapeVector shape)
    : dtype_(dtype), shape_(std::move(shape)) {
  CheckDtype(dtype);
  numel_ = detail::CheckedNumel(shape_);
  const std::size_t nbytes = detail::CheckedNbytes(shape_, numel_, dtype);
  if (detail::Offered().n != 0) {
    if (void *p = detail::TakeOffered(nbytes)) {  // XLA's result buffer (xla_ffi.h), owned by XLA
      storage_ = std::shared_ptr<void>(p, [](void *) {});
      data_ = p;
      return;
    }
  }
  try {
    storage_ = detail::AllocateStorage(nbytes);
  } catch (const std::bad_alloc &) {
    throw detail::AllocationError("opbuilder::Tensor: out of memory allocating " + std::to_string(nbytes) +
                                  " bytes for a tensor of shape " + detail::ShapeString(shape_) + " and dtype " +
                                  DataTypeName(dtype));
  }
  data_ = storage_.get();
}
OB_CORE_FN Tensor::Tensor(DataType dtype, ShapeVector shape, int device, bool zero)
    : dtype_(dtype), shape_(std::move(shape)), device_(device) {
  CheckDtype(dtype);
  numel_ = detail::CheckedNumel(shape_);
  const std::size_t nbytes = detail::CheckedNbytes(shape_, numel_, dtype);
  if (device < 0) {
    storage_ = detail::AllocateStorage(nbytes);
    if (zero) std::memset(storage_.get(), 0, nbytes);
  } else {
    storage_ = detail::AllocateDeviceStorage(nbytes, device, zero);
  }
  data_ = storage_.get();
}
OB_CORE_FN TensorPtr Tensor::contiguous_copy() const {
  CheckHost("contiguous_copy()");
  auto out = std::make_shared<Tensor>(dtype_, shape_);
  detail::CopyStrided(static_cast<char *>(out->data_), detail::ContiguousStrides(shape_),
                      static_cast<const char *>(ReadPtr()), strides(), shape_, element_size());
  return out;
}
OB_CORE_FN void Tensor::copy_from(const Tensor &src) {
  if (src.dtype_ != dtype_ || src.shape_ != shape_) {
    throw std::invalid_argument("opbuilder::Tensor::copy_from: dtype or shape differs");
  }
  if (!is_writable()) throw detail::ValueError("opbuilder::Tensor::copy_from: the tensor is read-only");
  CheckHost("copy_from()");
  src.CheckHost("copy_from()");
  detail::CopyStrided(static_cast<char *>(data_ptr()), strides(), static_cast<const char *>(src.ReadPtr()),
                      src.strides(), shape_, element_size());
}
OB_CORE_FN TensorPtr Tensor::empty_like(const TensorPtr &t) {
  if (t->device_ >= 0) return std::shared_ptr<Tensor>(new Tensor(t->dtype(), t->shape(), t->device_, false));
  return empty(t->dtype(), t->shape());
}
OB_CORE_FN TensorPtr Tensor::zeros_like(const TensorPtr &t) {
  if (t->device_ >= 0) return std::shared_ptr<Tensor>(new Tensor(t->dtype(), t->shape(), t->device_, true));
  return zeros(t->dtype(), t->shape());
}

}  // namespace opbuilder

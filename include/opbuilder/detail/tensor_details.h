// The details of opbuilder::Tensor (tensor.h): checked sizes, layouts, storage (aligned host memory,
// device memory from the runtime's allocator, buffers offered by an XLA FFI handler) and strided
// copies. Not for operator authors. Included by tensor.h only, after TensorPtr.
#pragma once

#include "opbuilder/detail/visibility.h"

#include <Python.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
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

namespace detail OB_HIDDEN {

OB_CORE_FN std::string ShapeString(const ShapeVector &shape);

inline std::int64_t CheckedNumel(const ShapeVector &shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("opbuilder::Tensor: negative dimension in shape");
    if (d != 0 && n > std::numeric_limits<std::int64_t>::max() / d) {
      throw std::length_error("opbuilder::Tensor: shape " + ShapeString(shape) + " has too many elements");
    }
    n *= d;
  }
  return n;
}

// std::bad_alloc with a message (both binding layers raise it as MemoryError with this text).
class AllocationError : public std::bad_alloc {
 public:
  explicit AllocationError(std::string msg) : msg_(std::move(msg)) {}
  const char *what() const noexcept override { return msg_.c_str(); }

 private:
  std::string msg_;
};

// Bytes for `numel` elements of `dtype` in `shape`; MemoryError if that overflows.
inline std::size_t CheckedNbytes(const ShapeVector &shape, std::int64_t numel, DataType dtype) {
  const std::size_t es = ElementSize(dtype);
  const auto n = static_cast<std::uint64_t>(numel);
  if (n > (std::numeric_limits<std::size_t>::max() - 64) / es) {
    throw AllocationError("opbuilder::Tensor: cannot allocate a tensor of shape " + ShapeString(shape) + " and dtype " +
                          DataTypeName(dtype) + ": its size in bytes overflows");
  }
  return static_cast<std::size_t>(n) * es;
}

inline ShapeVector ContiguousStrides(const ShapeVector &shape) {
  ShapeVector s(shape.size());
  std::int64_t acc = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    acc *= shape[i] > 0 ? shape[i] : 1;
  }
  return s;
}

// True when `strides` (in elements) describe a C-contiguous layout of `shape`.
inline bool IsContiguousLayout(const ShapeVector &shape, const ShapeVector &strides) {
  std::int64_t expected = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 0) return true;
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

// Small blocks (a Tensor, a reference count, a small tensor's memory) that a thread frees are kept for
// its next allocations of that size class: a one-element call allocates a few of them, and malloc with
// free costs ~150 instructions per block against ~20 here. The lists are the core library's, per
// thread, a bounded number per class, freed when the thread ends; a block freed on another thread joins
// that thread's list. Builds without the core library (inline: pybind11 operators, sanitizer builds)
// use malloc and free, so a sanitizer sees every block.
OB_CORE_FN void *PoolTake(std::size_t nbytes);
OB_CORE_FN void PoolGive(void *p, std::size_t nbytes) noexcept;
// Likewise the shape vectors of the Tensors made from those blocks: RecycleTensor destroys `t` and keeps
// its shape's buffer (a few per thread); TakeShape hands out an empty vector with one such buffer if
// kept, else an empty vector. A Tensor over an argument then allocates nothing for its shape.
OB_CORE_FN void RecycleTensor(Tensor *t) noexcept;
OB_CORE_FN ShapeVector TakeShape() noexcept;

template <typename T>
struct PoolAllocator {
  using value_type = T;
  PoolAllocator() = default;
  template <typename U>
  PoolAllocator(const PoolAllocator<U> &) {}
  T *allocate(std::size_t n) { return static_cast<T *>(PoolTake(n * sizeof(T))); }
  void deallocate(T *p, std::size_t n) noexcept { PoolGive(p, n * sizeof(T)); }
  // A Tensor's shape buffer outlives it, for the next Tensor made here (RecycleTensor, TakeShape).
  template <typename U>
  void destroy(U *p) noexcept {
    if constexpr (std::is_same_v<U, Tensor>) {
      RecycleTensor(p);
    } else {
      p->~U();
    }
  }
  template <typename U>
  bool operator==(const PoolAllocator<U> &) const { return true; }
  template <typename U>
  bool operator!=(const PoolAllocator<U> &) const { return false; }
};

// 64-byte aligned storage. malloc with the alignment done here rather than
// aligned_alloc: glibc hands a freed block back for the next request of the
// same size, but aligned_alloc asks for more than that block (its alignment
// slack), so repeated large calls grew the heap and touched fresh pages.
//
// Large blocks are offered transparent huge pages, as numpy does for its arrays:
// a fresh 200 MB output otherwise takes ~50,000 page faults on first touch, which
// made a 50M-element Function ~1.7x slower than the same work in numpy.
//
// Smaller blocks share one allocation with their reference count (as make_shared does): one allocation
// per tensor's memory, not two. The count's allocator asks for `extra` bytes more than the count
// needs and puts the first 64-byte aligned address after it in `*data`.
template <typename T>
struct StorageBlockAllocator {
  using value_type = T;
  std::size_t extra;
  void **data;  // written once, by the one allocate() call
  StorageBlockAllocator(std::size_t e, void **d) : extra(e), data(d) {}
  template <typename U>
  StorageBlockAllocator(const StorageBlockAllocator<U> &o) : extra(o.extra), data(o.data) {}
  T *allocate(std::size_t n) {
    void *base = PoolTake(n * sizeof(T) + extra);
    const std::uintptr_t end = reinterpret_cast<std::uintptr_t>(base) + n * sizeof(T);
    *data = reinterpret_cast<void *>((end + 63) & ~std::uintptr_t{63});
    return static_cast<T *>(base);
  }
  void deallocate(T *p, std::size_t n) noexcept { PoolGive(p, n * sizeof(T) + extra); }
  template <typename U>
  bool operator==(const StorageBlockAllocator<U> &) const { return true; }
  template <typename U>
  bool operator!=(const StorageBlockAllocator<U> &) const { return false; }
};
struct StorageBlock {};

OB_CORE_FN std::shared_ptr<void> AllocateStorage(std::size_t nbytes);

// A 16-byte element (complex128), copied as its bytes.
struct Element16 {
  unsigned char bytes[16];
};

// One row of n elements of E; fixed-size memcpy (a plain load and store once
// compiled) keeps the copy free of type punning.
template <typename E>
inline void CopyRow(char *dst, std::int64_t dst_step, const char *src, std::int64_t src_step, std::int64_t n) {
  if (dst_step == 1 && src_step == 1) {
    std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(E));
    return;
  }
  const auto de = dst_step * static_cast<std::int64_t>(sizeof(E));
  const auto se = src_step * static_cast<std::int64_t>(sizeof(E));
  for (std::int64_t i = 0; i < n; ++i) std::memcpy(dst + i * de, src + i * se, sizeof(E));
}

// Copies `shape` elements of `esize` bytes between two strided layouts
// (strides in elements; the destination's must not overlap itself).
OB_CORE_FN void CopyStrided(char *dst, const ShapeVector &dst_strides, const char *src, const ShapeVector &src_strides,
                        const ShapeVector &shape, std::size_t esize);

// Host memory that a new Tensor of exactly its size on this thread takes instead of malloc, each
// block once: opbuilder/xla_ffi.h offers XLA's result buffers while Forward runs, so an output is
// built in XLA's memory and needs no copy. Nothing is offered outside such a call (n == 0).
struct OfferedBuffers {
  void *const *data = nullptr;
  const std::size_t *nbytes = nullptr;
  bool *taken = nullptr;
  std::size_t n = 0;
};
// One per thread in the process: in the core library when the operator uses it (xla_ffi.h offers in the
// operator, the Tensor constructor takes in the core library).
OB_CORE_FN OfferedBuffers &Offered();

inline void *TakeOffered(std::size_t nbytes) {
  OfferedBuffers &o = Offered();
  for (std::size_t i = 0; i < o.n; ++i) {
    if (!o.taken[i] && o.nbytes[i] == nbytes) {
      o.taken[i] = true;
      return o.data[i];
    }
  }
  return nullptr;
}

// Lent memory. to_jax's handlers lend a module function JAX's input buffers (immutable) rather than
// copy them (Tensor's lent_). Code trusted with lent memory reads it in place and sees it read-only:
// the handler itself, Function<T>'s Apply, and the Forward and Backward of a kConstArgs type (any other
// type gets a lent argument as its private copy before Forward: function_details.h NeedsCopy). Any other
// code that asks a lent tensor for its address (the function's own body, a thread it starts) gets a
// private writable copy first, which the tensor is from then on: a write never reaches JAX's memory,
// and a body that touches no data copies nothing. Per thread; not trusted unless a LentScope says so.
OB_CORE_FN bool &TrustsLent() noexcept;
class LentScope {
 public:
  explicit LentScope(bool trusted) noexcept : saved_(TrustsLent()) { TrustsLent() = trusted; }
  ~LentScope() { TrustsLent() = saved_; }
  LentScope(const LentScope &) = delete;
  LentScope &operator=(const LentScope &) = delete;

 private:
  bool saved_;
};

// "cpu" -> -1; "cuda", "cuda:N", "GPU", "GPU:N" (any case) -> the CUDA device index.
OB_CORE_FN int ParseDevice(const std::string &device);

// Device memory from the runtime's allocator (CuPy's pool, ordered on the current
// stream): the Python owner of the block goes into the storage's deleter.
// Inside a framework bridge's call (to_torch), the framework's allocator and stream instead.
OB_CORE_FN std::shared_ptr<void> AllocateDeviceStorage(std::size_t nbytes, int device, bool zero);

// The stream a GPU op launches on now (a cudaStream_t): the runtime's current one, or the framework's
// inside a bridge's call. opbuilder::cuda::CurrentStream() (cuda.h) returns it.
OB_CORE_FN void *CurrentDeviceStream();

struct TensorAccess;

}  // namespace detail

}  // namespace opbuilder

// opbuilder::Tensor: an n-d array of one DataType over shared storage.
//
// A Tensor is either allocated here (64-byte aligned, freed when the last
// owner goes) or a view of a Python runtime.Tensor's numpy buffer (the Python
// owner is kept alive). Either way it crosses to Python and back without
// copying its data. Shape and strides are fixed at construction.
#pragma once

#include "opbuilder/detail/visibility.h"

#include <pybind11/pybind11.h>

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

#include "opbuilder/detail/pyref.h"
#include "opbuilder/dtype.h"

namespace opbuilder {

using ShapeVector = std::vector<std::int64_t>;
class Tensor;
using TensorPtr = std::shared_ptr<Tensor>;
using TensorPtrList = std::vector<TensorPtr>;

namespace detail OB_HIDDEN {

inline std::int64_t CheckedNumel(const ShapeVector &shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("opbuilder::Tensor: negative dimension in shape");
    if (d != 0 && n > std::numeric_limits<std::int64_t>::max() / d) {
      throw std::length_error("opbuilder::Tensor: shape has too many elements");
    }
    n *= d;
  }
  return n;
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

// 64-byte aligned storage. malloc with the alignment done here rather than
// aligned_alloc: glibc hands a freed block back for the next request of the
// same size, but aligned_alloc asks for more than that block (its alignment
// slack), so repeated large calls grew the heap and touched fresh pages.
inline std::shared_ptr<void> AllocateStorage(std::size_t nbytes) {
  if (nbytes > std::numeric_limits<std::size_t>::max() - 64) throw std::bad_alloc();
  void *base = std::malloc(nbytes + 64);
  if (base == nullptr) throw std::bad_alloc();
  auto *p = reinterpret_cast<void *>((reinterpret_cast<std::uintptr_t>(base) + 63) & ~std::uintptr_t{63});
  return std::shared_ptr<void>(p, [base](void *) { std::free(base); });
}

// Copies a strided array of `esize`-byte elements into contiguous `dst`.
inline void CopyToContiguous(char *dst, const char *src, const ShapeVector &shape,
                             const ShapeVector &strides, std::size_t esize) {
  const std::size_t nd = shape.size();
  std::int64_t total = CheckedNumel(shape);
  if (total == 0) return;
  std::vector<std::int64_t> idx(nd, 0);
  std::int64_t offset = 0;  // in elements, relative to src
  for (std::int64_t n = 0; n < total; ++n) {
    std::memcpy(dst + static_cast<std::size_t>(n) * esize,
                src + offset * static_cast<std::int64_t>(esize), esize);
    for (std::size_t d = nd; d-- > 0;) {
      if (++idx[d] < shape[d]) { offset += strides[d]; break; }
      offset -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

}  // namespace detail

class Tensor : public std::enable_shared_from_this<Tensor> {
 public:
  // A new tensor with uninitialised memory (as torch::empty); see zeros().
  Tensor(DataType dtype, ShapeVector shape) : dtype_(dtype), shape_(std::move(shape)) {
    CheckDtype(dtype);
    numel_ = detail::CheckedNumel(shape_);
    storage_ = detail::AllocateStorage(static_cast<std::size_t>(numel_) * ElementSize(dtype));
    data_ = storage_.get();
  }

  // A view of memory kept alive by `storage`; `strides` in elements (empty: contiguous).
  Tensor(DataType dtype, ShapeVector shape, ShapeVector strides, void *data, std::shared_ptr<void> storage)
      : storage_(std::move(storage)), data_(data), dtype_(dtype), shape_(std::move(shape)) {
    CheckDtype(dtype);
    numel_ = detail::CheckedNumel(shape_);
    if (!strides.empty()) {
      if (strides.size() != shape_.size()) {
        throw std::invalid_argument("opbuilder::Tensor: strides and shape differ in length");
      }
      if (!detail::IsContiguousLayout(shape_, strides)) strides_ = std::move(strides);
    }
  }

  // Copies share the storage but not the binding to a Python object.
  Tensor(const Tensor &other)
      : std::enable_shared_from_this<Tensor>(),
        storage_(other.storage_), data_(other.data_), dtype_(other.dtype_), shape_(other.shape_),
        strides_(other.strides_), numel_(other.numel_), requires_grad_(other.requires_grad_) {}
  Tensor &operator=(const Tensor &) = delete;

  static TensorPtr empty(DataType dtype, ShapeVector shape) {
    return std::make_shared<Tensor>(dtype, std::move(shape));
  }
  static TensorPtr zeros(DataType dtype, ShapeVector shape) {
    auto t = std::make_shared<Tensor>(dtype, std::move(shape));
    std::memset(t->data_, 0, t->nbytes());
    return t;
  }
  static TensorPtr empty_like(const TensorPtr &t) { return empty(t->dtype(), t->shape()); }
  static TensorPtr zeros_like(const TensorPtr &t) { return zeros(t->dtype(), t->shape()); }

  const ShapeVector &shape() const { return shape_; }
  std::int64_t shape(std::int64_t dim) const { return shape_.at(NormDim(dim)); }
  ShapeVector strides() const { return strides_.empty() ? detail::ContiguousStrides(shape_) : strides_; }
  DataType dtype() const { return dtype_; }
  DataType data_type() const { return dtype_; }
  std::int64_t numel() const { return numel_; }
  std::int64_t ndim() const { return static_cast<std::int64_t>(shape_.size()); }
  std::size_t element_size() const { return ElementSize(dtype_); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel_) * ElementSize(dtype_); }
  bool is_contiguous() const { return strides_.empty(); }
  std::string device() const { return "cpu"; }
  bool requires_grad() const { return requires_grad_; }

  void *data_ptr() const { return data_; }

  // Typed pointer to the first element; throws TypeError if T is not the dtype.
  template <typename T>
  T *data() const {
    if (DataTypeOf<T>::value != dtype_) {
      throw pybind11::type_error(std::string("opbuilder::Tensor::data<T>(): tensor has dtype ") +
                                 DataTypeName(dtype_) + ", but T is " + DataTypeName(DataTypeOf<T>::value));
    }
    return static_cast<T *>(data_);
  }

  // This tensor if already C-contiguous, else a contiguous copy.
  TensorPtr contiguous() const {
    if (is_contiguous()) return std::const_pointer_cast<Tensor>(shared_from_this());
    auto out = std::make_shared<Tensor>(dtype_, shape_);
    detail::CopyToContiguous(static_cast<char *>(out->data_), static_cast<const char *>(data_), shape_, strides_,
                             element_size());
    return out;
  }

  // ---- MindSpore-compatible names (see ms_extension.h) ----
  void *data_c() const { return data_; }
  std::int64_t DataSize() const { return numel_; }
  std::size_t Size() const { return nbytes(); }

  // ---- used by the Python bridge; not part of the operator-author API ----
  const std::shared_ptr<void> &storage() const { return storage_; }
  PyObject *py_object() const { return py_.get(); }
  void BindPython(detail::PyRef obj) { py_ = std::move(obj); }
  void set_requires_grad(bool r) { requires_grad_ = r; }

 private:
  static void CheckDtype(DataType t) {
    if (static_cast<int>(t) < 0 || t >= kTypeUnknown) {
      throw std::invalid_argument("opbuilder::Tensor: unknown DataType " + std::to_string(static_cast<int>(t)));
    }
  }
  std::size_t NormDim(std::int64_t d) const {
    return static_cast<std::size_t>(d < 0 ? d + ndim() : d);
  }

  std::shared_ptr<void> storage_;
  void *data_ = nullptr;
  DataType dtype_;
  ShapeVector shape_;
  ShapeVector strides_;  // empty when contiguous
  std::int64_t numel_ = 0;
  bool requires_grad_ = false;
  detail::PyRef py_;  // the runtime.Tensor this tensor is, if any
};

}  // namespace opbuilder

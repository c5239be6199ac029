// A Tensor over a framework tensor's memory and back (to_torch's C++ bridge, detail/foreign_api.h): only the
// core library's code (src/core/) calls these, so operators do not include this header (its shared_ptr
// control blocks and deleters cost every operator's compile ~0.05 CPU-s). Not for operator authors.
#pragma once

#include <Python.h>

#include <cstdint>
#include <memory>
#include <new>

#include "opbuilder/detail/errors.h"
#include "opbuilder/detail/foreign_api.h"
#include "opbuilder/detail/visibility.h"
#include "opbuilder/tensor.h"

namespace opbuilder {
namespace detail OB_HIDDEN {

// A Tensor over a framework tensor's memory (it takes the reference in `f.handle`); `argument`: the caller's
// argument, unpacked (ForeignOwner::argument).
inline TensorPtr TensorFromForeign(const ForeignApi &api, const ForeignTensor &f, bool requires_grad,
                                   bool argument = false) {
  std::shared_ptr<void> storage(f.data, ForeignOwner{&api, f.handle, argument}, PoolAllocator<void>());
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

}  // namespace detail
}  // namespace opbuilder

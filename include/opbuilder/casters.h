// pybind11 conversion of TensorPtr <-> runtime.Tensor (zero-copy both ways).
//
// Arguments declared as TensorPtr (or const TensorPtr&, or TensorPtrList)
// accept a runtime.Tensor or a numpy array; a returned TensorPtr becomes the
// runtime.Tensor it is bound to, or a new one sharing its memory. None is not
// a tensor: use std::optional<TensorPtr> (with <pybind11/stl.h>) for optional
// inputs, so C++ never sees an unexpected null.
#pragma once

#include <pybind11/pybind11.h>

#include "opbuilder/detail/runtime_bridge.h"
#include "opbuilder/tensor.h"

namespace pybind11 {
namespace detail {

template <>
struct type_caster<opbuilder::TensorPtr> {
 public:
  PYBIND11_TYPE_CASTER(opbuilder::TensorPtr, const_name("runtime.Tensor"));

  bool load(handle src, bool /*convert*/) {
    const auto &rt = opbuilder::detail::Runtime::Get();
    PyObject *o = src.ptr();
    if (PyObject_TypeCheck(o, rt.tensor_type)) {
      value = opbuilder::detail::TensorFromPy(rt, o);
      return true;
    }
    if (rt.api->PyArray_Check_(o)) {
      value = opbuilder::detail::TensorFromArray(rt, o, nullptr, false);
      return true;
    }
    return false;
  }

  static handle cast(const opbuilder::TensorPtr &t, return_value_policy /*policy*/, handle /*parent*/) {
    if (!t) return none().release();
    return opbuilder::detail::ToPython(opbuilder::detail::Runtime::Get(), t);
  }
};

}  // namespace detail
}  // namespace pybind11

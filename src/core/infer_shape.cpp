// The core library's bodies of the functions opbuilder/detail/infer_shape.h declares with OB_CORE_FN.
// Compiled once into libobcore (core_lib.cpp), or, in a build without the core library,
// inline in each operator: opbuilder/detail/infer_shape.h includes this file at its end (detail/core_lib.h).
#include "opbuilder/detail/infer_shape.h"

namespace opbuilder {

namespace detail OB_HIDDEN {

OB_CORE_FN TensorPtr MetaTensor(DataType dtype, ShapeVector shape) {
  TensorPtr one = Tensor::zeros(dtype, {1});
  ShapeVector strides(shape.size(), 0);
  return std::make_shared<Tensor>(dtype, std::move(shape), std::move(strides), one->data_ptr(), one->storage(),
                                  false);
}

OB_CORE_FN void CheckInferredShapes(const std::string &name, const InferredShapes &want, const TensorPtrList &outs) {
  const std::string why = " (debug runs check Forward against InferShape)";
  if (want.shapes.size() != outs.size()) {
    throw std::runtime_error(name + "::InferShape gives " + std::to_string(want.shapes.size()) +
                             " output shapes, but Forward returned " + std::to_string(outs.size()) + " tensors" + why);
  }
  for (std::size_t j = 0; j < outs.size(); ++j) {
    if (!outs[j]) continue;  // CheckOutputs names a null output
    if (outs[j]->shape() != want.shapes[j].shape) {
      throw std::runtime_error(name + "::InferShape gives output " + std::to_string(j) + " the shape " +
                               ShapeString(want.shapes[j].shape) + ", but Forward returned the shape " +
                               ShapeString(outs[j]->shape()) + why);
    }
    if (want.shapes[j].dtype && outs[j]->dtype() != *want.shapes[j].dtype) {
      throw std::runtime_error(name + "::Forward returned output " + std::to_string(j) + " with dtype " +
                               DataTypeName(outs[j]->dtype()) + ", but InferShape gives it the dtype " +
                               DataTypeName(*want.shapes[j].dtype) + why);
    }
    if (!want.shapes[j].dtype && outs[j]->dtype() != want.dtype) {
      throw std::runtime_error(name + "::Forward returned output " + std::to_string(j) + " with dtype " +
                               DataTypeName(outs[j]->dtype()) +
                               ", but InferShape's outputs take the dtype of the first tensor argument, " +
                               DataTypeName(want.dtype) + why);
    }
  }
}

}  // namespace detail

}  // namespace opbuilder

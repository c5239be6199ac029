// MindSpore-style names over opbuilder's C++ API, so a source written for
// MindSpore's ms_extension.h compiles with only its kernel launches changed
// (custom::CustomLaunchAclnn has no CPU meaning; call your own kernel).
//
// Costs nothing beyond opbuilder/extension.h: every name is an alias.
#pragma once

#include "opbuilder/extension.h"

#ifndef MS_EXTENSION_NAME
#define MS_EXTENSION_NAME OB_EXTENSION_NAME
#endif

namespace mindspore {

using ShapeVector = opbuilder::ShapeVector;

// MindSpore's TypeId values, as opbuilder DataTypes.
using TypeId = opbuilder::DataType;
inline constexpr TypeId kNumberTypeBool = opbuilder::kBool;
inline constexpr TypeId kNumberTypeInt8 = opbuilder::kInt8;
inline constexpr TypeId kNumberTypeInt16 = opbuilder::kInt16;
inline constexpr TypeId kNumberTypeInt32 = opbuilder::kInt32;
inline constexpr TypeId kNumberTypeInt64 = opbuilder::kInt64;
inline constexpr TypeId kNumberTypeUInt8 = opbuilder::kUInt8;
inline constexpr TypeId kNumberTypeFloat16 = opbuilder::kFloat16;
inline constexpr TypeId kNumberTypeFloat32 = opbuilder::kFloat32;
inline constexpr TypeId kNumberTypeFloat64 = opbuilder::kFloat64;

namespace tensor {
using BaseTensor = opbuilder::Tensor;
using BaseTensorPtr = opbuilder::TensorPtr;
using BaseTensorPtrList = opbuilder::TensorPtrList;
using Tensor = opbuilder::Tensor;
using TensorPtr = opbuilder::TensorPtr;
using TensorPtrList = opbuilder::TensorPtrList;
}  // namespace tensor

namespace pynative {
namespace autograd {
template <typename T>
using Function = opbuilder::Function<T>;
using AutogradContext = opbuilder::AutogradContext;
using tensor::BaseTensor;
using tensor::BaseTensorPtr;
using tensor::BaseTensorPtrList;
using tensor::TensorPtr;
using tensor::TensorPtrList;
}  // namespace autograd
}  // namespace pynative

namespace pyboost {
// The tutorials also place Function classes in mindspore::pyboost: same names.
using namespace ::mindspore::pynative::autograd;
}  // namespace pyboost

}  // namespace mindspore

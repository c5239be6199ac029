// MindSpore-style names over opbuilder's C++ API, so a source written for
// MindSpore's ms_extension.h compiles unchanged. custom::CustomLaunchAclnn runs
// the common aclnn operators (Mul, Add, ReduceSum, Matmul, ...) on the host:
// see mindspore/aclnn_host.h.
//
// Costs little beyond opbuilder/extension.h: the names are aliases, and
// CustomLaunchAclnn is a template compiled only where it is called.
#pragma once

#include "opbuilder/extension.h"
#include "mindspore/aclnn_host.h"

#if defined(OB_BINDING_NANOBIND)
// A PYBIND11_MODULE source the builder builds with nanobind (opbuilder/compile/ms_module.py): the standard
// headers pybind11's headers include and nanobind's do not, so code that used them without its own
// #include compiles as it did on pybind11.
#include <algorithm>
#include <cassert>
#include <ctime>
#include <deque>
#include <forward_list>
#include <functional>
#include <iterator>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <stack>
#include <thread>
#include <typeindex>
#include <unordered_set>
#include <valarray>
#include <variant>
#endif

#ifndef MS_EXTENSION_NAME
#define MS_EXTENSION_NAME OB_EXTENSION_NAME
#endif

namespace mindspore {

using ShapeVector = opbuilder::ShapeVector;

// MindSpore's TypeId: opbuilder's DataType, whose kNumberType* enumerators carry
// MindSpore's spellings (TypeId::kNumberTypeFloat32 and kNumberTypeFloat32 both work).
using TypeId = opbuilder::DataType;
using opbuilder::kNumberTypeBool;
using opbuilder::kNumberTypeInt8;
using opbuilder::kNumberTypeInt16;
using opbuilder::kNumberTypeInt32;
using opbuilder::kNumberTypeInt64;
using opbuilder::kNumberTypeUInt8;
using opbuilder::kNumberTypeFloat16;
using opbuilder::kNumberTypeFloat32;
using opbuilder::kNumberTypeFloat64;

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

// opbuilder's C++ API for operator authors: the one header to include.
//
//   #include "opbuilder/extension.h"
//   using namespace opbuilder;
//
// Tensor / TensorPtr / TensorPtrList / ShapeVector / DataType (tensor.h,
// dtype.h), Function<T> and AutogradContext (autograd.h), and the pybind11
// conversions to and from runtime.Tensor (casters.h). The builder defines
// OB_EXTENSION_NAME as the module's name for PYBIND11_MODULE.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "opbuilder/autograd.h"
#include "opbuilder/casters.h"
#include "opbuilder/dtype.h"
#include "opbuilder/tensor.h"

#if defined(__CUDACC__) || defined(OPBUILDER_WITH_CUDA)
#include "opbuilder/cuda.h"
#endif

#ifndef OB_EXTENSION_NAME
#define OB_EXTENSION_NAME opbuilder_extension
#endif

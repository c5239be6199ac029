// Test sources built with either binding layer (CustomOpBuilder(..., binding=...)): `py::` is the
// layer's library and OB_MODULE its module (extension.h maps OB_MODULE to PYBIND11_MODULE for pybind11).
#pragma once

#include "opbuilder/extension.h"

#if defined(OB_BINDING_NANOBIND)
namespace py = nanobind;
#define OB_TEST_BINDING "nanobind"
#else
namespace py = pybind11;
#define OB_TEST_BINDING "pybind11"
#endif

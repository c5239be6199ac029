// opbuilder's C++ API for operator authors: the one header to include.
//
//   #include "opbuilder/extension.h"
//   using namespace opbuilder;
//   OB_MODULE(m) { m.def("mul", ...); }
//
// Tensor / TensorPtr / TensorPtrList / ShapeVector / DataType (tensor.h,
// dtype.h), Function<T> and AutogradContext (autograd.h): these depend on no
// binding library. Then one binding layer: nanobind (nanobind.h), which the
// builder selects (OB_BINDING_NANOBIND) for sources that define their module
// with OB_MODULE or NB_MODULE; else pybind11 (casters.h), for sources written
// with PYBIND11_MODULE(OB_EXTENSION_NAME, m), as before. The builder defines
// OB_EXTENSION_NAME as the module's name.
#pragma once

#ifndef OB_EXTENSION_NAME
#define OB_EXTENSION_NAME opbuilder_extension
#endif

#if defined(OB_BINDING_NANOBIND)
#include "opbuilder/nanobind.h"
#else
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "opbuilder/casters.h"
#include "opbuilder/detail/bound_call.h"
#ifndef OB_MODULE
namespace opbuilder {
namespace detail OB_HIDDEN {
using ObModule = TracedModule<::pybind11::module_>;
template <>
struct IsKeywordOnly<::pybind11::kw_only> : std::true_type {};
}  // namespace detail
// The module OB_MODULE and PYBIND11_MODULE hand their body: a helper in another source that binds functions
// takes one, so jit records them whole (docs/reference/jit.md).
using ObModule = detail::ObModule;
}  // namespace opbuilder
// Outside the builder's nanobind mode, OB_MODULE is a pybind11 module (same source, either layer). With
// pybind11 >= 3, PYBIND11_MODULE's `m` is an ObModule too, whose def() binds each function so that
// runtime.jit records the whole call (detail/bound_call.h); with an older pybind11, a trace that meets an
// Apply of such a module stops, and that signature runs eagerly.
#if defined(PYBIND11_MODULE_PYINIT) && defined(PYBIND11_MODULE_EXEC)
#define OB_PYBIND11_MODULE_(name, variable, ...)                    \
  static void ob_module_body_(::opbuilder::detail::ObModule);      \
  PYBIND11_MODULE_PYINIT(name, ##__VA_ARGS__)                       \
  PYBIND11_MODULE_EXEC(name, ob_module_) {                          \
    ob_module_body_(::opbuilder::detail::ObModule(ob_module_));     \
  }                                                                 \
  static void ob_module_body_(::opbuilder::detail::ObModule variable)
#undef PYBIND11_MODULE
#define PYBIND11_MODULE(name, variable, ...) OB_PYBIND11_MODULE_(name, variable, ##__VA_ARGS__)
#define OB_MODULE(m) PYBIND11_MODULE(OB_EXTENSION_NAME, m)
#else
#define OB_MODULE(m)                                            \
  static void ob_module_body_(::opbuilder::detail::ObModule);  \
  PYBIND11_MODULE(OB_EXTENSION_NAME, ob_module_) {              \
    ob_module_body_(::opbuilder::detail::ObModule(ob_module_)); \
  }                                                             \
  static void ob_module_body_(::opbuilder::detail::ObModule m)
#endif
#endif
#endif

#include "opbuilder/autograd.h"
#include "opbuilder/dispatch.h"
#include "opbuilder/dtype.h"
#include "opbuilder/tensor.h"

#if defined(__CUDACC__) || defined(OPBUILDER_WITH_CUDA)
#include "opbuilder/cuda.h"
#endif

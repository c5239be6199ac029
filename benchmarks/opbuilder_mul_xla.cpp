// The opbuilder operator for benchmarks/interop.py's JAX rows: the Function of
// opbuilder_mul_function.h (bench::MulKernel, with InferShape) and XLA FFI handlers
// (opbuilder/xla_ffi.h), so opbuilder.to_jax runs it as an XLA custom call. Built with include_paths=[jax.ffi.include_dir()].
#include "opbuilder_mul_function.h"
#include "opbuilder/xla_ffi.h"

using namespace opbuilder;
using bench::BenchMul;

PYBIND11_MODULE(OB_EXTENSION_NAME, m) {
  m.def("mul", [](const TensorPtr &x, const TensorPtr &y) { return BenchMul::Apply(x, y); });
  m.def("mul_infer_shape", BenchMul::InferShapeFunction());
  OB_XLA_FFI(m, "mul", BenchMul);
}

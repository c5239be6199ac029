// benchmarks/opbuilder_mul.cpp's operator bound as a user's operator is by default: OB_MODULE, so
// the builder binds it with nanobind (opbuilder_mul.cpp is a pybind11 module: its floor_call reads
// numpy arrays through pybind11). The same Function<T> and kernel (benchmarks/opbuilder_mul_function.h).
#include "opbuilder_mul_function.h"

OB_MODULE(m) {
  m.def("mul", [](const opbuilder::TensorPtr &x, const opbuilder::TensorPtr &y) { return bench::BenchMul::Apply(x, y); });
}

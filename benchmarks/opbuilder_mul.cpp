// The opbuilder operator for benchmarks/call_overhead.py: a Function<T>
// running bench::MulKernel (as benchmarks/torch_function_mul.cpp does), the
// kernel loop alone, and the floor: a bare pybind11 call doing what any call
// must (read two buffers, allocate the output, wrap it in a runtime.Tensor).
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "opbuilder_mul_function.h"

#include <pybind11/numpy.h>  // floor_call reads numpy arrays

namespace py = pybind11;
using namespace opbuilder;
using bench::BenchMul;

PYBIND11_MODULE(OB_EXTENSION_NAME, m) {
  m.def("mul", [](const TensorPtr &x, const TensorPtr &y) { return BenchMul::Apply(x, y); });

  // Mean seconds per run of the kernel alone over preallocated buffers, `repeat` runs.
  m.def("kernel_seconds", [](const TensorPtr &x, const TensorPtr &y, const TensorPtr &out, int repeat) {
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < repeat; ++r) {
      bench::MulKernel(x->data<float>(), y->data<float>(), out->data<float>(), x->numel());
    }
    std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    return dt.count() / repeat;
  });

  // The floor: runtime.Tensor in, buffers read, output allocated by numpy, runtime.Tensor out.
  py::object tensor_type = py::module_::import("runtime.tensor").attr("Tensor");
  m.def("floor_call", [tensor_type](py::handle x, py::handle y) {
    py::object xd = x.attr("_data"), yd = y.attr("_data");
    if (!py::isinstance<py::array_t<float, 0>>(xd) || !py::isinstance<py::array_t<float, 0>>(yd)) {
      throw std::invalid_argument("floor_call: expected float32 tensors");
    }
    auto a = py::reinterpret_borrow<py::array_t<float>>(xd);
    auto b = py::reinterpret_borrow<py::array_t<float>>(yd);
    std::vector<py::ssize_t> shape(a.shape(), a.shape() + a.ndim());
    py::array_t<float> out(shape);
    bench::MulKernel(a.data(), b.data(), out.mutable_data(), a.size());
    auto *type = reinterpret_cast<PyTypeObject *>(tensor_type.ptr());
    py::object t = py::reinterpret_steal<py::object>(type->tp_new(type, py::tuple().ptr(), nullptr));
    t.attr("_data") = out;
    return t;
  });
}

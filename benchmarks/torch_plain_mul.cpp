// The benchmark's plain PyTorch C++ operator: bench::MulKernel with no autograd, the way a
// cpp_extension user writes an op torch need not differentiate. Bound twice: with pybind11
// (``module.mul``, torch's cheapest call) and registered with TORCH_LIBRARY
// (``torch.ops.bench_plain.mul``, through torch's dispatcher). Built -O3 by
// torch.utils.cpp_extension.load (benchmarks/interop.py).
#include <torch/extension.h>

#include "torch_mul_forward.h"

using bench::Mul;

TORCH_LIBRARY(bench_plain, m) { m.def("mul(Tensor x, Tensor y) -> Tensor"); }

TORCH_LIBRARY_IMPL(bench_plain, CPU, m) { m.impl("mul", &Mul); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("mul", &Mul, "x * y, no autograd"); }

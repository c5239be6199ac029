// The benchmark's plain PyTorch C++ operator: bench::MulKernel with no autograd, the way a
// cpp_extension user writes an op torch need not differentiate. Bound twice: with pybind11
// (``module.mul``, torch's cheapest call) and registered with TORCH_LIBRARY
// (``torch.ops.bench_plain.mul``, through torch's dispatcher). Built -O3 by
// torch.utils.cpp_extension.load (benchmarks/interop.py).
#include <torch/extension.h>

#include "mul_kernel.h"

namespace {

torch::Tensor Mul(const torch::Tensor &x, const torch::Tensor &y) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat && y.scalar_type() == torch::kFloat && x.sizes() == y.sizes(),
              "mul: expected two float32 tensors of one shape");
  torch::Tensor xc = x.contiguous(), yc = y.contiguous();
  torch::Tensor out = torch::empty_like(xc);
  bench::MulKernel(xc.data_ptr<float>(), yc.data_ptr<float>(), out.data_ptr<float>(), xc.numel());
  return out;
}

}  // namespace

TORCH_LIBRARY(bench_plain, m) { m.def("mul(Tensor x, Tensor y) -> Tensor"); }

TORCH_LIBRARY_IMPL(bench_plain, CPU, m) { m.impl("mul", &Mul); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("mul", &Mul, "x * y, no autograd"); }

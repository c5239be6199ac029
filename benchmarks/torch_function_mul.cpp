// The PyTorch reference for benchmarks/call_overhead.py: a C++ autograd
// Function (torch::autograd::Function) running bench::MulKernel, written the
// way benchmarks/opbuilder_mul.cpp is. Built -O3 by torch.utils.cpp_extension.load.
#include <torch/extension.h>

#include "mul_kernel.h"

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

torch::Tensor Mul(const torch::Tensor &x, const torch::Tensor &y) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat && y.scalar_type() == torch::kFloat && x.sizes() == y.sizes(),
              "mul: expected two float32 tensors of one shape");
  torch::Tensor xc = x.contiguous(), yc = y.contiguous();
  torch::Tensor out = torch::empty_like(xc);
  bench::MulKernel(xc.data_ptr<float>(), yc.data_ptr<float>(), out.data_ptr<float>(), xc.numel());
  return out;
}

struct TorchMul : public torch::autograd::Function<TorchMul> {
  static torch::Tensor forward(AutogradContext *ctx, const torch::Tensor &x, const torch::Tensor &y) {
    ctx->save_for_backward({x, y});
    return Mul(x, y);
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    torch::Tensor gx = ctx->needs_input_grad(0) ? Mul(grads[0], saved[1]) : torch::Tensor();
    torch::Tensor gy = ctx->needs_input_grad(1) ? Mul(grads[0], saved[0]) : torch::Tensor();
    return {gx, gy};
  }
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("mul", [](const torch::Tensor &x, const torch::Tensor &y) { return TorchMul::apply(x, y); });
}

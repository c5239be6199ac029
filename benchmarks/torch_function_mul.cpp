// The PyTorch reference for benchmarks/call_overhead.py: a C++ autograd
// Function (torch::autograd::Function) running bench::MulKernel, written the
// way benchmarks/opbuilder_mul.cpp is. Built -O3 by torch.utils.cpp_extension.load.
#include <torch/extension.h>

#include "torch_mul_forward.h"

using bench::Mul;

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

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

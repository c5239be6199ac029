// The PyTorch reference for the custom-activation row of benchmarks/train.py: the
// swish activation of examples/swish_op.cpp (the same two loops, float32 and float64)
// as a torch::autograd::Function, built by torch.utils.cpp_extension.load with the
// flags benchmarks/train.py gives opbuilder's side.
#include <torch/extension.h>

#include <cmath>
#include "../examples/swish_kernels.h"

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

void CheckFloat(const torch::Tensor &t) {
  TORCH_CHECK(t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kDouble,
              "swish: expected float32 or float64");
}

struct TorchSwish : public torch::autograd::Function<TorchSwish> {
  static torch::Tensor forward(AutogradContext *ctx, const torch::Tensor &x_in) {
    CheckFloat(x_in);
    torch::Tensor x = x_in.contiguous();
    torch::Tensor y = torch::empty_like(x);
    if (x.scalar_type() == torch::kFloat) {
      swish::Forward(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    } else {
      swish::Forward(x.data_ptr<double>(), y.data_ptr<double>(), x.numel());
    }
    ctx->save_for_backward({x});
    return y;
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    torch::Tensor x = ctx->get_saved_variables()[0];
    torch::Tensor dy = grads[0].contiguous();
    torch::Tensor dx = torch::empty_like(x);
    if (x.scalar_type() == torch::kFloat) {
      swish::Backward(x.data_ptr<float>(), dy.data_ptr<float>(), dx.data_ptr<float>(), x.numel());
    } else {
      swish::Backward(x.data_ptr<double>(), dy.data_ptr<double>(), dx.data_ptr<double>(), x.numel());
    }
    return {dx};
  }
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("swish", [](const torch::Tensor &x) { return TorchSwish::apply(x); }, "x * sigmoid(x), differentiable");
}

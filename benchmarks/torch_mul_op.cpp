// The benchmark's PyTorch counterpart of custom_src/function_ops.cpp: a
// multiply with its backward as a torch::autograd::Function, bound with
// pybind11, built by torch.utils.cpp_extension.load.
#include <torch/extension.h>

class CustomMul : public torch::autograd::Function<CustomMul> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &x,
                               const torch::Tensor &y) {
    ctx->save_for_backward({x, y});
    return x * y;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext *ctx,
                                               torch::autograd::tensor_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor &dout = grad_outputs[0];
    return {dout * saved[1], dout * saved[0]};
  }
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("mul", [](const torch::Tensor &x, const torch::Tensor &y) { return CustomMul::apply(x, y); },
        "x * y, differentiable in both");
}

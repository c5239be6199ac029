// The PyTorch reference for benchmarks/gpu.py: tests/cuda/cuda_function_ops.cu's
// SquarePlus (y = x * x + s * x) as a torch C++ autograd Function with the same
// kernels, launched on torch's current stream. Built by torch.utils.cpp_extension.load.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "square_plus_kernels.cuh"  // tests/cuda: the .cu op's own kernels

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {
using square_plus::Blocks;
using square_plus::kThreads;

struct SquarePlus : public torch::autograd::Function<SquarePlus> {
  static torch::Tensor forward(AutogradContext *ctx, const torch::Tensor &x, double s) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kDouble, "square_plus: x must be a float64 GPU tensor");
    torch::Tensor xc = x.contiguous();
    torch::Tensor y = torch::empty_like(xc);
    const int64_t n = xc.numel();
    if (n > 0) {
      square_plus::Forward<<<Blocks(n), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
          xc.data_ptr<double>(), s, y.data_ptr<double>(), n);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    ctx->save_for_backward({xc});
    ctx->saved_data["s"] = s;
    return y;
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    torch::Tensor x = ctx->get_saved_variables()[0];
    torch::Tensor g = grads[0].contiguous();
    torch::Tensor dx = torch::empty_like(x);
    const int64_t n = x.numel();
    if (n > 0) {
      square_plus::Backward<<<Blocks(n), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
          x.data_ptr<double>(), g.data_ptr<double>(), ctx->saved_data["s"].toDouble(), dx.data_ptr<double>(), n);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    return {dx, torch::Tensor()};
  }
};
}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("square_plus", [](const torch::Tensor &x, double s) { return SquarePlus::apply(x, s); });
}

// A Function op in CUDA: y = x * x + s * x (Forward/Backward on device tensors).
// Compiled with nvcc by tests/test_cuda_build.py (no GPU needed) and run by
// tests/test_gpu_runtime.py on a GPU.
#include "opbuilder/extension.h"
using namespace opbuilder;

namespace {
constexpr int kThreads = 256;

__global__ void SquarePlusKernel(const double *x, double s, double *y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * x[i] + s * x[i];
}

__global__ void SquarePlusGradKernel(const double *x, const double *g, double s, double *dx, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dx[i] = g[i] * (2.0 * x[i] + s);
}

unsigned Blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

TensorPtr Check(const TensorPtr &t, const char *what) {
  if (!t->is_cuda()) throw pybind11::value_error(std::string(what) + " must be a GPU tensor, got one on " + t->device());
  return t;
}
}  // namespace

class SquarePlus : public Function<SquarePlus> {
 public:
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, double s) {
    Check(x, "x");
    auto y = Tensor::empty_like(x);
    const int64_t n = x->numel();
    if (n > 0) {
      SquarePlusKernel<<<Blocks(n), kThreads, 0, cuda::CurrentStream()>>>(x->data<double>(), s, y->data<double>(), n);
      OB_CUDA_CHECK(cudaGetLastError());
    }
    ctx->SaveForBackward({x});
    ctx->saved_data["s"] = pybind11::cast(s);
    return y;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList grads) {
    auto x = ctx->GetSavedTensors()[0];
    auto g = Check(grads[0], "the gradient")->contiguous();
    auto dx = std::make_shared<Tensor>(x->dtype(), x->shape(), x->device());
    const int64_t n = x->numel();
    if (n > 0) {
      SquarePlusGradKernel<<<Blocks(n), kThreads, 0, cuda::CurrentStream()>>>(
          x->data<double>(), g->data<double>(), ctx->saved_data["s"].cast<double>(), dx->data<double>(), n);
      OB_CUDA_CHECK(cudaGetLastError());
    }
    return {dx, nullptr};
  }
};

PYBIND11_MODULE(OB_EXTENSION_NAME, m) {
  m.def("square_plus", [](const TensorPtr &x, double s) { return SquarePlus::Apply(x, s); });
  m.def("device_of", [](const TensorPtr &x) { return x->device(); });
  m.def("data_ptr", [](const TensorPtr &x) { return reinterpret_cast<std::uintptr_t>(x->data_ptr()); });
  m.def("stream", []() { return reinterpret_cast<std::uintptr_t>(cuda::CurrentStream()); });
  m.def("bad_launch", []() { OB_CUDA_CHECK(cudaSetDevice(-1)); });
}

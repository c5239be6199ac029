// A Function op in CUDA: y = x * x + s * x (Forward/Backward on device tensors).
// Compiled with nvcc by tests/test_cuda_build.py (no GPU needed) and run by
// tests/test_gpu_runtime.py on a GPU.
#include "opbuilder/extension.h"
#include "square_plus_kernels.cuh"
using namespace opbuilder;

namespace {
using square_plus::Blocks;
using square_plus::kThreads;

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
      square_plus::Forward<<<Blocks(n), kThreads, 0, cuda::CurrentStream()>>>(x->data<double>(), s, y->data<double>(), n);
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
      square_plus::Backward<<<Blocks(n), kThreads, 0, cuda::CurrentStream()>>>(
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
  // the same as a 1-element int64 host tensor: a result to_torch returns on every path
  m.def("stream_tensor", [](const TensorPtr &) {
    auto t = std::make_shared<Tensor>(kInt64, ShapeVector{1});
    *t->data<std::int64_t>() = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(cuda::CurrentStream()));
    return t;
  });
  m.def("bad_launch", []() { OB_CUDA_CHECK(cudaSetDevice(-1)); });
}

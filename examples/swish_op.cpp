// Swish (SiLU) activation, y = x * sigmoid(x), with its backward, on opbuilder's Function API.
// examples/train_classifier.py uses it as the activation of a small classifier:
//
//   ops = CustomOpBuilder("swish_ops", ["examples/swish_op.cpp"]).load()
//   y = ops.swish(x)   # float32 or float64; differentiable
//
// Without kAcceptsViews the Function receives C-contiguous tensors, so the kernels loop flat.
#include <cmath>
#include <stdexcept>
#include <string>

#include "opbuilder/extension.h"

using namespace opbuilder;

namespace {

template <typename T>
void SwishKernel(const T *x, T *y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (T(1) + std::exp(-x[i]));
}

// dx = dy * (s + x * s * (1 - s)), s = sigmoid(x)
template <typename T>
void SwishGradKernel(const T *x, const T *dy, T *dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T s = T(1) / (T(1) + std::exp(-x[i]));
    dx[i] = dy[i] * (s + x[i] * s * (T(1) - s));
  }
}

void CheckFloat(const TensorPtr &t, const char *what) {
  if (t->dtype() != kFloat32 && t->dtype() != kFloat64) {
    throw std::invalid_argument(std::string("swish: ") + what + " must be float32 or float64, got " +
                                DataTypeName(t->dtype()));
  }
}

}  // namespace

class Swish : public Function<Swish> {
 public:
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    CheckFloat(x, "x");
    auto y = Tensor::empty_like(x);
    if (x->dtype() == kFloat32) {
      SwishKernel(x->data<float>(), y->data<float>(), x->numel());
    } else {
      SwishKernel(x->data<double>(), y->data<double>(), x->numel());
    }
    if (ctx->NeedGrad(x)) ctx->SaveForBackward({x});
    return y;
  }

  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList grad_outputs) {
    const TensorPtr x = ctx->GetSavedTensors()[0];
    const TensorPtr dy = grad_outputs[0]->contiguous();
    auto dx = Tensor::empty_like(x);
    if (x->dtype() == kFloat32) {
      SwishGradKernel(x->data<float>(), dy->data<float>(), dx->data<float>(), x->numel());
    } else {
      SwishGradKernel(x->data<double>(), dy->data<double>(), dx->data<double>(), x->numel());
    }
    return {dx};
  }
};

PYBIND11_MODULE(OB_EXTENSION_NAME, m) {
  m.doc() = "Swish activation (x * sigmoid(x)) with its backward";
  m.def("swish", [](const TensorPtr &x) { return Swish::Apply(x); }, "x * sigmoid(x), differentiable");
}

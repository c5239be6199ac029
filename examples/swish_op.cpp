// Swish (SiLU) activation, y = x * sigmoid(x), with its backward, on opbuilder's Function API.
// examples/train_classifier.py uses it as the activation of a small classifier:
//
//   ops = CustomOpBuilder("swish_ops", ["examples/swish_op.cpp"]).load()
//   y = ops.swish(x)   # float32 or float64; differentiable
//
// Without kAcceptsViews the Function receives C-contiguous tensors, so the kernels (swish_kernels.h)
// loop flat.
#include <cmath>
#include <stdexcept>
#include <string>

#include "opbuilder/extension.h"
#include "swish_kernels.h"

using namespace opbuilder;

namespace {

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
      swish::Forward(x->data<float>(), y->data<float>(), x->numel());
    } else {
      swish::Forward(x->data<double>(), y->data<double>(), x->numel());
    }
    if (ctx->NeedGrad(x)) ctx->SaveForBackward({x});
    return y;
  }

  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList grad_outputs) {
    const TensorPtr x = ctx->GetSavedTensors()[0];
    const TensorPtr dy = grad_outputs[0]->contiguous();
    auto dx = Tensor::empty_like(x);
    if (x->dtype() == kFloat32) {
      swish::Backward(x->data<float>(), dy->data<float>(), dx->data<float>(), x->numel());
    } else {
      swish::Backward(x->data<double>(), dy->data<double>(), dx->data<double>(), x->numel());
    }
    return {dx};
  }
};

PYBIND11_MODULE(OB_EXTENSION_NAME, m) {
  m.doc() = "Swish activation (x * sigmoid(x)) with its backward";
  m.def("swish", [](const TensorPtr &x) { return Swish::Apply(x); }, "x * sigmoid(x), differentiable");
}

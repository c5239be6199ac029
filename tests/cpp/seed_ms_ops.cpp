// Seed 003's operator as its tutorial writes it for ms_extension.h, with the
// Ascend kernel launch replaced by the plain loop a CPU user writes over
// data_c() (inputs of one shape). Nothing here knows about strides.
#include <string>

#include "ms_extension.h"

namespace mindspore::pynative {
namespace autograd {

void LaunchMul(const BaseTensorPtr &a, const BaseTensorPtr &b, const BaseTensorPtr &out) {
  const float *pa = static_cast<const float *>(a->data_c());
  const float *pb = static_cast<const float *>(b->data_c());
  float *po = static_cast<float *>(out->data_c());
  for (int64_t i = 0; i < out->DataSize(); ++i) po[i] = pa[i] * pb[i];
}

class CustomMul : public Function<CustomMul> {
 public:
  static BaseTensorPtr Forward(AutogradContext *ctx, const BaseTensorPtr &x, const BaseTensorPtr &y) {
    auto output = std::make_shared<BaseTensor>(x->data_type(), x->shape());
    LaunchMul(x, y, output);
    bool x_require_grad = ctx->NeedGrad(x);
    bool y_require_grad = ctx->NeedGrad(y);
    if (x_require_grad || y_require_grad) {
      ctx->SaveForBackward({x_require_grad ? y : nullptr, y_require_grad ? x : nullptr});
    }
    return output;
  }

  static BaseTensorPtrList Backward(AutogradContext *ctx, BaseTensorPtrList grad_outputs) {
    auto saved = ctx->GetSavedTensors();
    auto dout = grad_outputs[0];
    BaseTensorPtr grad_x = nullptr;
    BaseTensorPtr grad_y = nullptr;
    if (ctx->NeedsInputGrad(0)) {
      grad_x = std::make_shared<BaseTensor>(dout->data_type(), dout->shape());
      LaunchMul(dout, saved[0], grad_x);
    }
    if (ctx->NeedsInputGrad(1)) {
      grad_y = std::make_shared<BaseTensor>(dout->data_type(), dout->shape());
      LaunchMul(dout, saved[1], grad_y);
    }
    return {grad_x, grad_y};
  }
};

BaseTensorPtr run_custom_mul(const tensor::BaseTensorPtr &x, const tensor::BaseTensorPtr &y) {
  return CustomMul::Apply(x, y);
}

}  // namespace autograd
}  // namespace mindspore::pynative

PYBIND11_MODULE(MS_EXTENSION_NAME, m) {
  m.def("mul", &mindspore::pynative::autograd::run_custom_mul, "Calculate the value x multiplied by y.");
}

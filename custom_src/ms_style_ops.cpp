// The seed's MindSpore CustomMul (tutorial "CustomOpBuilder: Develop Forward and
// Backward Operators with the Function Interface"), compiled through
// ms_extension.h. The only change from the seed: the Ascend kernel launch
// custom::CustomLaunchAclnn("aclnnMul", ...) is replaced by MulKernel below.
#include <algorithm>
#include <stdexcept>
#include <vector>

#include "ms_extension.h"

namespace mindspore::pynative {
namespace autograd {

ShapeVector BroadcastInferShape(const BaseTensorPtr &t1, const BaseTensorPtr &t2) {
  ShapeVector s1 = t1->shape();
  ShapeVector s2 = t2->shape();
  ShapeVector out_shape(std::max(s1.size(), s2.size()), 1LL);
  if (out_shape.empty()) {
    return out_shape;
  }
  for (size_t i = out_shape.size(); i > 0; i--) {
    if (i <= s1.size() && s1[s1.size() - i] > 1) {
      out_shape[out_shape.size() - i] = s1[s1.size() - i];
    } else if (i <= s2.size() && s2[s2.size() - i] > 1) {
      out_shape[out_shape.size() - i] = s2[s2.size() - i];
    }
  }
  return out_shape;
}

// CPU stand-in for aclnnMul: out = a * b with broadcasting (float32).
void MulKernel(const BaseTensorPtr &a_in, const BaseTensorPtr &b_in, const BaseTensorPtr &out) {
  if (a_in->data_type() != kNumberTypeFloat32 || b_in->data_type() != kNumberTypeFloat32) {
    throw std::invalid_argument("mul: expected float32 tensors");
  }
  auto a = a_in->contiguous();
  auto b = b_in->contiguous();
  const ShapeVector &shape = out->shape();
  const size_t nd = shape.size();
  for (const auto &t : {a, b}) {  // the seed's shape inference does not check; the kernel must
    const ShapeVector &ts = t->shape();
    for (size_t i = 0; i < ts.size(); ++i) {
      const int64_t o = shape[nd - ts.size() + i];
      if (ts.size() > nd || (ts[i] != 1 && ts[i] != o)) {
        throw std::invalid_argument("mul: shapes cannot be broadcast together");
      }
    }
  }
  auto strides_of = [&](const BaseTensorPtr &t) {
    std::vector<int64_t> s(nd, 0);
    int64_t acc = 1;
    const ShapeVector &ts = t->shape();
    for (size_t i = ts.size(); i-- > 0;) {
      if (ts[i] != 1) s[nd - ts.size() + i] = acc;
      acc *= ts[i];
    }
    return s;
  };
  const auto sa = strides_of(a), sb = strides_of(b);
  const float *pa = static_cast<const float *>(a->data_c());
  const float *pb = static_cast<const float *>(b->data_c());
  float *po = static_cast<float *>(out->data_c());
  std::vector<int64_t> idx(nd, 0);
  int64_t oa = 0, ob = 0;
  for (int64_t i = 0; i < out->DataSize(); ++i) {
    po[i] = pa[oa] * pb[ob];
    for (size_t d = nd; d-- > 0;) {
      if (++idx[d] < shape[d]) { oa += sa[d]; ob += sb[d]; break; }
      oa -= sa[d] * (shape[d] - 1);
      ob -= sb[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

class CustomMul : public Function<CustomMul> {
 public:
  static BaseTensorPtr Forward(AutogradContext *ctx, const BaseTensorPtr &x, const BaseTensorPtr &y) {
    auto output = std::make_shared<BaseTensor>(x->data_type(), BroadcastInferShape(x, y));
    MulKernel(x, y, output);
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
      grad_x = std::make_shared<BaseTensor>(dout->data_type(), BroadcastInferShape(dout, saved[0]));
      MulKernel(dout, saved[0], grad_x);
    }
    if (ctx->NeedsInputGrad(1)) {
      grad_y = std::make_shared<BaseTensor>(dout->data_type(), BroadcastInferShape(dout, saved[1]));
      MulKernel(dout, saved[1], grad_y);
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

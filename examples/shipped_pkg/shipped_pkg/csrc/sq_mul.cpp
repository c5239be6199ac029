// sq_mul(x, y) = x * x * y, elementwise, for float32 and float64 tensors of one shape, with its backward:
// d/dx = 2 x y, d/dy = x * x.
#include "opbuilder/extension.h"
using namespace opbuilder;

template <typename T>
static void Kernel(const Tensor &x, const Tensor &y, const Tensor *dout, Tensor &out, bool wrt_x) {
  const T *a = x.data<T>(), *b = y.data<T>();
  const T *g = dout != nullptr ? dout->data<T>() : nullptr;
  T *o = out.data<T>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const T v = g == nullptr ? a[i] * a[i] * b[i] : (wrt_x ? T(2) * a[i] * b[i] : a[i] * a[i]);
    o[i] = g == nullptr ? v : v * g[i];
  }
}

// forward (dout null) or one input's gradient (dout given; wrt_x: with respect to x, else y)
static TensorPtr SqMulOrGrad(const TensorPtr &x, const TensorPtr &y, const TensorPtr &dout, bool wrt_x) {
  if (x->shape() != y->shape() || x->dtype() != y->dtype()) throw std::invalid_argument("sq_mul: x and y differ");
  TensorPtr xc = x->contiguous(), yc = y->contiguous(), gc = dout ? dout->contiguous() : nullptr;
  auto out = std::make_shared<Tensor>(x->dtype(), x->shape());
  if (x->dtype() == DataType::kFloat64) {
    Kernel<double>(*xc, *yc, gc.get(), *out, wrt_x);
  } else {
    Kernel<float>(*xc, *yc, gc.get(), *out, wrt_x);
  }
  return out;
}

class SqMul : public Function<SqMul> {
 public:
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y) {
    ctx->SaveForBackward({x, y});
    return SqMulOrGrad(x, y, nullptr, true);
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList grad_outputs) {
    auto saved = ctx->GetSavedTensors();
    return {ctx->NeedsInputGrad(0) ? SqMulOrGrad(saved[0], saved[1], grad_outputs[0], true) : nullptr,
            ctx->NeedsInputGrad(1) ? SqMulOrGrad(saved[0], saved[1], grad_outputs[0], false) : nullptr};
  }
};

OB_MODULE(m) {
  m.def("sq_mul", [](const TensorPtr &x, const TensorPtr &y) { return SqMul::Apply(x, y); });
}

// Swish, y = x * sigmoid(x), with its backward and XLA FFI handlers, so opbuilder.to_jax runs it as an
// XLA custom call (no host callback, no GIL). examples/jax_shard_map.py runs it under jax.shard_map.
//
//   ops = CustomOpBuilder("swish_xla_ops", ["examples/swish_xla_op.cpp"],
//                         include_paths=[jax.ffi.include_dir()]).load()
//   jops = opbuilder.to_jax(ops)   # jops.swish: an XLA custom call under jax.jit
//
// XLA's handlers run Forward and Backward without Python: host tensors only, no ctx->saved_data.
#include <cmath>
#include <stdexcept>
#include <string>

#include "opbuilder/extension.h"
#include "opbuilder/xla_ffi.h"
#include "swish_kernels.h"

using namespace opbuilder;

class Swish : public Function<Swish> {
 public:
  static ShapeVector InferShape(const TensorPtr &x) { return x->shape(); }

  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    auto y = Tensor::empty_like(x);
    if (x->dtype() == kFloat32) {
      swish::Forward(x->data<float>(), y->data<float>(), x->numel());
    } else if (x->dtype() == kFloat64) {
      swish::Forward(x->data<double>(), y->data<double>(), x->numel());
    } else {
      throw std::invalid_argument(std::string("swish: x must be float32 or float64, got ") +
                                  DataTypeName(x->dtype()));
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

OB_MODULE(m) {
  m.def("swish", [](const TensorPtr &x) { return Swish::Apply(x); }, "x * sigmoid(x), differentiable");
  m.def("swish_infer_shape", Swish::InferShapeFunction());
  OB_XLA_FFI(m, "swish", Swish);
}

// The benchmarks' opbuilder multiply: bench::MulKernel behind a float32 check, and the Function<T>
// (with a shape rule) that benchmarks/opbuilder_mul.cpp and opbuilder_mul_xla.cpp bind.
#pragma once

#include <stdexcept>

#include "mul_kernel.h"
#include "opbuilder/extension.h"

namespace bench {
using namespace opbuilder;

inline TensorPtr Mul(const TensorPtr &x, const TensorPtr &y) {
  if (x->dtype() != kFloat32 || y->dtype() != kFloat32 || x->shape() != y->shape()) {
    throw std::invalid_argument("mul: expected two float32 tensors of one shape");
  }
  TensorPtr xc = x->contiguous(), yc = y->contiguous();
  auto out = std::make_shared<Tensor>(kFloat32, xc->shape());
  bench::MulKernel(xc->data<float>(), yc->data<float>(), out->data<float>(), xc->numel());
  return out;
}

class BenchMul : public Function<BenchMul> {
 public:
  // Mul handles any strides (contiguous() where needed): tensors come as they are. It never writes its
  // inputs, so to_jax's handler lends it JAX's buffers, read-only, without a copy.
  static constexpr bool kAcceptsViews = true;
  static constexpr bool kConstArgs = true;
  static ShapeVector InferShape(const TensorPtr &x, const TensorPtr &) { return x->shape(); }
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y) {
    ctx->SaveForBackward({x, y});
    return Mul(x, y);
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList grads) {
    TensorPtrList saved = ctx->GetSavedTensors();
    TensorPtr gx = ctx->NeedsInputGrad(0) ? Mul(grads[0], saved[1]) : nullptr;
    TensorPtr gy = ctx->NeedsInputGrad(1) ? Mul(grads[0], saved[0]) : nullptr;
    return {gx, gy};
  }
};

}  // namespace bench

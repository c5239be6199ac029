// The opbuilder operator for benchmarks/interop.py's JAX rows: benchmarks/opbuilder_mul.cpp's
// Function (bench::MulKernel) with InferShape and XLA FFI handlers (opbuilder/xla_ffi.h), so
// opbuilder.to_jax runs it as an XLA custom call. Built with include_paths=[jax.ffi.include_dir()].
#include <stdexcept>

#include "mul_kernel.h"
#include "opbuilder/extension.h"
#include "opbuilder/xla_ffi.h"

using namespace opbuilder;

namespace {

TensorPtr Mul(const TensorPtr &x, const TensorPtr &y) {
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

}  // namespace

PYBIND11_MODULE(OB_EXTENSION_NAME, m) {
  m.def("mul", [](const TensorPtr &x, const TensorPtr &y) { return BenchMul::Apply(x, y); });
  m.def("mul_infer_shape", BenchMul::InferShapeFunction());
  OB_XLA_FFI(m, "mul", BenchMul);
}

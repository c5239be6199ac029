// Functions bound with their XLA FFI handlers (opbuilder/xla_ffi.h) for to_jax's custom-call path:
// an elementwise product (float32 or float64), two with two outputs, and one without InferShape
// (to_jax must refuse its handlers). Built with extra_include_paths=[jax.ffi.include_dir()].
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "binding_compat.h"  // py:: is pybind11 or nanobind, as the test builds it
#include "opbuilder/xla_ffi.h"

using namespace opbuilder;

namespace {

template <typename E>
void MulLoop(const TensorPtr &x, const TensorPtr &y, const TensorPtr &out) {
  const E *px = x->data<E>(), *py = y->data<E>();
  E *po = out->data<E>();
  for (std::int64_t i = 0; i < out->numel(); ++i) po[i] = px[i] * py[i];
}

TensorPtr MulTensors(const TensorPtr &x, const TensorPtr &y) {
  if (x->shape() != y->shape() || x->dtype() != y->dtype()) {
    throw std::invalid_argument("mul: x and y must have one shape and dtype");
  }
  auto out = Tensor::empty(x->dtype(), x->shape());
  if (x->dtype() == kFloat32) {
    MulLoop<float>(x, y, out);
  } else if (x->dtype() == kFloat64) {
    MulLoop<double>(x, y, out);
  } else {
    throw std::invalid_argument(std::string("mul: unsupported dtype ") + DataTypeName(x->dtype()));
  }
  return out;
}

// x * y (same shape and dtype)
class Mul : public Function<Mul> {
 public:
  static ShapeVector InferShape(const TensorPtr &x, const TensorPtr &) { return x->shape(); }
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y) {
    ctx->SaveForBackward({x, y});
    return MulTensors(x, y);
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    auto s = ctx->GetSavedTensors();
    return {ctx->NeedsInputGrad(0) ? MulTensors(g[0], s[1]) : nullptr,
            ctx->NeedsInputGrad(1) ? MulTensors(g[0], s[0]) : nullptr};
  }
};

// (sin x, x^3) for float64 x
class SinCube : public Function<SinCube> {
 public:
  static std::vector<ShapeVector> InferShape(const TensorPtr &x) { return {x->shape(), x->shape()}; }
  static TensorPtrList Forward(AutogradContext *ctx, const TensorPtr &x) {
    if (x->dtype() != kFloat64) throw std::invalid_argument("sin_cube: expected float64");
    auto a = Tensor::empty(kFloat64, x->shape()), b = Tensor::empty(kFloat64, x->shape());
    const double *px = x->data<double>();
    for (std::int64_t i = 0; i < x->numel(); ++i) {
      a->data<double>()[i] = std::sin(px[i]);
      b->data<double>()[i] = px[i] * px[i] * px[i];
    }
    ctx->SaveForBackward({x});
    return {a, b};
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    const TensorPtr x = ctx->GetSavedTensors()[0];
    auto gx = Tensor::empty(kFloat64, x->shape());
    const double *px = x->data<double>(), *ga = g[0]->data<double>(), *gb = g[1]->data<double>();
    for (std::int64_t i = 0; i < x->numel(); ++i) {
      gx->data<double>()[i] = ga[i] * std::cos(px[i]) + gb[i] * 3 * px[i] * px[i];
    }
    return {gx};
  }
};

// (2 x, x + 1), float64; its tensors are allocated in the other order (x + 1 first), so in the
// XLA handler each output is built in the other output's result buffer.
class Swapped : public Function<Swapped> {
 public:
  static std::vector<ShapeVector> InferShape(const TensorPtr &x) { return {x->shape(), x->shape()}; }
  static TensorPtrList Forward(AutogradContext *, const TensorPtr &x) {
    if (x->dtype() != kFloat64) throw std::invalid_argument("swapped: expected float64");
    auto plus_one = Tensor::empty(kFloat64, x->shape()), twice = Tensor::empty(kFloat64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) {
      plus_one->data<double>()[i] = x->data<double>()[i] + 1;
      twice->data<double>()[i] = 2 * x->data<double>()[i];
    }
    return {twice, plus_one};
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) {
    auto gx = Tensor::empty(kFloat64, g[0]->shape());
    const double *g0 = g[0]->data<double>(), *g1 = g[1]->data<double>();
    for (std::int64_t i = 0; i < gx->numel(); ++i) gx->data<double>()[i] = 2 * g0[i] + g1[i];
    return {gx};
  }
};

// 1 where Forward runs with the GIL held, else 0 (x's shape, float64): the XLA handler runs without it.
class GilHeld : public Function<GilHeld> {
 public:
  static ShapeVector InferShape(const TensorPtr &x) { return x->shape(); }
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) {
    auto out = Tensor::empty(kFloat64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = PyGILState_Check() ? 1.0 : 0.0;
    return out;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList) { return {nullptr}; }
};

// x * x, with no InferShape (and no gradient)
class Square : public Function<Square> {
 public:
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) { return MulTensors(x, x); }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList) { return {nullptr}; }
};

}  // namespace

OB_MODULE(m) {
  m.def("mul", [](const TensorPtr &x, const TensorPtr &y) { return Mul::Apply(x, y); });
  m.def("mul_infer_shape", Mul::InferShapeFunction());
  OB_XLA_FFI(m, "mul", Mul);
  m.def("sin_cube", [](const TensorPtr &x) { return SinCube::Apply(x); });
  m.def("sin_cube_infer_shape", SinCube::InferShapeFunction());
  OB_XLA_FFI(m, "sin_cube", SinCube);
  m.def("swapped", [](const TensorPtr &x) { return Swapped::Apply(x); });
  m.def("swapped_infer_shape", Swapped::InferShapeFunction());
  OB_XLA_FFI(m, "swapped", Swapped);
  m.def("gil_held", [](const TensorPtr &x) { return GilHeld::Apply(x); });
  m.def("gil_held_infer_shape", GilHeld::InferShapeFunction());
  OB_XLA_FFI(m, "gil_held", GilHeld);
  m.def("square", [](const TensorPtr &x) { return Square::Apply(x); });
  OB_XLA_FFI(m, "square", Square);
}

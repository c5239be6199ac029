// Test operators for in-place writes through Function<T> (tests/test_inplace_views.py, the torch bridge's
// tests): MarkDirty on views of a base, refusals decided before Forward, an argument returned unchanged,
// double backward, saved tensors under saved_tensors_hooks.
#include <cmath>
#include <cstdint>
#include <string>

#include "binding_compat.h"  // py:: is pybind11 or nanobind, as the test builds it

using namespace opbuilder;

namespace {

// Every element of `x` (float64, any strides, host) multiplied by k, in place.
void ScaleStrided(const TensorPtr &x, double k) {
  const ShapeVector shape = x->shape(), strides = x->strides();
  double *base = static_cast<double *>(x->data_ptr());
  std::vector<std::int64_t> idx(shape.size(), 0);
  for (std::int64_t n = 0; n < x->numel(); ++n) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) off += idx[d] * strides[d];
    base[off] *= k;
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

TensorPtr Scaled(const TensorPtr &g, double k) {
  TensorPtr gc = g->contiguous();
  auto out = std::make_shared<Tensor>(kFloat64, gc->shape());
  for (std::int64_t i = 0; i < gc->numel(); ++i) out->data<double>()[i] = gc->data<double>()[i] * k;
  return out;
}

// x *= k in place (MarkDirty), returns x; float64.
struct ScaleInplace : Function<ScaleInplace> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, double k) {
    ScaleStrided(x, k);
    ctx->MarkDirty({x});
    ctx->saved_data["k"] = k;
    return x;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    return {Scaled(g[0], ctx->saved_data["k"].cast<double>()), nullptr};
  }
};

// The same, given the caller's tensor as it is (any strides, read-only or stride-0 memory included).
struct ScaleInplaceViews : Function<ScaleInplaceViews> {
  static constexpr bool kAcceptsViews = true;
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, double k) {
    ScaleStrided(x, k);
    ctx->MarkDirty({x});
    ctx->saved_data["k"] = k;
    return x;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    return {Scaled(g[0], ctx->saved_data["k"].cast<double>()), nullptr};
  }
};

// x *= k in place, MarkDirty'd only after the write (the order most kernels use).
struct ScaleThenMark : Function<ScaleThenMark> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, double k) {
    ScaleStrided(x, k);
    ctx->MarkDirty({x});
    return x;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0], nullptr}; }
};

// x += y in place (MarkDirty), returns x; float64, one shape.
struct AddInplace : Function<AddInplace> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y) {
    TensorPtr yc = y->contiguous();
    for (std::int64_t i = 0; i < x->numel(); ++i) x->data<double>()[i] += yc->data<double>()[i];
    ctx->MarkDirty({x});
    return x;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0], g[0]}; }
};

// Returns its argument unchanged (no MarkDirty).
struct Identity : Function<Identity> {
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) { return x; }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0]}; }
};

// x * x (float64); Backward 2 * x * g, computed in C++.
struct Square : Function<Square> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    ctx->SaveForBackward({x});
    TensorPtr xc = x->contiguous();
    auto out = std::make_shared<Tensor>(kFloat64, xc->shape());
    for (std::int64_t i = 0; i < xc->numel(); ++i) out->data<double>()[i] = xc->data<double>()[i] * xc->data<double>()[i];
    return out;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    TensorPtr x = ctx->GetSavedTensors()[0]->contiguous(), gc = g[0]->contiguous();
    auto out = std::make_shared<Tensor>(kFloat64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = 2 * x->data<double>()[i] * gc->data<double>()[i];
    return {out};
  }
};

// x *= k in place (MarkDirty) and a second output, 2 * x: two outputs.
struct ScaleAndDouble : Function<ScaleAndDouble> {
  static TensorPtrList Forward(AutogradContext *ctx, const TensorPtr &x, double k) {
    ScaleStrided(x, k);
    ctx->MarkDirty({x});
    ctx->saved_data["k"] = k;
    return {x, Scaled(x, 2)};
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    const double k = ctx->saved_data["k"].cast<double>();
    TensorPtr a = Scaled(g[0], k), b = Scaled(g[1], 2 * k);
    for (std::int64_t i = 0; i < a->numel(); ++i) a->data<double>()[i] += b->data<double>()[i];
    return {a, nullptr};
  }
};

// x * y (float64, same shape), saving both inputs: Backward reads them from GetSavedTensors.
struct MulSaved : Function<MulSaved> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y) {
    ctx->SaveForBackward({x, y});
    TensorPtr xc = x->contiguous(), yc = y->contiguous();
    auto out = std::make_shared<Tensor>(kFloat64, xc->shape());
    for (std::int64_t i = 0; i < xc->numel(); ++i) out->data<double>()[i] = xc->data<double>()[i] * yc->data<double>()[i];
    return out;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    TensorPtrList s = ctx->GetSavedTensors();
    TensorPtr gc = g[0]->contiguous(), a = s[0]->contiguous(), b = s[1]->contiguous();
    auto gx = std::make_shared<Tensor>(kFloat64, gc->shape()), gy = std::make_shared<Tensor>(kFloat64, gc->shape());
    for (std::int64_t i = 0; i < gc->numel(); ++i) {
      gx->data<double>()[i] = gc->data<double>()[i] * b->data<double>()[i];
      gy->data<double>()[i] = gc->data<double>()[i] * a->data<double>()[i];
    }
    return {gx, gy};
  }
};

// exp(x) (float64), saving its output.
struct ExpSavesOutput : Function<ExpSavesOutput> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    TensorPtr xc = x->contiguous();
    auto out = std::make_shared<Tensor>(kFloat64, xc->shape());
    for (std::int64_t i = 0; i < xc->numel(); ++i) out->data<double>()[i] = std::exp(xc->data<double>()[i]);
    ctx->SaveForBackward({out});
    return out;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    TensorPtr gc = g[0]->contiguous(), o = ctx->GetSavedTensors()[0]->contiguous();
    auto gx = std::make_shared<Tensor>(kFloat64, gc->shape());
    for (std::int64_t i = 0; i < gc->numel(); ++i) gx->data<double>()[i] = gc->data<double>()[i] * o->data<double>()[i];
    return {gx};
  }
};

}  // namespace

OB_MODULE(m) {
  m.def("scale_", [](const TensorPtr &x, double k) { return ScaleInplace::Apply(x, k); });
  m.def("scale_views_", [](const TensorPtr &x, double k) { return ScaleInplaceViews::Apply(x, k); });
  m.def("scale_then_mark", [](const TensorPtr &x, double k) { return ScaleThenMark::Apply(x, k); });
  m.def("add_", [](const TensorPtr &x, const TensorPtr &y) { return AddInplace::Apply(x, y); });
  m.def("identity", [](const TensorPtr &x) { return Identity::Apply(x); });
  m.def("square", [](const TensorPtr &x) { return Square::Apply(x); });
  m.def("scale_and_double_", [](const TensorPtr &x, double k) { return ScaleAndDouble::Apply(x, k); });
  m.def("mul_saved", [](const TensorPtr &x, const TensorPtr &y) { return MulSaved::Apply(x, y); });
  m.def("exp_saves_output", [](const TensorPtr &x) { return ExpSavesOutput::Apply(x); });
}

// Test operators for to_torch's C++ bridge (tests/test_torch_bridge_semantics.py): an in-place exp that
// saves its result, and operators whose outputs are their argument (views of it, as torch makes them).
#include <cmath>
#include <cstdint>
#include <vector>

#include "binding_compat.h"  // py:: is pybind11 or nanobind, as the test builds it

using namespace opbuilder;

namespace {

// exp of every element of `x` (float64, any strides, host), in place.
void ExpStrided(const TensorPtr &x) {
  const ShapeVector shape = x->shape(), strides = x->strides();
  double *base = static_cast<double *>(x->data_ptr());
  std::vector<std::int64_t> idx(shape.size(), 0);
  for (std::int64_t n = 0; n < x->numel(); ++n) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) off += idx[d] * strides[d];
    base[off] = std::exp(base[off]);
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

// x = exp(x) in place (MarkDirty), saving x (its result), as torch's exp_ saves its result.
struct ExpInplace : Function<ExpInplace> {
  static constexpr bool kAcceptsViews = true;
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    ExpStrided(x);
    ctx->MarkDirty({x});
    ctx->SaveForBackward({x});
    return x;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    TensorPtr gc = g[0]->contiguous(), o = ctx->GetSavedTensors()[0]->contiguous();
    auto gx = std::make_shared<Tensor>(kFloat64, gc->shape());
    for (std::int64_t i = 0; i < gc->numel(); ++i) gx->data<double>()[i] = gc->data<double>()[i] * o->data<double>()[i];
    return {gx};
  }
};

// x, unchanged.
struct Ident : Function<Ident> {
  static constexpr bool kAcceptsViews = true;
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) { return x; }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0]}; }
};

// (x, x), unchanged: two outputs over the argument.
struct Pair : Function<Pair> {
  static constexpr bool kAcceptsViews = true;
  static TensorPtrList Forward(AutogradContext *, const TensorPtr &x) { return {x, x}; }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) {
    auto out = std::make_shared<Tensor>(kFloat64, (g[0] ? g[0] : g[1])->shape());
    TensorPtr a = g[0] ? g[0]->contiguous() : nullptr, b = g[1] ? g[1]->contiguous() : nullptr;
    for (std::int64_t i = 0; i < out->numel(); ++i) {
      out->data<double>()[i] = (a ? a->data<double>()[i] : 0.0) + (b ? b->data<double>()[i] : 0.0);
    }
    return {out};
  }
};

}  // namespace

OB_MODULE(m) {
  m.def("exp_", [](const TensorPtr &x) { return ExpInplace::Apply(x); });
  m.def("ident", [](const TensorPtr &x) { return Ident::Apply(x); });
  m.def("pair", [](const TensorPtr &x) { return Pair::Apply(x); });
}

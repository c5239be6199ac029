// The route-parity operators (tests/test_route_parity.py): one op of each kind that the rules of an op
// call are about, run through every route with the same inputs.
//   mul(x, y)       a plain Function that saves its inputs (version checks of saved tensors)
//   scale_(x)       MarkDirty: x *= 3 in place, returns x (writable inputs, views, refusals)
//   ident(x)        returns its input unchanged (an output aliasing an input)
//   dup(x)          returns one new tensor, 2x, as both of its outputs (torch: one object, one counter)
//   scale_twice_(x) MarkDirty: x *= 3 in place, returns x as both of its outputs
//   head(x)         x[:2] of a 1-d x, a view Forward builds on x's storage (torch: a view of x)
//   y_and_head(x)   y = 2x and y[:2], a view of its first output (torch: a view of y)
//   scale_head_(x)  MarkDirty: x *= 3 in place, returns x and a view of x[:2]
//   tail_and_y(x)   y[2:] and y = 2x: its first output a view of its second (torch: a view of y)
//   reversed(x)     x[::-1] of a 1-d x, a view with a negative stride (torch has none: a copy there)
//   add_sq_(x, y)   MarkDirty: x += y * y in place, returns x, saves y (add_sq_(x, x): the saved argument is
//                   the written one)
// Built with PARITY_FFI (and XLA's FFI headers on the include path), the Functions also get XLA FFI
// handlers for to_jax's custom-call route.
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "opbuilder/extension.h"
#ifdef PARITY_FFI
#include "opbuilder/xla_ffi.h"
#endif

using namespace opbuilder;

namespace {

void CheckFloat64(const TensorPtr &x, const char *who) {
  if (x->dtype() != kFloat64) throw std::invalid_argument(std::string(who) + ": expected float64");
}

// out[i] = x[i] * y[i], walking each tensor's strides (so views come as they are)
TensorPtr MulInto(const TensorPtr &x, const TensorPtr &y) {
  CheckFloat64(x, "mul");
  CheckFloat64(y, "mul");
  if (x->shape() != y->shape()) throw std::invalid_argument("mul: x and y must have one shape");
  auto xc = x->contiguous(), yc = y->contiguous();
  auto out = Tensor::empty(kFloat64, x->shape());
  const double *px = xc->data<double>(), *py = yc->data<double>();
  double *po = out->data<double>();
  for (std::int64_t i = 0; i < out->numel(); ++i) po[i] = px[i] * py[i];
  return out;
}

// x[i] *= a for every element of x, strides included
void ScaleInPlace(const TensorPtr &x, double a) {
  CheckFloat64(x, "scale_");
  const auto &shape = x->shape();
  const auto &strides = x->strides();
  double *base = static_cast<double *>(x->data_ptr());
  const std::int64_t n = x->numel();
  for (std::int64_t flat = 0; flat < n; ++flat) {
    std::int64_t rest = flat, offset = 0;
    for (std::int64_t d = static_cast<std::int64_t>(shape.size()) - 1; d >= 0; --d) {
      offset += (rest % shape[d]) * strides[d];
      rest /= shape[d];
    }
    base[offset] *= a;
  }
}

TensorPtr Scaled(const TensorPtr &g, double a) {
  auto gc = g->contiguous();
  auto out = Tensor::empty(kFloat64, g->shape());
  const double *pg = gc->data<double>();
  double *po = out->data<double>();
  for (std::int64_t i = 0; i < out->numel(); ++i) po[i] = pg[i] * a;
  return out;
}

// (g[0] + g[1]) * a: the gradient of an op whose two outputs are a * x
TensorPtr ScaledSum(const TensorPtrList &g, double a) {
  auto out = Scaled(g[0], a), b = Scaled(g[1], a);
  double *po = out->data<double>();
  const double *pb = b->data<double>();
  for (std::int64_t i = 0; i < out->numel(); ++i) po[i] += pb[i];
  return out;
}

}  // namespace

class ParityMul : public Function<ParityMul> {
 public:
  static constexpr bool kAcceptsViews = true;
  static ShapeVector InferShape(const TensorPtr &x, const TensorPtr &) { return x->shape(); }
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y) {
    ctx->SaveForBackward({x, y});
    return MulInto(x, y);
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    auto s = ctx->GetSavedTensors();
    return {ctx->NeedsInputGrad(0) ? MulInto(g[0], s[1]) : nullptr,
            ctx->NeedsInputGrad(1) ? MulInto(g[0], s[0]) : nullptr};
  }
};

class ParityScale : public Function<ParityScale> {
 public:
  static constexpr bool kAcceptsViews = true;
  static constexpr double kFactor = 3.0;
  static ShapeVector InferShape(const TensorPtr &x) { return x->shape(); }
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    ScaleInPlace(x, kFactor);
    ctx->MarkDirty({x});
    return x;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {Scaled(g[0], kFactor)}; }
};

class ParityIdent : public Function<ParityIdent> {
 public:
  static constexpr bool kAcceptsViews = true;
  static ShapeVector InferShape(const TensorPtr &x) { return x->shape(); }
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) { return x; }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0]}; }
};

class ParityDup : public Function<ParityDup> {
 public:
  static TensorPtrList Forward(AutogradContext *, const TensorPtr &x) {
    auto y = Scaled(x, 2.0);
    return {y, y};
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {ScaledSum(g, 2.0)}; }
};

class ParityScaleTwice : public Function<ParityScaleTwice> {
 public:
  static TensorPtrList Forward(AutogradContext *ctx, const TensorPtr &x) {
    ScaleInPlace(x, 3.0);
    ctx->MarkDirty({x});
    return {x, x};
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {ScaledSum(g, 3.0)}; }
};

// t[:2] of a 1-d t: a Tensor built on t's storage
TensorPtr HeadOf(const TensorPtr &t) {
  if (t->ndim() != 1 || t->numel() < 2) throw std::invalid_argument("head: expected a 1-d tensor of 2 or more");
  return std::make_shared<Tensor>(t->dtype(), ShapeVector{2}, ShapeVector{t->strides()[0]}, t->data_ptr(),
                                  t->storage(), t->is_writable());
}

// g (2 elements) into the first two of n zeros
TensorPtr PadHead(const TensorPtr &g, std::int64_t n) {
  auto gx = Tensor::zeros(kFloat64, {n});
  auto gc = g->contiguous();
  for (int i = 0; i < 2; ++i) gx->data<double>()[i] = gc->data<double>()[i];
  return gx;
}

class ParityHead : public Function<ParityHead> {
 public:
  static constexpr bool kAcceptsViews = true;
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    ctx->saved_data["n"] = x->numel();
    return HeadOf(x);
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    return {PadHead(g[0], ctx->saved_data["n"].cast<std::int64_t>())};
  }
};

class ParityYAndHead : public Function<ParityYAndHead> {
 public:
  static TensorPtrList Forward(AutogradContext *, const TensorPtr &x) {
    auto y = Scaled(x, 2.0);
    return {y, HeadOf(y)};
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) {
    auto gx = Scaled(g[0], 2.0), gh = Scaled(PadHead(g[1], g[0]->numel()), 2.0);
    for (std::int64_t i = 0; i < gx->numel(); ++i) gx->data<double>()[i] += gh->data<double>()[i];
    return {gx};
  }
};

class ParityTailAndY : public Function<ParityTailAndY> {
 public:
  static TensorPtrList Forward(AutogradContext *, const TensorPtr &x) {
    auto y = Scaled(x, 2.0);
    if (y->numel() < 2) throw std::invalid_argument("tail_and_y: expected 2 or more elements");
    auto tail = std::make_shared<Tensor>(kFloat64, ShapeVector{y->numel() - 2}, ShapeVector{},
                                         y->data<double>() + 2, y->storage());
    return {tail, y};
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) {
    auto gx = Scaled(g[1], 2.0), gt = g[0]->contiguous();
    for (std::int64_t i = 0; i < gt->numel(); ++i) gx->data<double>()[i + 2] += 2.0 * gt->data<double>()[i];
    return {gx};
  }
};

class ParityReversed : public Function<ParityReversed> {
 public:
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) {
    auto c = x->contiguous();  // (a strided x reaches Forward as a private copy: no kAcceptsViews)
    if (c->ndim() != 1 || c->numel() == 0) throw std::invalid_argument("reversed: expected a non-empty 1-d x");
    return std::make_shared<Tensor>(kFloat64, ShapeVector{c->numel()}, ShapeVector{-1},
                                    c->data<double>() + (c->numel() - 1), c->storage(), c->is_writable());
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) {
    auto gc = g[0]->contiguous();
    auto gx = Tensor::empty(kFloat64, gc->shape());
    const std::int64_t n = gc->numel();
    for (std::int64_t i = 0; i < n; ++i) gx->data<double>()[i] = gc->data<double>()[n - 1 - i];
    return {gx};
  }
};

class ParityScaleHead : public Function<ParityScaleHead> {
 public:
  static constexpr bool kAcceptsViews = true;
  static TensorPtrList Forward(AutogradContext *ctx, const TensorPtr &x) {
    ScaleInPlace(x, 3.0);
    ctx->MarkDirty({x});
    return {x, HeadOf(x)};
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) {
    auto gx = Scaled(g[0], 3.0), gh = Scaled(PadHead(g[1], g[0]->numel()), 3.0);
    for (std::int64_t i = 0; i < gx->numel(); ++i) gx->data<double>()[i] += gh->data<double>()[i];
    return {gx};
  }
};

// x += y * y in place (MarkDirty), y saved: its gradient 2 g y reads the saved y
class ParityAddSq : public Function<ParityAddSq> {
 public:
  static constexpr bool kAcceptsViews = true;
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y) {
    auto sq = MulInto(y, y);  // y read before x is written (they may be one tensor)
    if (!x->is_contiguous() || sq->shape() != x->shape()) throw std::invalid_argument("add_sq_: x dense, y's shape");
    for (std::int64_t i = 0; i < x->numel(); ++i) x->data<double>()[i] += sq->data<double>()[i];
    ctx->MarkDirty({x});
    ctx->SaveForBackward({y});
    return x;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    auto y = ctx->GetSavedTensors()[0];
    return {g[0], ctx->NeedsInputGrad(1) ? Scaled(MulInto(g[0], y), 2.0) : nullptr};
  }
};

// add_sq_ without kAcceptsViews: a strided argument reaches Forward as a private contiguous copy
class ParityAddSqDense : public Function<ParityAddSqDense> {
 public:
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y) {
    return ParityAddSq::Forward(ctx, x, y);
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    return ParityAddSq::Backward(ctx, std::move(g));
  }
};

// writes v (MarkDirty) and, undeclared, b's first element: a write the view does not explain
class ParitySneaky : public Function<ParitySneaky> {
 public:
  static constexpr bool kAcceptsViews = true;
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &b, const TensorPtr &v) {
    ScaleInPlace(v, 3.0);
    static_cast<double *>(b->data_ptr())[0] += 100.0;
    ctx->MarkDirty({v});
    return v;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {nullptr, Scaled(g[0], 3.0)}; }
};

// The elements of a 1-d x that are > 0, in order: the output's shape depends on x's values
class ParityPositives : public Function<ParityPositives> {
 public:
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    CheckFloat64(x, "positives");
    auto xc = x->contiguous();
    const double *px = xc->data<double>();
    std::int64_t n = 0;
    for (std::int64_t i = 0; i < xc->numel(); ++i) n += px[i] > 0 ? 1 : 0;
    auto out = Tensor::empty(kFloat64, {n});
    for (std::int64_t i = 0, k = 0; i < xc->numel(); ++i) {
      if (px[i] > 0) out->data<double>()[k++] = px[i];
    }
    ctx->SaveForBackward({x});
    return out;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    auto xc = ctx->GetSavedTensors()[0]->contiguous();
    auto gc = g[0]->contiguous();
    if (gc->numel() > xc->numel()) throw std::invalid_argument("positives: a gradient larger than x");
    auto gx = Tensor::zeros(kFloat64, xc->shape());
    for (std::int64_t i = 0, k = 0; i < xc->numel(); ++i) {
      if (xc->data<double>()[i] > 0) gx->data<double>()[i] = gc->data<double>()[k++];
    }
    return {gx};
  }
};

// 1 / x, refusing a zero element (as a log refuses one): a run on zeros raises
class ParityRecip : public Function<ParityRecip> {
 public:
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    CheckFloat64(x, "recip");
    auto xc = x->contiguous();
    auto out = Tensor::empty(kFloat64, xc->shape());
    for (std::int64_t i = 0; i < xc->numel(); ++i) {
      if (xc->data<double>()[i] == 0) throw std::domain_error("recip: a zero element");
      out->data<double>()[i] = 1.0 / xc->data<double>()[i];
    }
    ctx->SaveForBackward({out});
    return out;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    auto r = ctx->GetSavedTensors()[0];
    auto gx = Scaled(MulInto(MulInto(g[0], r), r), -1.0);
    return {gx};
  }
};

// (x * w, x): x saved and returned as it came (an alias of the caller's x)
class ParityMulRetX : public Function<ParityMulRetX> {
 public:
  static TensorPtrList Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &w) {
    ctx->SaveForBackward({x, w});
    return {MulInto(x, w), x};
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    auto s = ctx->GetSavedTensors();
    return {ctx->NeedsInputGrad(0) ? MulInto(g[0], s[1]) : nullptr, MulInto(g[0], s[0])};
  }
};

// mul without kAcceptsViews: read-only or strided arguments reach Forward as private copies
class ParityMulDense : public Function<ParityMulDense> {
 public:
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y) {
    return ParityMul::Forward(ctx, x, y);
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) { return ParityMul::Backward(ctx, g); }
};

// (x * w, x[:2]): x saved, a view of it Forward built on its storage returned
class ParityMulRetHead : public Function<ParityMulRetHead> {
 public:
  static TensorPtrList Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &w) {
    ctx->SaveForBackward({x, w});
    return {MulInto(x, w), HeadOf(x)};
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    return ParityMulRetX::Backward(ctx, {g[0]});
  }
};

// exp(x), its output saved: Backward reads the output as Forward made it
class ParityExpSaved : public Function<ParityExpSaved> {
 public:
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    auto out = Tensor::empty(kFloat64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = std::exp(x->data<double>()[i]);
    ctx->SaveForBackward({out});
    return out;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    return {MulInto(g[0], ctx->GetSavedTensors()[0])};
  }
};

// x += 1, then x += y for each y of ys, in place (MarkDirty), without kAcceptsViews: a strided x and a
// strided list element reach Forward as private contiguous copies; the same memory in both is one copy,
// so the list sees x's first write, as torch's x.add_(1); x.add_(y) does when y is x
class ParityBumpAddDense : public Function<ParityBumpAddDense> {
 public:
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtrList &ys) {
    double *px = x->data<double>();
    for (std::int64_t i = 0; i < x->numel(); ++i) px[i] += 1.0;
    for (const auto &y : ys) {
      if (y->shape() != x->shape() || !y->is_contiguous()) throw std::invalid_argument("bump_add_: y's shape");
      const double *py = y->data<double>();
      for (std::int64_t i = 0; i < x->numel(); ++i) px[i] += py[i];
    }
    ctx->MarkDirty({x});
    return x;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0], nullptr}; }
};

// x += y in place with x the second argument (MarkDirty): a view written at a position after the first
class ParityAddInto : public Function<ParityAddInto> {
 public:
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &y, const TensorPtr &x) {
    CheckFloat64(x, "add_into_");
    CheckFloat64(y, "add_into_");
    if (x->shape() != y->shape()) throw std::invalid_argument("add_into_: x and y must have one shape");
    const double *py = y->data<double>();
    double *px = x->data<double>();
    for (std::int64_t i = 0; i < x->numel(); ++i) px[i] += py[i];
    ctx->MarkDirty({x});
    return x;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0], g[0]}; }
};

OB_MODULE(m) {
  m.def("mul", [](const TensorPtr &x, const TensorPtr &y) { return ParityMul::Apply(x, y); });
  m.def("mul_infer_shape", ParityMul::InferShapeFunction());
  m.def("scale_", [](const TensorPtr &x) { return ParityScale::Apply(x); });
  m.def("scale__infer_shape", ParityScale::InferShapeFunction());
  m.def("ident", [](const TensorPtr &x) { return ParityIdent::Apply(x); });
  // an argument returned as it came, beside a Function's output or alone (no Function around it)
  m.def("sq_and_x", [](const TensorPtr &x) { return TensorPtrList{ParityMul::Apply(x, x), x}; });
  m.def("just_x", [](const TensorPtr &x) { return x; });
  m.def("x_twice", [](const TensorPtr &x) { return TensorPtrList{x, x}; });
  m.def("head_alias", [](const TensorPtr &x) {  // a Tensor of its own over x's first two elements
    return std::make_shared<Tensor>(x->dtype(), ShapeVector{2}, ShapeVector{x->strides()[0]}, x->data_ptr(),
                                    x->storage());
  });
  m.def("second_mid", [](const TensorPtr &, const TensorPtr &y) {  // y's elements 1 and 2 (y contiguous)
    return std::make_shared<Tensor>(y->dtype(), ShapeVector{2}, ShapeVector{1},
                                    static_cast<double *>(y->data_ptr()) + 1, y->storage());
  });
  m.def("reversed_alias", [](const TensorPtr &x) {  // x's elements last to first (x contiguous, 1-d)
    return std::make_shared<Tensor>(x->dtype(), x->shape(), ShapeVector{-1},
                                    static_cast<double *>(x->data_ptr()) + x->numel() - 1, x->storage());
  });
  m.def("windows", [](const TensorPtr &x) {  // x's overlapping pairs, (n - 1, 2), strides (1, 1) (x contiguous, 1-d)
    return std::make_shared<Tensor>(x->dtype(), ShapeVector{x->numel() - 1, 2}, ShapeVector{1, 1}, x->data_ptr(),
                                    x->storage());
  });
  m.def("square_if_positive", [](const TensorPtr &x) {  // x * x when x's first element is positive, else zeros
    if (static_cast<const double *>(x->data_ptr())[0] > 0) return ParityMul::Apply(x, x);
    return Tensor::zeros(x->dtype(), x->shape());
  });
  m.def("head_of_first", [](const TensorPtrList &xs) {  // xs[0]'s first two elements
    return std::make_shared<Tensor>(xs[0]->dtype(), ShapeVector{2}, ShapeVector{xs[0]->strides()[0]},
                                    xs[0]->data_ptr(), xs[0]->storage());
  });
  m.def("scale_then_head", [](const TensorPtr &x) {  // x written (MarkDirty), then its first two elements
    ParityScale::Apply(x);
    return std::make_shared<Tensor>(x->dtype(), ShapeVector{2}, ShapeVector{x->strides()[0]}, x->data_ptr(),
                                    x->storage());
  });
  m.def("exp_saved", [](const TensorPtr &x) { return ParityExpSaved::Apply(x); });
  m.def("mul_dense", [](const TensorPtr &x, const TensorPtr &y) { return ParityMulDense::Apply(x, y); });
  m.def("mul_ret_x", [](const TensorPtr &x, const TensorPtr &w) { return ParityMulRetX::Apply(x, w); });
  m.def("mul_ret_head", [](const TensorPtr &x, const TensorPtr &w) { return ParityMulRetHead::Apply(x, w); });
  m.def("positives", [](const TensorPtr &x) { return ParityPositives::Apply(x); });
  m.def("recip", [](const TensorPtr &x) { return ParityRecip::Apply(x); });
  m.def("scale_then_x", [](const TensorPtr &x) {  // x written in place by a Function, then returned itself
    ParityScale::Apply(x);
    return x;
  });
  m.def("ident_infer_shape", ParityIdent::InferShapeFunction());
  m.def("dup", [](const TensorPtr &x) { return ParityDup::Apply(x); });
  m.def("scale_twice_", [](const TensorPtr &x) { return ParityScaleTwice::Apply(x); });
  m.def("head", [](const TensorPtr &x) { return ParityHead::Apply(x); });
  m.def("y_and_head", [](const TensorPtr &x) { return ParityYAndHead::Apply(x); });
  m.def("scale_head_", [](const TensorPtr &x) { return ParityScaleHead::Apply(x); });
  m.def("tail_and_y", [](const TensorPtr &x) { return ParityTailAndY::Apply(x); });
  m.def("reversed", [](const TensorPtr &x) { return ParityReversed::Apply(x); });
  m.def("add_sq_", [](const TensorPtr &x, const TensorPtr &y) { return ParityAddSq::Apply(x, y); });
  m.def("add_sq_dense_", [](const TensorPtr &x, const TensorPtr &y) { return ParityAddSqDense::Apply(x, y); });
  m.def("bump_add_dense_", [](const TensorPtr &x, const TensorPtrList &ys) { return ParityBumpAddDense::Apply(x, ys); });
  // two Functions in one bound function: x written in place (not returned), then x * y; and y = x * w
  // written in place and returned (an intermediate the first Apply made)
  m.def("scale_then_mul", [](const TensorPtr &x, const TensorPtr &y) {
    return ParityMul::Apply(ParityScale::Apply(x), y);
  });
  m.def("mul_then_scale", [](const TensorPtr &x, const TensorPtr &w) {
    return ParityScale::Apply(ParityMul::Apply(x, w));
  });
  // the write alone, with a plain result; the same argument written twice; a write that makes x depend on y
  m.def("scale_void", [](const TensorPtr &x) { ParityScale::Apply(x); });
  m.def("scale_num", [](const TensorPtr &x) {
    ParityScale::Apply(x);
    return 1.5;
  });
  m.def("scale_twice_then_mul", [](const TensorPtr &x, const TensorPtr &y) {
    ParityScale::Apply(x);
    ParityScale::Apply(x);
    return ParityMul::Apply(x, y);
  });
  m.def("scale_then_throw", [](const TensorPtr &x) -> TensorPtr {
    ParityScale::Apply(x);
    throw std::invalid_argument("scale_then_throw: after the write");
  });
  m.def("scale_second_void", [](const TensorPtr &, const TensorPtr &b) { ParityScale::Apply(b); });
  m.def("scale_both_void", [](const TensorPtr &a, const TensorPtr &b) {
    ParityScale::Apply(a);
    ParityScale::Apply(b);
  });
  m.def("scale_then_add_sq_void", [](const TensorPtr &x, const TensorPtr &y) {
    ParityScale::Apply(x);
    ParityAddSq::Apply(y, x);
  });
  m.def("scale_then_other", [](const TensorPtr &a, const TensorPtr &b) {  // b returned as it came
    ParityScale::Apply(a);
    return b;
  });
  m.def("add_into_", [](const TensorPtr &y, const TensorPtr &x) { return ParityAddInto::Apply(y, x); });
  m.def("sneaky_", [](const TensorPtr &b, const TensorPtr &v) { return ParitySneaky::Apply(b, v); });
  m.def("add_sq_then_mul", [](const TensorPtr &x, const TensorPtr &y) {
    ParityAddSq::Apply(x, y);
    return ParityMul::Apply(x, y);
  });
#ifdef PARITY_FFI
  OB_XLA_FFI(m, "mul", ParityMul);
  OB_XLA_FFI(m, "scale_", ParityScale);
#endif
}

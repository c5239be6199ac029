// Functions bound with their XLA FFI handlers (opbuilder/xla_ffi.h) for to_jax's custom-call path:
// an elementwise product (float32 or float64), two with two outputs, and one without InferShape
// (to_jax must refuse its handlers); for issue 33: an in-place op (MarkDirty), one that writes an
// input it does not return, a complex op with torch's gradient convention, one that uses
// ctx->saved_data and one with an int64 output; Functions taking views (kAcceptsViews) that write
// in place (with MarkDirty, without it, only when the gradient's rerun records, only for some values,
// the cotangent in Backward) and one that reports where its input is. Built with extra_include_paths=[jax.ffi.include_dir()].
#include <cmath>
#include <complex>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
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

// x += 1 in place (float64), marked dirty and returned: under JAX it must run on a copy.
class AddOneInPlace : public Function<AddOneInPlace> {
 public:
  static ShapeVector InferShape(const TensorPtr &x) { return x->shape(); }
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    if (x->dtype() != kFloat64) throw std::invalid_argument("add_one_: expected float64");
    double *p = x->data<double>();
    for (std::int64_t i = 0; i < x->numel(); ++i) p[i] += 1;
    ctx->MarkDirty({x});
    return x;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0]}; }
};

// x += 1 in place (float64, marked dirty and returned) by a Function that takes XLA's buffers as they
// are (kAcceptsViews). It writes only writable memory, as such a Function must; the handler gives it
// writable private copies, since its type writes. Its second output says whether x was writable (1)
// or read-only (0).
class AddOneViews : public Function<AddOneViews> {
 public:
  static constexpr bool kAcceptsViews = true;
  static std::vector<ShapeVector> InferShape(const TensorPtr &x) { return {x->shape(), ShapeVector{}}; }
  static TensorPtrList Forward(AutogradContext *ctx, const TensorPtr &x) {
    if (x->dtype() != kFloat64 || !x->is_contiguous()) throw std::invalid_argument("add_one_views: float64");
    auto writable = Tensor::empty(kFloat64, {});
    writable->data<double>()[0] = x->is_writable() ? 1.0 : 0.0;
    if (x->is_writable()) {
      for (std::int64_t i = 0; i < x->numel(); ++i) x->data<double>()[i] += 1;
    }
    if (x->numel() > 0) ctx->MarkDirty({x});
    return {x, writable};
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0]}; }
};

// x + 1 as a new tensor, after marking x dirty without returning it: refused on every route.
class DirtyNotReturned : public Function<DirtyNotReturned> {
 public:
  static ShapeVector InferShape(const TensorPtr &x) { return x->shape(); }
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    if (x->dtype() != kFloat64) throw std::invalid_argument("dirty_not_returned: expected float64");
    auto out = Tensor::empty(kFloat64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = x->data<double>()[i] + 1;
    ctx->MarkDirty({x});
    return out;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0]}; }
};

// 3 x (float64), after overwriting its input with 3 x (no MarkDirty: a misbehaving kernel), then
// reading it back: the write must not reach the caller's array.
class TripleScratch : public Function<TripleScratch> {
 public:
  static ShapeVector InferShape(const TensorPtr &x) { return x->shape(); }
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) {
    if (x->dtype() != kFloat64) throw std::invalid_argument("triple_scratch: expected float64");
    double *p = x->data<double>();
    for (std::int64_t i = 0; i < x->numel(); ++i) p[i] *= 3;
    auto out = Tensor::empty(kFloat64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = p[i];
    return out;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) {
    auto gx = Tensor::empty(kFloat64, g[0]->shape());
    for (std::int64_t i = 0; i < gx->numel(); ++i) gx->data<double>()[i] = 3 * g[0]->data<double>()[i];
    return {gx};
  }
};

// x[i] *= 3 through data_ptr() whether or not x is writable (a kernel that ignores is_writable(), as
// an in-place op written for the runtime's writable tensors does), marked dirty and returned; float64.
void TripleInPlace(const TensorPtr &x, const char *who) {
  if (x->dtype() != kFloat64 || !x->is_contiguous()) throw std::invalid_argument(std::string(who) + ": float64");
  double *p = x->data<double>();
  for (std::int64_t i = 0; i < x->numel(); ++i) p[i] *= 3;
}

TensorPtr Tripled(const TensorPtr &t) {
  if (t->dtype() != kFloat64) throw std::invalid_argument("tripled: expected float64");
  const TensorPtr g = t->contiguous();
  auto out = Tensor::empty(kFloat64, g->shape());
  for (std::int64_t i = 0; i < out->numel(); ++i) out->data<double>()[i] = 3 * g->data<double>()[i];
  return out;
}

// x *= 3 in place, marked dirty, by a Function taking views: on a JAX array without to_jax's
// mutates it writes a private copy, whose values are the output; never the caller's array.
class ScaleViews : public Function<ScaleViews> {
 public:
  static constexpr bool kAcceptsViews = true;
  static ShapeVector InferShape(const TensorPtr &x) { return x->shape(); }
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    TripleInPlace(x, "scale_views");
    ctx->MarkDirty({x});
    return x;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {Tripled(g[0])}; }
};

// 3 x: a new tensor while no gradient is recorded; while one is (ctx->NeedsInputGrad(0), as in the
// backward handler's rerun of Forward) x *= 3 in place, marked dirty. Takes views.
class ScaleViewsWhenGrad : public Function<ScaleViewsWhenGrad> {
 public:
  static constexpr bool kAcceptsViews = true;
  static ShapeVector InferShape(const TensorPtr &x) { return x->shape(); }
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    if (!ctx->NeedsInputGrad(0)) return Tripled(x);
    TripleInPlace(x, "scale_views_when_grad");
    ctx->MarkDirty({x});
    return x;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {Tripled(g[0])}; }
};

// 3 x, by a Function taking views that honours is_writable(): in place and marked dirty when x[0] < 0
// (its write, only if x is writable), else as a new tensor. Its calls on x[0] >= 0 write nothing, so
// the handler then gives it XLA's read-only buffer; a later negative x is marked dirty there, and
// the handler must run it again on a copy (the answer of every other call and of the callback path).
class ScaleViewsIfNegative : public Function<ScaleViewsIfNegative> {
 public:
  static constexpr bool kAcceptsViews = true;
  static ShapeVector InferShape(const TensorPtr &x) { return x->shape(); }
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    if (x->dtype() != kFloat64 || !x->is_contiguous()) throw std::invalid_argument("scale_views_if_negative");
    if (x->numel() == 0 || x->data<double>()[0] >= 0) return Tripled(x);
    if (x->is_writable()) TripleInPlace(x, "scale_views_if_negative");
    ctx->MarkDirty({x});
    return x;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {Tripled(g[0])}; }
};

// 3 x (float64) after overwriting its input with 3 x without MarkDirty, by a Function taking views.
class TripleScratchViews : public Function<TripleScratchViews> {
 public:
  static constexpr bool kAcceptsViews = true;
  static ShapeVector InferShape(const TensorPtr &x) { return x->shape(); }
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) {
    TripleInPlace(x, "triple_scratch_views");
    auto out = Tensor::empty(kFloat64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = x->data<double>()[i];
    return out;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {Tripled(g[0])}; }
};

// 3 x as a new tensor, whose Backward takes views and triples the cotangent in place through
// data_ptr() (whether or not it is writable) and returns it: XLA's cotangent must not change.
class TripleGradInPlace : public Function<TripleGradInPlace> {
 public:
  static constexpr bool kAcceptsViews = true;
  static ShapeVector InferShape(const TensorPtr &x) { return x->shape(); }
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) { return Tripled(x); }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) {
    TripleInPlace(g[0], "triple_grad_in_place");
    return {g[0]};
  }
};

// The address of x's memory as a float64 scalar (exact below 2^53), by a Function taking views that
// only reads: whether the handler gave it XLA's buffer or a copy.
class InputAddress : public Function<InputAddress> {
 public:
  static constexpr bool kAcceptsViews = true;
  static ShapeVector InferShape(const TensorPtr &) { return {}; }
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) {
    if (x->dtype() != kFloat64) throw std::invalid_argument("input_address: expected float64");
    auto out = Tensor::empty(kFloat64, {});
    out->data<double>()[0] = static_cast<double>(reinterpret_cast<std::uintptr_t>(x->data_ptr()));
    return out;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList) { return {nullptr}; }
};

// x * conj(y) + x * x for complex128 (not holomorphic in y); Backward in torch's convention
// (the conjugate Wirtinger derivative): gx = g * conj(d out/dx) = g * (y + 2 conj(x)), gy = conj(g) * x.
class ConjMul : public Function<ConjMul> {
 public:
  using C = std::complex<double>;
  static ShapeVector InferShape(const TensorPtr &x, const TensorPtr &) { return x->shape(); }
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y) {
    if (x->dtype() != kComplex128 || y->dtype() != kComplex128 || x->shape() != y->shape()) {
      throw std::invalid_argument("conj_mul: expected two complex128 tensors of one shape");
    }
    ctx->SaveForBackward({x, y});
    auto out = Tensor::empty(kComplex128, x->shape());
    const C *px = x->data<C>(), *py = y->data<C>();
    for (std::int64_t i = 0; i < x->numel(); ++i) out->data<C>()[i] = px[i] * std::conj(py[i]) + px[i] * px[i];
    return out;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    auto s = ctx->GetSavedTensors();
    const C *px = s[0]->data<C>(), *py = s[1]->data<C>(), *pg = g[0]->data<C>();
    auto gx = Tensor::empty(kComplex128, s[0]->shape()), gy = Tensor::empty(kComplex128, s[0]->shape());
    for (std::int64_t i = 0; i < gx->numel(); ++i) {
      gx->data<C>()[i] = pg[i] * (py[i] + 2.0 * std::conj(px[i]));
      gy->data<C>()[i] = std::conj(pg[i]) * px[i];
    }
    return {gx, gy};
  }
};

// Whether float64 `x` holds a non-zero element (to_jax's probe runs a function on zeros).
bool HasNonzero(const TensorPtr &x) {
  auto xc = x->contiguous();
  for (std::int64_t i = 0; i < xc->numel(); ++i) {
    if (xc->data<double>()[i] != 0.0) return true;
  }
  return false;
}

// exp(x) into `out` (float64, contiguous, x's shape).
void ExpInto(const TensorPtr &x, const TensorPtr &out) {
  auto xc = x->contiguous();
  for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = std::exp(xc->data<double>()[i]);
}

// factor * x (float64), as a new tensor.
TensorPtr Times64(const TensorPtr &x, double factor) {
  auto xc = x->contiguous();
  auto out = Tensor::empty(kFloat64, x->shape());
  for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = factor * xc->data<double>()[i];
  return out;
}

// 2 x (float64), keeping the factor in ctx->saved_data (Python objects: the probe sends it to the host route).
class SavedData : public Function<SavedData> {
 public:
  static ShapeVector InferShape(const TensorPtr &x) { return x->shape(); }
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    if (x->dtype() != kFloat64) throw std::invalid_argument("saved_data: expected float64");
    ctx->saved_data["factor"] = 2.0;
    return Times64(x, 2.0);
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    return {Times64(g[0], ctx->saved_data["factor"].cast<double>())};
  }
};

// 3x, keeping its factor in ctx->saved_data only when a gradient is needed (the NeedGrad idiom); no
// shape rule, so to_jax's probe runs it.
class SavedDataIfGrad : public Function<SavedDataIfGrad> {
 public:
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    if (ctx->NeedGrad(x)) ctx->saved_data["factor"] = 3.0;
    return Times64(x, 3.0);
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    return {Times64(g[0], ctx->saved_data["factor"].cast<double>())};
  }
};

// 4x, keeping its factor in ctx->saved_data only for an input with a non-zero element: to_jax's probe
// runs on zeros and does not see the use, so the call takes the XLA FFI route.
class SavedDataIfNonzero : public Function<SavedDataIfNonzero> {
 public:
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    if (HasNonzero(x)) ctx->saved_data["factor"] = 4.0;
    return Times64(x, 4.0);
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    const double f = ctx->saved_data.count("factor") != 0 ? ctx->saved_data["factor"].cast<double>() : 4.0;
    return {Times64(g[0], f)};
  }
};

// 5x; only its Backward uses ctx->saved_data (the probe runs Forward alone).
class SavedDataInBackward : public Function<SavedDataInBackward> {
 public:
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) { return Times64(x, 5.0); }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    ctx->saved_data["factor"] = 5.0;
    return {Times64(g[0], ctx->saved_data["factor"].cast<double>())};
  }
};

// One new tensor (a copy of x, float64) returned as both outputs; Backward weighs their gradients apart
// (g0 + 10 g1), so each output must get its own cotangent.
class DupOut : public Function<DupOut> {
 public:
  static TensorPtrList Forward(AutogradContext *, const TensorPtr &x) {
    auto o = Times64(x, 1.0);
    return {o, o};
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) {
    auto a = Times64(g[0], 1.0), b = Times64(g[1], 10.0);
    for (std::int64_t i = 0; i < a->numel(); ++i) a->data<double>()[i] += b->data<double>()[i];
    return {a};
  }
};

// exp(x), keeping its output in ctx->saved_data (alone, in a list, as an optional) for an input with a
// non-zero element (the probe does not see it: the XLA FFI route), stored before it is filled. On that
// route the output is built in XLA's result buffer, which does not outlive the call; the tape's context
// does.
class SavedDataOutput : public Function<SavedDataOutput> {
 public:
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    auto out = Tensor::empty(kFloat64, x->shape());
    const bool nonzero = HasNonzero(x);
    if (nonzero) {
      ctx->saved_data["out"] = out;
      ctx->saved_data["outs"] = TensorPtrList{out, out};
      ctx->saved_data["maybe"] = std::optional<TensorPtr>(out);
    } else {
      ctx->SaveForBackward({out});
    }
    ExpInto(x, out);
    if (nonzero && !ctx->saved_data["out"].cast<std::optional<TensorPtr>>()) {  // read as another type
      throw std::logic_error("saved_data_output: the output kept is missing");
    }
    return out;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    const bool kept = ctx->saved_data.count("out") != 0;
    auto a = kept ? *ctx->saved_data["out"].cast<std::optional<TensorPtr>>() : ctx->GetSavedTensors()[0];
    auto b = kept ? ctx->saved_data["outs"].cast<TensorPtrList>()[1] : a;
    auto c = kept ? *ctx->saved_data["maybe"].cast<std::optional<TensorPtr>>() : a;
    auto gc = g[0]->contiguous();
    auto r = Tensor::empty(kFloat64, g[0]->shape());
    for (std::int64_t i = 0; i < r->numel(); ++i) {
      r->data<double>()[i] =
          gc->data<double>()[i] * (a->data<double>()[i] + b->data<double>()[i] + c->data<double>()[i]) / 3.0;
    }
    return {r};
  }
};

// exp(x), its output kept in ctx->saved_data and read back as a Python object (for a non-zero input:
// the XLA FFI route). M 0: Backward reads it as py::object, then as a tensor; 1: Forward reads it as a
// borrowed py::handle and uses the handle after; 2: Forward stores it again as a py::object under
// another key, which Backward reads.
template <int M>
class SavedDataAsObject : public Function<SavedDataAsObject<M>> {
 public:
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    auto out = Tensor::empty(kFloat64, x->shape());
    const bool nonzero = HasNonzero(x);
    auto &sd = ctx->saved_data;
    if (nonzero) sd["out"] = out; else ctx->SaveForBackward({out});
    ExpInto(x, out);
    if (nonzero && M == 1) {
      py::handle h = sd["out"].template cast<py::handle>();
      if (py::cast<TensorPtr>(h)->numel() != x->numel()) throw std::logic_error("the handle's tensor");
    }
    if (nonzero && M == 2) sd["object"] = sd["out"].template cast<py::object>();
    return out;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    auto &sd = ctx->saved_data;
    TensorPtr e;
    if (sd.empty()) {
      e = ctx->GetSavedTensors()[0];
    } else if (M == 0) {
      py::object o = sd["out"].template cast<py::object>();
      e = py::cast<TensorPtr>(o);
    } else if (M == 2) {
      e = sd["object"].template cast<TensorPtr>();
    } else {
      e = sd["out"].template cast<TensorPtr>();
    }
    auto gc = g[0]->contiguous(), ec = e->contiguous();
    auto r = Tensor::empty(kFloat64, g[0]->shape());
    for (std::int64_t i = 0; i < r->numel(); ++i) r->data<double>()[i] = gc->data<double>()[i] * ec->data<double>()[i];
    return {r};
  }
};

// The positions 0..n-1 of x's elements as int64 (x's shape); no gradient.
class Positions : public Function<Positions> {
 public:
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    auto out = Tensor::empty(kInt64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) out->data<std::int64_t>()[i] = i;
    ctx->MarkNonDifferentiable({out});
    return out;
  }
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
  m.def("add_one_", [](const TensorPtr &x) { return AddOneInPlace::Apply(x); });
  m.def("add_one__infer_shape", AddOneInPlace::InferShapeFunction());
  OB_XLA_FFI(m, "add_one_", AddOneInPlace);
  m.def("add_one_views", [](const TensorPtr &x) { return AddOneViews::Apply(x); });
  m.def("add_one_views_infer_shape", AddOneViews::InferShapeFunction());
  OB_XLA_FFI(m, "add_one_views", AddOneViews);
  m.def("dirty_not_returned", [](const TensorPtr &x) { return DirtyNotReturned::Apply(x); });
  m.def("dirty_not_returned_infer_shape", DirtyNotReturned::InferShapeFunction());
  OB_XLA_FFI(m, "dirty_not_returned", DirtyNotReturned);
  m.def("triple_scratch", [](const TensorPtr &x) { return TripleScratch::Apply(x); });
  m.def("triple_scratch_infer_shape", TripleScratch::InferShapeFunction());
  OB_XLA_FFI(m, "triple_scratch", TripleScratch);
  m.def("conj_mul", [](const TensorPtr &x, const TensorPtr &y) { return ConjMul::Apply(x, y); });
  m.def("conj_mul_infer_shape", ConjMul::InferShapeFunction());
  OB_XLA_FFI(m, "conj_mul", ConjMul);
  m.def("saved_data", [](const TensorPtr &x) { return SavedData::Apply(x); });
  m.def("saved_data_if_grad", [](const TensorPtr &x) { return SavedDataIfGrad::Apply(x); });
  m.def("saved_data_if_nonzero", [](const TensorPtr &x) { return SavedDataIfNonzero::Apply(x); });
  m.def("dup_out", [](const TensorPtr &x) { return DupOut::Apply(x); });
  m.def("saved_data_output", [](const TensorPtr &x) { return SavedDataOutput::Apply(x); });
  m.def("saved_data_object_in_backward", [](const TensorPtr &x) { return SavedDataAsObject<0>::Apply(x); });
  m.def("saved_data_handle_in_forward", [](const TensorPtr &x) { return SavedDataAsObject<1>::Apply(x); });
  m.def("saved_data_object_kept", [](const TensorPtr &x) { return SavedDataAsObject<2>::Apply(x); });
  // the GIL released: saved_data, then two threads that take the GIL (a callback into Python), joined
  m.def(
      "saved_data_then_gil_threads",
      [](const TensorPtr &x) {
        auto y = SavedDataIfNonzero::Apply(x);
        std::thread a([] { py::gil_scoped_acquire gil; });
        std::thread b([] { py::gil_scoped_acquire gil; });
        a.join();
        b.join();
        return y;
      },
      py::call_guard<py::gil_scoped_release>());
  // the GIL released: two threads that each Apply, joined, then one more Apply: 25 x * x
  m.def(
      "apply_on_threads",
      [](const TensorPtr &x) {
        TensorPtr r[2];
        std::thread a([&] { r[0] = SavedDataInBackward::Apply(x); });
        std::thread b([&] { r[1] = SavedDataInBackward::Apply(x); });
        a.join();
        b.join();
        return Mul::Apply(r[0], r[1]);
      },
      py::call_guard<py::gil_scoped_release>());
  m.def("saved_data_in_backward", [](const TensorPtr &x) { return SavedDataInBackward::Apply(x); });
  m.def("saved_data_infer_shape", SavedData::InferShapeFunction());
  OB_XLA_FFI(m, "saved_data", SavedData);
  m.def("scale_views", [](const TensorPtr &x) { return ScaleViews::Apply(x); });
  m.def("scale_views_infer_shape", ScaleViews::InferShapeFunction());
  OB_XLA_FFI(m, "scale_views", ScaleViews);
  m.def("scale_views_when_grad", [](const TensorPtr &x) { return ScaleViewsWhenGrad::Apply(x); });
  m.def("scale_views_when_grad_infer_shape", ScaleViewsWhenGrad::InferShapeFunction());
  OB_XLA_FFI(m, "scale_views_when_grad", ScaleViewsWhenGrad);
  m.def("scale_views_if_negative", [](const TensorPtr &x) { return ScaleViewsIfNegative::Apply(x); });
  m.def("scale_views_if_negative_infer_shape", ScaleViewsIfNegative::InferShapeFunction());
  OB_XLA_FFI(m, "scale_views_if_negative", ScaleViewsIfNegative);
  m.def("triple_scratch_views", [](const TensorPtr &x) { return TripleScratchViews::Apply(x); });
  m.def("triple_scratch_views_infer_shape", TripleScratchViews::InferShapeFunction());
  OB_XLA_FFI(m, "triple_scratch_views", TripleScratchViews);
  m.def("triple_grad_in_place", [](const TensorPtr &x) { return TripleGradInPlace::Apply(x); });
  m.def("triple_grad_in_place_infer_shape", TripleGradInPlace::InferShapeFunction());
  OB_XLA_FFI(m, "triple_grad_in_place", TripleGradInPlace);
  m.def("input_address", [](const TensorPtr &x) { return InputAddress::Apply(x); });
  m.def("input_address_infer_shape", InputAddress::InferShapeFunction());
  OB_XLA_FFI(m, "input_address", InputAddress);
  m.def("positions", [](const TensorPtr &x) { return Positions::Apply(x); });
  OB_XLA_FFI(m, "positions", Positions);
}

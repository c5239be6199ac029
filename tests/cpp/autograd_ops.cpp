// Test operators for Function<T> / AutogradContext semantics (tests/test_autograd_*.py).
// One module per binding layer (nanobind, pybind11), built once per test session; also built
// with ASan/UBSan by tests/test_autograd_sanitizers.py.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <algorithm>
#include <iterator>
#include <new>
#include <optional>
#include <thread>
#include <vector>

#include "binding_compat.h"  // py:: is pybind11 or nanobind, as the test builds it

using namespace opbuilder;

namespace {

// ---- small float32/float64 kernels over contiguous tensors -------------------
template <typename F>
TensorPtr Map(const TensorPtr &x, F f) {
  TensorPtr xc = x->contiguous();
  auto out = std::make_shared<Tensor>(xc->dtype(), xc->shape());
  if (xc->dtype() == kFloat64) {
    const double *p = xc->data<double>();
    double *o = out->data<double>();
    for (std::int64_t i = 0; i < xc->numel(); ++i) o[i] = f(p[i]);
  } else {
    const float *p = xc->data<float>();
    float *o = out->data<float>();
    for (std::int64_t i = 0; i < xc->numel(); ++i) o[i] = static_cast<float>(f(p[i]));
  }
  return out;
}

template <typename F>
TensorPtr Zip(const TensorPtr &x, const TensorPtr &y, F f) {
  if (x->shape() != y->shape() || x->dtype() != y->dtype()) {
    throw std::invalid_argument("expected two tensors of one shape and dtype");
  }
  TensorPtr xc = x->contiguous(), yc = y->contiguous();
  auto out = std::make_shared<Tensor>(xc->dtype(), xc->shape());
  if (xc->dtype() == kFloat64) {
    const double *a = xc->data<double>(), *b = yc->data<double>();
    double *o = out->data<double>();
    for (std::int64_t i = 0; i < xc->numel(); ++i) o[i] = f(a[i], b[i]);
  } else {
    const float *a = xc->data<float>(), *b = yc->data<float>();
    float *o = out->data<float>();
    for (std::int64_t i = 0; i < xc->numel(); ++i) o[i] = static_cast<float>(f(a[i], b[i]));
  }
  return out;
}

TensorPtr Mul(const TensorPtr &x, const TensorPtr &y) { return Zip(x, y, [](double a, double b) { return a * b; }); }
TensorPtr Scale(const TensorPtr &x, double k) { return Map(x, [k](double a) { return a * k; }); }

// Adds y into x's memory (x contiguous).
void AddInto(const TensorPtr &x, const TensorPtr &y) {
  if (!x->is_contiguous()) throw std::invalid_argument("add_: x must be contiguous");
  TensorPtr s = Zip(x, y, [](double a, double b) { return a + b; });
  std::memcpy(x->data_ptr(), s->data_ptr(), x->nbytes());
}

std::vector<bool> g_last_null;  // which grad_outputs the last Backward got as nullptr

// ---- multiple outputs, materialized or not ------------------------------------
struct TwoScales : Function<TwoScales> {  // (x * 2, x * 3)
  static TensorPtrList Forward(AutogradContext *ctx, const TensorPtr &x, bool materialize) {
    ctx->SetMaterializeGrads(materialize);
    return {Scale(x, 2), Scale(x, 3)};
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) {
    g_last_null = {!g[0], !g[1]};
    TensorPtr gx;
    if (g[0]) gx = Scale(g[0], 2);
    if (g[1]) gx = gx ? Zip(gx, Scale(g[1], 3), [](double a, double b) { return a + b; }) : Scale(g[1], 3);
    return {gx, nullptr};
  }
};

// ---- MarkNonDifferentiable: (x * x, sign(x)) -----------------------------------
struct SquareAndSign : Function<SquareAndSign> {
  static TensorPtrList Forward(AutogradContext *ctx, const TensorPtr &x) {
    TensorPtr sign = Map(x, [](double a) { return a > 0 ? 1.0 : (a < 0 ? -1.0 : 0.0); });
    ctx->MarkNonDifferentiable({sign});
    ctx->SaveForBackward({x});
    return {Mul(x, x), sign};
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    g_last_null = {!g[0], !g[1]};
    return {Mul(Scale(ctx->GetSavedTensors()[0], 2), g[0])};
  }
};

// ---- MarkDirty: x += y, returns x -----------------------------------------------
struct AddInplace : Function<AddInplace> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y) {
    AddInto(x, y);
    ctx->MarkDirty({x});
    return x;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0], g[0]}; }
};

// MarkDirty misuse: `mode` "not_returned" (marks x, returns a new tensor) or "not_input".
struct BadDirty : Function<BadDirty> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const std::string &mode) {
    TensorPtr out = Scale(x, 1);
    ctx->MarkDirty({mode == "not_input" ? out : x});
    return out;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0], nullptr}; }
};

// f(element) for each element of float64 `x`, through its strides (a view is written where it is).
template <typename F>
void EachStrided(const TensorPtr &x, F f) {
  double *p = static_cast<double *>(x->data_ptr());
  const ShapeVector shape = x->shape(), strides = x->strides();
  for (std::int64_t i = 0; i < x->numel(); ++i) {
    std::int64_t off = 0;
    for (std::size_t d = shape.size(), rest = static_cast<std::size_t>(i); d-- > 0;) {
      off += static_cast<std::int64_t>(rest % static_cast<std::size_t>(shape[d])) * strides[d];
      rest /= static_cast<std::size_t>(shape[d]);
    }
    f(p[off]);
  }
}

// x *= 2 in place, MarkDirty, then an error: the write stays, as after torch's x.mul_(2) in a forward
// that raises.
struct FailAfterWrite : Function<FailAfterWrite> {
  static constexpr bool kAcceptsViews = true;
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    EachStrided(x, [](double &v) { v *= 2; });
    ctx->MarkDirty({x});
    throw std::runtime_error("failed after writing");
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0]}; }
};

// x *= 2 in place without MarkDirty (a misuse), then an error.
struct FailUnmarked : Function<FailUnmarked> {
  static constexpr bool kAcceptsViews = true;
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) {
    EachStrided(x, [](double &v) { v *= 2; });
    throw std::runtime_error("failed after writing unmarked");
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0]}; }
};

// a += 1 in place (MarkDirty), and b *= 2 in place without MarkDirty (a misuse).
struct DirtyAWriteB : Function<DirtyAWriteB> {
  static constexpr bool kAcceptsViews = true;
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &a, const TensorPtr &b) {
    EachStrided(a, [](double &v) { v += 1; });
    EachStrided(b, [](double &v) { v *= 2; });
    ctx->MarkDirty({a});
    return a;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0], nullptr}; }
};

// Writes into x (float64, any strides) without MarkDirty: doubles every element
// ("all") or flips one bit of the first ("one"); returns 2 * x (computed first).
struct SneakyScale : Function<SneakyScale> {
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x, const std::string &mode) {
    TensorPtr out = Scale(x, 2);
    double *p = x->data<double>();
    if (mode == "one" || mode == "one_middle") {  // one byte: the first, or one in the middle
      char *c = reinterpret_cast<char *>(p) + (mode == "one" ? 0 : x->nbytes() / 2 + 3);
      c[0] = static_cast<char>(c[0] ^ 1);
      return out;
    }
    EachStrided(x, [](double &v) { v *= 2; });
    return out;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {Scale(g[0], 2), nullptr}; }
};

// ---- saved tensors ----------------------------------------------------------------
struct MulSaved : Function<MulSaved> {  // x * y, saves both inputs
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y) {
    ctx->SaveForBackward({x, y});
    return Mul(x, y);
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    TensorPtrList s = ctx->GetSavedTensors();
    return {ctx->NeedsInputGrad(0) ? Mul(g[0], s[1]) : nullptr, ctx->NeedsInputGrad(1) ? Mul(g[0], s[0]) : nullptr};
  }
};

struct ExpSavesOutput : Function<ExpSavesOutput> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    TensorPtr out = Map(x, [](double a) { return std::exp(a); });
    ctx->SaveForBackward({out});
    return out;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) { return {Mul(g[0], ctx->GetSavedTensors()[0])}; }
};

// SaveForBackward reached through a member pointer, as code that passes it around takes it: the one
// signature keeps `&AutogradContext::SaveForBackward` a plain pointer (two overloads made it ambiguous).
struct SquareSavedByPointer : Function<SquareSavedByPointer> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    const auto save = &AutogradContext::SaveForBackward;
    (ctx->*save)({x});
    return Mul(x, x);
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    return {Scale(Mul(g[0], ctx->GetSavedTensors()[0]), 2.0)};
  }
};

// ---- plain values among the arguments, before and between tensors -------------------
// alpha * w[0] * x + w[1] * y. NeedsInputGrad(i) indexes Forward's arguments (alpha is 0,
// x is 1, w is 2, y is 3); what Forward and Backward saw is kept for the test to read.
std::vector<bool> g_mixed_needs;

struct MixedArgs : Function<MixedArgs> {
  static TensorPtr Forward(AutogradContext *ctx, double alpha, const TensorPtr &x, const std::vector<int64_t> &w,
                           const TensorPtr &y) {
    if (w.size() != 2) throw std::invalid_argument("MixedArgs: w must have two entries");
    g_mixed_needs.clear();
    for (size_t i = 0; i < 4; ++i) g_mixed_needs.push_back(ctx->NeedsInputGrad(i));
    ctx->saved_data["a"] = py::float_(alpha * static_cast<double>(w[0]));
    ctx->saved_data["b"] = py::int_(w[1]);
    return Zip(Scale(x, alpha * static_cast<double>(w[0])), Scale(y, static_cast<double>(w[1])),
               [](double p, double q) { return p + q; });
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    const double a = ctx->saved_data["a"].cast<double>();
    const auto b = ctx->saved_data["b"].cast<int64_t>();
    return {nullptr, ctx->NeedsInputGrad(1) ? Scale(g[0], a) : nullptr, nullptr,
            ctx->NeedsInputGrad(3) ? Scale(g[0], static_cast<double>(b)) : nullptr};
  }
};

// saved_data read back as another type than it was stored as: `stored` picks what Forward keeps (a double
// 2.5, an int 3, a bool, a string), `read` what Backward asks for; the gradient is scaled by what it read.
struct SavedReadAs : Function<SavedReadAs> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const std::string &stored,
                           const std::string &read) {
    if (stored == "double") ctx->saved_data["v"] = 2.5;
    if (stored == "int") ctx->saved_data["v"] = std::int64_t{3};
    if (stored == "bool") ctx->saved_data["v"] = true;
    if (stored == "string") ctx->saved_data["v"] = std::string("two");
    if (stored == "int300") ctx->saved_data["v"] = std::int64_t{300};
    if (stored == "doubles") ctx->saved_data["v"] = std::vector<double>{2.5};
    if (stored == "tensor") ctx->saved_data["v"] = x;
    if (stored == "np_float32" || stored == "np_bool" || stored == "np_array_true") {  // numpy's, as Python objects
#if defined(OB_BINDING_NANOBIND)
      py::object np = py::module_::import_("numpy");
#else
      py::object np = py::module_::import("numpy");
#endif
      ctx->saved_data["v"] = stored == "np_bool"         ? np.attr("bool_")(true)
                             : stored == "np_array_true" ? np.attr("array")(true)
                                                         : np.attr("float32")(2.5);
    }
    ctx->saved_data["read"] = read;
    return Scale(x, 1.0);
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    const std::string read = ctx->saved_data["read"].cast<std::string>();
    double k = 0;
    if (read == "bool") k = ctx->saved_data["v"].cast<bool>() ? 100.0 : -100.0;
    if (read == "int") k = static_cast<double>(ctx->saved_data["v"].cast<std::int64_t>());
    if (read == "double") k = ctx->saved_data["v"].cast<double>();
    if (read == "string") k = static_cast<double>(ctx->saved_data["v"].cast<std::string>().size());
    if (read == "float") k = static_cast<double>(ctx->saved_data["v"].cast<float>());
    if (read == "uint8") k = static_cast<double>(ctx->saved_data["v"].cast<std::uint8_t>());
    if (read == "optional_bool") k = ctx->saved_data["v"].cast<std::optional<bool>>().value_or(false) ? 100.0 : -100.0;
    if (read == "bools") k = ctx->saved_data["v"].cast<std::vector<bool>>().at(0) ? 100.0 : -100.0;
    if (read == "tensors") k = static_cast<double>(ctx->saved_data["v"].cast<TensorPtrList>().size());
    if (read == "char") k = static_cast<double>(ctx->saved_data["v"].cast<char>());
    return {Scale(g[0], k), nullptr, nullptr};
  }
};

// The other exception kinds, with the binding's mapping (the same in Forward and Backward).
inline void ThrowOther(const std::string &kind, const std::string &who, const std::string &where) {
  if (kind == "domain_error") throw std::domain_error(who + "outside the domain" + where);
  if (kind == "overflow_error") throw std::overflow_error(who + "too large" + where);
  if (kind == "logic_error") throw std::logic_error(who + "broken logic" + where);
  if (kind == "bad_alloc") throw std::bad_alloc();
  if (kind == "not_std") throw 42;  // not a std::exception at all
}

// ---- what Backward returns ---------------------------------------------------------
// x * y (one shape); Backward misbehaves as `mode` says.
struct Misbehave : Function<Misbehave> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y, const std::string &mode) {
    ctx->saved_data["mode"] = mode;  // a plain value: either binding converts it
    ctx->SaveForBackward({x, y});
    return Mul(x, y);
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    const std::string mode = ctx->saved_data["mode"].cast<std::string>();
    TensorPtrList s = ctx->GetSavedTensors();
    TensorPtr gx = Mul(g[0], s[1]), gy = Mul(g[0], s[0]);
    if (mode == "too_few") return {gx};  // y needs a gradient: an error
    if (mode == "omit_trailing") return {gx, gy};  // the non-tensor's null left off: fine
    if (mode == "too_many") return {gx, gy, nullptr, gx};
    if (mode == "extra_nulls") return {gx, gy, nullptr, nullptr, nullptr};
    if (mode == "bad_shape") return {Tensor::zeros(gx->dtype(), {7}), gy, nullptr};
    if (mode == "broadcast") {  // the gradient of x as if x had a leading dimension of 3
      TensorPtr third = Scale(gx, 1.0 / 3.0);
      ShapeVector shape{3};
      shape.insert(shape.end(), gx->shape().begin(), gx->shape().end());
      auto out = std::make_shared<Tensor>(gx->dtype(), shape);
      for (int k = 0; k < 3; ++k) {
        std::memcpy(static_cast<char *>(out->data_ptr()) + k * third->nbytes(), third->data_ptr(), third->nbytes());
      }
      return {out, gy, nullptr};
    }
    if (mode == "bad_dtype") {
      auto f = std::make_shared<Tensor>(kFloat32, gx->shape());
      for (std::int64_t i = 0; i < gx->numel(); ++i) f->data<float>()[i] = static_cast<float>(gx->data<double>()[i]);
      return {f, gy, nullptr};
    }
    if (mode == "non_tensor") return {gx, gy, gx};
    if (mode == "need_grad") return {ctx->NeedGrad(s[0]) ? gx : nullptr, gy, nullptr};
    if (mode == "invalid_argument") throw std::invalid_argument("Misbehave: bad value in Backward");
    if (mode == "out_of_range") throw std::out_of_range("Misbehave: index out of range in Backward");
    if (mode == "runtime_error") throw std::runtime_error("Misbehave: failure in Backward");
    ThrowOther(mode, "Misbehave: ", " in Backward");
    return {gx, gy, nullptr};
  }
};

// Throws from Forward after marking x dirty (and writing to it); `kind` picks the exception.
struct FailingForward : Function<FailingForward> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const std::string &kind) {
    ctx->MarkDirty({x});
    ctx->SaveForBackward({x});
    if (kind == "invalid_argument") throw std::invalid_argument("FailingForward: bad value");
    if (kind == "out_of_range") throw std::out_of_range("FailingForward: index out of range");
    ThrowOther(kind, "FailingForward: ", "");
    throw std::runtime_error("FailingForward: failure");
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0], nullptr}; }
};

// ---- threads: the kernel runs with the GIL released ----------------------------------
// x * y computed `repeat` times with the GIL released; tensors are made, copied and
// dropped there; Backward reads its saved tensors with the GIL released too.
struct ReleasingMul : Function<ReleasingMul> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y, std::int64_t repeat) {
    ctx->SaveForBackward({x, y});
    TensorPtr out;
    {
      py::gil_scoped_release nogil;
      for (std::int64_t r = 0; r < repeat; ++r) {
        TensorPtr copy = std::make_shared<Tensor>(*x);  // a second C++ view of a Python-owned buffer
        TensorPtr tmp = Mul(copy, y);
        out = tmp;
      }
    }
    return out;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    TensorPtrList grads(3);
    py::gil_scoped_release nogil;
    TensorPtrList s = ctx->GetSavedTensors();  // takes the GIL itself
    grads[0] = ctx->NeedsInputGrad(0) ? Mul(g[0], s[1]) : nullptr;
    grads[1] = ctx->NeedsInputGrad(1) ? Mul(g[0], s[0]) : nullptr;
    s.clear();  // drops references to Python-owned buffers without the GIL
    g.clear();  // the last C++ references to the incoming gradients' Python objects
    return grads;
  }
};

// x * y (+ b): an optional tensor argument is a tensor like any other (needs grad, gets one).
std::vector<bool> g_opt_needs;
struct MulOptBias : Function<MulOptBias> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y,
                           const std::optional<TensorPtr> &b) {
    g_opt_needs = {ctx->NeedsInputGrad(0), ctx->NeedsInputGrad(1), ctx->NeedsInputGrad(2),
                   b.has_value() && ctx->NeedGrad(*b)};
    if (b && !(*b)->is_contiguous()) throw std::invalid_argument("MulOptBias: b reached Forward strided");
    ctx->SaveForBackward({x, y});
    TensorPtr out = Mul(x, y);
    return b ? Zip(out, *b, [](double p, double q) { return p + q; }) : out;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    TensorPtrList s = ctx->GetSavedTensors();
    return {Mul(g[0], s[1]), Mul(g[0], s[0]), ctx->NeedsInputGrad(2) ? g[0] : nullptr};
  }
};

// The sum of a list of tensors: one argument, so its tensors get no gradient.
struct SumList : Function<SumList> {
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x, const TensorPtrList &rest) {
    TensorPtr out = Scale(x, 1);
    for (const auto &t : rest) out = Zip(out, t, [](double p, double q) { return p + q; });
    return out;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0], nullptr}; }
};

}  // namespace

namespace {
TensorPtrList g_held;  // see hold / drop_held_concurrently

// A copy of x (1-D float64) returned as a reversed view: stride -1, data at the last element.
TensorPtr Reversed(const TensorPtr &x) {
  TensorPtr c = x->contiguous_copy();
  const std::int64_t n = c->numel();
  double *last = c->data<double>() + (n > 0 ? n - 1 : 0);
  return std::make_shared<Tensor>(kFloat64, ShapeVector{n}, ShapeVector{-1}, last, c->storage());
}
}  // namespace

OB_MODULE(m) {
  m.def("reversed", &Reversed);
  m.def("two_scales", [](const TensorPtr &x, bool materialize) { return TwoScales::Apply(x, materialize); });
  m.def("square_and_sign", [](const TensorPtr &x) { return SquareAndSign::Apply(x); });
  m.def("last_null", []() { return g_last_null; });
  m.def("add_", [](const TensorPtr &x, const TensorPtr &y) { return AddInplace::Apply(x, y); });
  m.def("bad_dirty", [](const TensorPtr &x, const std::string &mode) { return BadDirty::Apply(x, mode); });
  m.def("sneaky_scale", [](const TensorPtr &x, const std::string &mode) { return SneakyScale::Apply(x, mode); });
  m.def("fail_after_write", [](const TensorPtr &x) { return FailAfterWrite::Apply(x); });
  m.def("fail_unmarked", [](const TensorPtr &x) { return FailUnmarked::Apply(x); });
  m.def("dirty_a_write_b", [](const TensorPtr &a, const TensorPtr &b) { return DirtyAWriteB::Apply(a, b); });
  m.def("mixed_args", [](double alpha, const TensorPtr &x, const std::vector<int64_t> &w, const TensorPtr &y) {
    return MixedArgs::Apply(alpha, x, w, y);
  });
  m.def("mixed_needs", []() { return g_mixed_needs; });
  m.def("saved_read_as", [](const TensorPtr &x, const std::string &stored, const std::string &read) {
    return SavedReadAs::Apply(x, stored, read);
  });
  m.def("dim_size", [](const TensorPtr &x, std::int64_t d) { return x->shape(d); });
  // x scaled by 2 where the flag is set, 3 where it is false, 1 where none (a bool in an optional, in a
  // list): bools taken as they are
  m.def("scale_if_optional", [](const TensorPtr &x, const std::optional<bool> &flag) {
    return Scale(x, !flag ? 1.0 : *flag ? 2.0 : 3.0);
  });
  m.def("scale_if_any", [](const TensorPtr &x, std::vector<bool> flags) {
    bool any = false;
    for (bool f : flags) any = any || f;
    return Scale(x, any ? 2.0 : 1.0);
  });
  m.def("mul_saved", [](const TensorPtr &x, const TensorPtr &y) { return MulSaved::Apply(x, y); });
  m.def("exp_saves_output", [](const TensorPtr &x) { return ExpSavesOutput::Apply(x); });
  m.def("square_saved_by_pointer", [](const TensorPtr &x) { return SquareSavedByPointer::Apply(x); });
  m.def("misbehave", [](const TensorPtr &x, const TensorPtr &y, const std::string &mode) {
    return Misbehave::Apply(x, y, mode);
  });
  m.def("mul_opt_bias", [](const TensorPtr &x, const TensorPtr &y, std::optional<TensorPtr> b) {
    return MulOptBias::Apply(x, y, b);
  }, py::arg("x"), py::arg("y"), py::arg("b") = py::none());
  m.def("opt_needs", []() { return g_opt_needs; });
  m.def("sum_list", [](const TensorPtr &x, const TensorPtrList &rest) { return SumList::Apply(x, rest); });
  m.def("failing_forward", [](const TensorPtr &x, const std::string &kind) { return FailingForward::Apply(x, kind); });
  m.def("releasing_mul", [](const TensorPtr &x, const TensorPtr &y, std::int64_t repeat) {
    return ReleasingMul::Apply(x, y, repeat);
  });
  // Drops the given tensors (views of Python buffers) on a thread that never held the GIL.
  // Keeps tensors in C++ only, then drops them from several threads with the GIL released:
  // the last references to their Python objects go on those threads.
  m.def("hold", [](TensorPtrList tensors) {
    g_held.insert(g_held.end(), tensors.begin(), tensors.end());
  });
  m.def("last_held", [](const TensorPtr &) { return g_held.back(); });  // the argument only fixes a signature
  m.def("drop_held_concurrently", [](int nthreads) {
    TensorPtrList all;
    all.swap(g_held);
    py::gil_scoped_release nogil;
    std::vector<std::thread> threads;
    const std::size_t per = (all.size() + static_cast<std::size_t>(nthreads) - 1) / static_cast<std::size_t>(nthreads);
    for (std::size_t begin = 0; begin < all.size(); begin += per) {
      TensorPtrList mine(std::make_move_iterator(all.begin() + static_cast<std::ptrdiff_t>(begin)),
                         std::make_move_iterator(all.begin() + static_cast<std::ptrdiff_t>(std::min(all.size(), begin + per))));
      threads.emplace_back([m = std::move(mine)]() mutable {
        for (auto &t : m) t.reset();
      });
    }
    for (auto &t : threads) t.join();
  });
  m.def("drop_in_thread", [](TensorPtrList tensors) {
    py::gil_scoped_release nogil;
    std::thread t([ts = std::move(tensors)]() mutable {
      TensorPtrList copies = ts;  // copy and drop them here too
      copies.clear();
      ts.clear();
    });
    t.join();
  });
}

// Bound functions that do more than call one Function's Apply: a Function picked by a value, work before
// or after Apply, two Applies. to_jax's generic custom call runs each whole, in C++, on every call, so
// each gives eager's values and gradients (interop_jax_ffi.py probe_entry, xla_ffi_handlers.h).
#include <algorithm>
#include <complex>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <vector>

#include "opbuilder/extension.h"
using namespace opbuilder;

template <int K>
struct ScaleBy : Function<ScaleBy<K>> {
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x, const TensorPtr &) {
    TensorPtr xc = x->contiguous();
    TensorPtr out = Tensor::empty(kFloat64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = K * xc->data<double>()[i];
    return out;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) {
    TensorPtr gc = g[0]->contiguous();
    TensorPtr out = Tensor::empty(kFloat64, gc->shape());
    for (std::int64_t i = 0; i < gc->numel(); ++i) out->data<double>()[i] = K * gc->data<double>()[i];
    return {out, nullptr};
  }
};

// x * x (saves x)
struct Square : Function<Square> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    ctx->SaveForBackward({x});
    TensorPtr out = Tensor::empty(kFloat64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = x->data<double>()[i] * x->data<double>()[i];
    return out;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    TensorPtr x = ctx->GetSavedTensors()[0];
    TensorPtr gc = g[0]->contiguous();
    TensorPtr out = Tensor::empty(kFloat64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = 2 * x->data<double>()[i] * gc->data<double>()[i];
    return {out};
  }
};

// 3 * x
struct Triple : Function<Triple> {
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) {
    TensorPtr out = Tensor::empty(kFloat64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = 3 * x->data<double>()[i];
    return out;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) {
    TensorPtr gc = g[0]->contiguous();
    TensorPtr out = Tensor::empty(kFloat64, gc->shape());
    for (std::int64_t i = 0; i < gc->numel(); ++i) out->data<double>()[i] = 3 * gc->data<double>()[i];
    return {out};
  }
};

// 3 * x, whose Backward refuses a cotangent over 100 (an error inside the backward handler)
struct TripleRefusingBig : Function<TripleRefusingBig> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) { return Triple::Forward(ctx, x); }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    if (g[0]->contiguous()->data<double>()[0] > 100) throw std::invalid_argument("the cotangent is over 100");
    return Triple::Backward(ctx, std::move(g));
  }
};

// x * y (saves both) and x + y
struct MulXY : Function<MulXY> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y) {
    ctx->SaveForBackward({x, y});
    TensorPtr out = Tensor::empty(kFloat64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = x->data<double>()[i] * y->data<double>()[i];
    return out;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    TensorPtrList s = ctx->GetSavedTensors();
    TensorPtr gc = g[0]->contiguous();
    TensorPtr gx = Tensor::empty(kFloat64, gc->shape()), gy = Tensor::empty(kFloat64, gc->shape());
    for (std::int64_t i = 0; i < gc->numel(); ++i) {
      gx->data<double>()[i] = gc->data<double>()[i] * s[1]->data<double>()[i];
      gy->data<double>()[i] = gc->data<double>()[i] * s[0]->data<double>()[i];
    }
    return {gx, gy};
  }
};
struct AddXY : Function<AddXY> {
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x, const TensorPtr &y) {
    TensorPtr out = Tensor::empty(kFloat64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = x->data<double>()[i] + y->data<double>()[i];
    return out;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0], g[0]}; }
};

// x *= 2 in place (MarkDirty), returning x
struct DoubleInPlace : Function<DoubleInPlace> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    for (std::int64_t i = 0; i < x->numel(); ++i) x->data<double>()[i] *= 2;
    ctx->MarkDirty({x});
    return x;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) {
    TensorPtr gc = g[0]->contiguous();
    TensorPtr out = Tensor::empty(kFloat64, gc->shape());
    for (std::int64_t i = 0; i < gc->numel(); ++i) out->data<double>()[i] = 2 * gc->data<double>()[i];
    return {out};
  }
};

// x * y on complex128 (torch's convention in Backward: the gradients are g * conj(y), g * conj(x))
struct MulC : Function<MulC> {
  using C = std::complex<double>;
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y) {
    ctx->SaveForBackward({x, y});
    TensorPtr out = Tensor::empty(kComplex128, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) out->data<C>()[i] = x->data<C>()[i] * y->data<C>()[i];
    return out;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    TensorPtrList s = ctx->GetSavedTensors();
    TensorPtr gc = g[0]->contiguous();
    TensorPtr gx = Tensor::empty(kComplex128, gc->shape()), gy = Tensor::empty(kComplex128, gc->shape());
    for (std::int64_t i = 0; i < gc->numel(); ++i) {
      gx->data<C>()[i] = gc->data<C>()[i] * std::conj(s[1]->data<C>()[i]);
      gy->data<C>()[i] = gc->data<C>()[i] * std::conj(s[0]->data<C>()[i]);
    }
    return {gx, gy};
  }
};

double First(const TensorPtr &t) { return t->contiguous()->data<double>()[0]; }

// ---- memory the generic custom call lends a function (tensor_details.h LentScope) ----------------------
// [the address Forward reads x at, 1 if it may write there else 0]; takes views, writes none
struct AddressOf : Function<AddressOf> {
  static constexpr bool kAcceptsViews = true;
  static constexpr bool kConstArgs = true;
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) {
    TensorPtr out = Tensor::empty(kInt64, {2});
    out->data<std::int64_t>()[0] = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(x->data_ptr()));
    out->data<std::int64_t>()[1] = x->is_writable() ? 1 : 0;
    return out;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList) { return {nullptr}; }
};

// 3 x, after overwriting x with 3 x through data<T>() without MarkDirty and without asking
// is_writable(): a kernel that breaks kAcceptsViews' promise. Takes views.
struct TripleOverwrites : Function<TripleOverwrites> {
  static constexpr bool kAcceptsViews = true;
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) {
    double *p = x->data<double>();
    for (std::int64_t i = 0; i < x->numel(); ++i) p[i] *= 3;
    TensorPtr out = Tensor::empty(kFloat64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = p[i];
    return out;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) {
    TensorPtr out = Tensor::empty(kFloat64, g[0]->shape());
    for (std::int64_t i = 0; i < out->numel(); ++i) out->data<double>()[i] = 3 * g[0]->contiguous()->data<double>()[i];
    return {out};
  }
};

// x[0] = 9 written in place without MarkDirty (no gradient is recorded, so eager allows it); 2 x
struct NineNoDirty : Function<NineNoDirty> {
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) {
    x->data<double>()[0] = 9;
    TensorPtr out = Tensor::empty(kFloat64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = 2 * x->data<double>()[i];
    return out;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList) { return {nullptr}; }
};
struct NineNoDirtyList : Function<NineNoDirtyList> {
  static TensorPtr Forward(AutogradContext *, const TensorPtrList &xs) {
    xs[0]->data<double>()[0] = 9;
    return Tensor::zeros(kFloat64, xs[0]->shape());
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList) { return {nullptr}; }
};

// a view of x (a new Tensor over its memory); takes views, writes none
struct ViewOf : Function<ViewOf> {
  static constexpr bool kAcceptsViews = true;
  static constexpr bool kConstArgs = true;
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) {
    return std::make_shared<Tensor>(x->dtype(), x->shape(), ShapeVector{}, x->data_ptr(), x->storage());
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0]}; }
};

// x *= 3 in place and marked dirty when x[0] < 0, writing only writable memory (as a kAcceptsViews
// Function must); else 3 x as a new tensor. It declares kConstArgs all the same (a broken promise the
// handler survives: lent memory marked dirty makes Forward run again on the argument's copy).
struct TripleIfNegative : Function<TripleIfNegative> {
  static constexpr bool kAcceptsViews = true;
  static constexpr bool kConstArgs = true;
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    if (x->data<double>()[0] >= 0) return Triple::Forward(ctx, x);
    if (x->is_writable()) {
      for (std::int64_t i = 0; i < x->numel(); ++i) x->data<double>()[i] *= 3;
    }
    ctx->MarkDirty({x});
    return x;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) { return Triple::Backward(ctx, g); }
};

// a view of x, by a type that does not take views and writes none
struct ConstViewOf : Function<ConstViewOf> {
  static constexpr bool kConstArgs = true;
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) {
    return std::make_shared<Tensor>(x->dtype(), x->shape(), ShapeVector{}, x->data_ptr(), x->storage());
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0]}; }
};

// a view of xs[0] (a new Tensor over its memory); takes views, writes none
struct ListViewOf : Function<ListViewOf> {
  static constexpr bool kAcceptsViews = true;
  static constexpr bool kConstArgs = true;
  static TensorPtr Forward(AutogradContext *, const TensorPtrList &xs) {
    const TensorPtr &x = xs[0];
    return std::make_shared<Tensor>(x->dtype(), x->shape(), ShapeVector{}, x->data_ptr(), x->storage());
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0]}; }
};

// x's negatives set to 0 in place, without MarkDirty, when x is writable (no gradient is recorded); then 0
struct ZeroNegativesIfWritable : Function<ZeroNegativesIfWritable> {
  static constexpr bool kAcceptsViews = true;
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) {
    if (x->is_writable()) {
      for (std::int64_t i = 0; i < x->numel(); ++i) x->data<double>()[i] = std::max(x->data<double>()[i], 0.0);
    }
    return Tensor::zeros(kFloat64, {});
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList) { return {nullptr}; }
};

// negatives clamped to 0 in place (MarkDirty)
struct ClampInPlace : Function<ClampInPlace> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    for (std::int64_t i = 0; i < x->numel(); ++i) x->data<double>()[i] = std::max(x->data<double>()[i], 0.0);
    ctx->MarkDirty({x});
    return x;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0]}; }
};

// ClampInPlace on a view of x (as writable as x is), then 0; takes views
struct ClampThroughView : Function<ClampThroughView> {
  static constexpr bool kAcceptsViews = true;
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) {
    auto v = std::make_shared<Tensor>(x->dtype(), x->shape(), ShapeVector{}, x->data_ptr(), x->storage(),
                                      x->is_writable());
    ClampInPlace::Apply(v);
    return Tensor::zeros(kFloat64, {});
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList) { return {nullptr}; }
};

// x = 3 x in place: marked dirty, then written with copy_from, by a type that declares kConstArgs all the
// same (the in-place run fails on read-only memory, after MarkDirty)
struct TripleByCopyFrom : Function<TripleByCopyFrom> {
  static constexpr bool kConstArgs = true;
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    TensorPtr t = Triple::Forward(ctx, x);
    ctx->MarkDirty({x});
    x->copy_from(*t);
    return x;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) { return Triple::Backward(ctx, g); }
};

// x *= 3 when x is writable, marked dirty, then an error when x[0] > 100; kConstArgs all the same
struct TripleThenFail : Function<TripleThenFail> {
  static constexpr bool kAcceptsViews = true;
  static constexpr bool kConstArgs = true;
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    if (x->is_writable()) {
      for (std::int64_t i = 0; i < x->numel(); ++i) x->data<double>()[i] *= 3;
    }
    ctx->MarkDirty({x});
    if (x->data<double>()[0] > 100) throw std::invalid_argument("triple_then_fail: too big");
    return x;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) { return Triple::Backward(ctx, g); }
};

TensorPtr g_kept;  // a tensor a function keeps past its call
long g_runs = 0;   // runs of counted
bool g_armed = false;  // keep_then_raise raises

// per worker thread (4), the sum of x, each read on its own thread; takes views, writes none
struct SumOnThreads : Function<SumOnThreads> {
  static constexpr bool kAcceptsViews = true;
  static constexpr bool kConstArgs = true;
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) {
    TensorPtr out = Tensor::empty(kFloat64, {4});
    std::vector<std::thread> workers;
    for (int w = 0; w < 4; ++w) {
      workers.emplace_back([&x, &out, w] {
        double s = 0;
        const double *p = x->data<double>();
        for (std::int64_t i = 0; i < x->numel(); ++i) s += p[i];
        out->data<double>()[w] = s;
      });
    }
    for (auto &t : workers) t.join();
    return out;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList) { return {nullptr}; }
};

// 3 * (the elements of x over `floor`): an output shape that depends on the values
static TensorPtr TripleAbove(const TensorPtr &x, double floor) {
  TensorPtr xc = x->contiguous();
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < xc->numel(); ++i) n += xc->data<double>()[i] > floor ? 1 : 0;
  TensorPtr kept = Tensor::empty(kFloat64, {n});
  for (std::int64_t i = 0, k = 0; i < xc->numel(); ++i) {
    if (xc->data<double>()[i] > floor) kept->data<double>()[k++] = xc->data<double>()[i];
  }
  return Triple::Apply(kept);
}

OB_MODULE(m) {
  // picked by a value no probe value reaches (x[0] > 100): x * x, else 3 * x
  m.def("over_100", [](const TensorPtr &x) { return First(x) > 100.0 ? Square::Apply(x) : Triple::Apply(x); });
  // picked by the sign of a product (positive, negative and zero arrays all give >= 0): x * y, else x + y
  m.def("by_product_sign", [](const TensorPtr &x, const TensorPtr &y) {
    return First(x) * First(y) < 0.0 ? MulXY::Apply(x, y) : AddXY::Apply(x, y);
  });
  // picked by a threshold on the mean: x * x above 1, else 3 * x
  m.def("by_mean", [](const TensorPtr &x) {
    TensorPtr c = x->contiguous();
    double s = 0;
    for (std::int64_t i = 0; i < c->numel(); ++i) s += c->data<double>()[i];
    return s / static_cast<double>(c->numel()) > 1.0 ? Square::Apply(x) : Triple::Apply(x);
  });
  // an error for a negative x[0] (in the handler, without Python), else 3 * x
  m.def("raises", [](const TensorPtr &x) {
    if (First(x) < 0) throw std::invalid_argument("raises: x[0] must not be negative");
    return Triple::Apply(x);
  });
  // x[0] > 100: x doubled in place (its result not used: x itself is), then squared; else 3 * x
  m.def("inplace_late", [](const TensorPtr &x) {
    if (First(x) > 100.0) {
      DoubleInPlace::Apply(x);
      return Square::Apply(x);
    }
    return Triple::Apply(x);
  });
  m.def("refusing_big", [](const TensorPtr &x) { return TripleRefusingBig::Apply(x); });
  m.def("cmul", [](const TensorPtr &x, const TensorPtr &y) { return MulC::Apply(x, y); });
  // two Applies when x[0] > 100 (3 * (x * x)), else one (3 * x)
  m.def("chain_pick", [](const TensorPtr &x) { return Triple::Apply(First(x) > 100.0 ? Square::Apply(x) : x); });
  // an in-place Apply then another when x[0] > 100 ((2x)^2), else 3 * x
  m.def("inplace_pick", [](const TensorPtr &x) {
    return First(x) > 100.0 ? Square::Apply(DoubleInPlace::Apply(x)) : Triple::Apply(x);
  });
  // the Function is chosen by a value: flag != 0 -> x * 2, else x * 3
  m.def("pick", [](const TensorPtr &x, const TensorPtr &flag) {
    return flag->contiguous()->data<double>()[0] != 0.0 ? ScaleBy<2>::Apply(x, flag) : ScaleBy<3>::Apply(x, flag);
  });
  // an epilogue: Apply's output scaled in place after it
  m.def("post", [](const TensorPtr &x, const TensorPtr &y) {
    TensorPtr out = ScaleBy<1>::Apply(x, y);
    for (std::int64_t i = 0; i < out->numel(); ++i) out->data<double>()[i] *= 10.0;
    return out;
  });
  // a prologue: negatives clamped to zero in place before Apply
  m.def("pre", [](const TensorPtr &x, const TensorPtr &y) {
    for (std::int64_t i = 0; i < x->numel(); ++i) {
      if (x->data<double>()[i] < 0) x->data<double>()[i] = 0;
    }
    return ScaleBy<1>::Apply(x, y);
  });
  m.def("plain", [](const TensorPtr &x, const TensorPtr &y) { return ScaleBy<2>::Apply(x, y); });
  m.def("address", [](const TensorPtr &x) { return AddressOf::Apply(x); });
  // the body reads x before its Apply
  m.def("address_after_read", [](const TensorPtr &x) {
    (void)First(x);
    return AddressOf::Apply(x);
  });
  // x[0] = 7 written through a copy of the Tensor object (its memory shared), then 3 * x
  m.def("write_through_alias", [](const TensorPtr &x) {
    Tensor alias(*x);
    alias.data<double>()[0] = 7;
    return Triple::Apply(x);
  });
  // x[0] = 5 written on another thread, then 3 * x
  m.def("write_on_thread", [](const TensorPtr &x) {
    std::thread([&x] { x->data<double>()[0] = 5; }).join();
    return Triple::Apply(x);
  });
  // x overwritten with y (copy_from), then 3 * x
  m.def("copy_into", [](const TensorPtr &x, const TensorPtr &y) {
    x->copy_from(*y);
    return Triple::Apply(x);
  });
  m.def("triple_overwrites", [](const TensorPtr &x) { return TripleOverwrites::Apply(x); });
  // a Function writes x[0] = 9 without MarkDirty, then 3 * x (as a list argument too)
  m.def("nine_then_triple", [](const TensorPtr &x) {
    NineNoDirty::Apply(x);
    return Triple::Apply(x);
  });
  m.def("nine_list_then_triple", [](const TensorPtr &x) {
    NineNoDirtyList::Apply(TensorPtrList{x});
    return Triple::Apply(x);
  });
  // a Function zeroes x's negatives when x is writable (no MarkDirty), then 2 * x
  m.def("zero_if_writable_then_double", [](const TensorPtr &x) {
    ZeroNegativesIfWritable::Apply(x);
    return ScaleBy<2>::Apply(x, x);
  });
  // a Function clamps x through a view of it, then 2 * x
  m.def("clamp_view_then_double", [](const TensorPtr &x) {
    ClampThroughView::Apply(x);
    return ScaleBy<2>::Apply(x, x);
  });
  // x[0] = 42 through a view a Function returned, then 3 * x
  m.def("view_write", [](const TensorPtr &x) {
    TensorPtr v = ViewOf::Apply(x);
    v->data<double>()[0] = 42;
    return Triple::Apply(x);
  });
  m.def("const_view_write", [](const TensorPtr &x) {
    TensorPtr v = ConstViewOf::Apply(x);
    v->data<double>()[0] = 42;
    return Triple::Apply(x);
  });
  // x[0] = 42 through a view a Function returned of a list holding x, then 3 * x
  m.def("list_view_write", [](const TensorPtr &x) {
    TensorPtr v = ListViewOf::Apply(TensorPtrList{x});
    v->data<double>()[0] = 42;
    return Triple::Apply(x);
  });
  // 3 * x through an in-place Apply that writes with copy_from, then x + 1
  m.def("copy_from_in_place", [](const TensorPtr &x) {
    TripleByCopyFrom::Apply(x);
    TensorPtr out = Tensor::empty(kFloat64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = x->data<double>()[i] + 1;
    return out;
  });
  // an in-place Apply that fails after its write (the error swallowed), then x * x
  m.def("fail_after_write", [](const TensorPtr &x) {
    try {
      TripleThenFail::Apply(x);
    } catch (...) {
    }
    return Square::Apply(x);
  });
  // keeps x (untouched) past the call; kept() reads it later
  m.def("keep", [](const TensorPtr &x) {
    g_kept = x;
    return Tensor::zeros(kFloat64, x->shape());
  });
  m.def("kept", [](const TensorPtr &) { return g_kept->contiguous_copy(); });
  // keeps x (untouched), then fails once armed (to_jax's run on zeros for the output shape succeeds)
  m.def("keep_then_raise", [](const TensorPtr &x) -> TensorPtr {
    g_kept = x;
    if (g_armed) throw std::invalid_argument("keep_then_raise: refused");
    return Tensor::zeros(kFloat64, x->shape());
  });
  m.def("arm", [](bool on) { g_armed = on; });
  // counts its runs; an in-place Apply for a negative x[0] (any error it raised is swallowed); then x + 1
  m.def("counted", [](const TensorPtr &x) {
    ++g_runs;
    try {
      TripleIfNegative::Apply(x);
    } catch (...) {
    }
    TensorPtr out = Tensor::empty(kFloat64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = x->data<double>()[i] + 1;
    return out;
  });
  m.def("runs", []() { return g_runs; });
  m.def("sum_on_threads", [](const TensorPtr &x) { return SumOnThreads::Apply(x); });
  // an output whose shape depends on the values: 3 * (the positive elements of x)
  m.def("positives", [](const TensorPtr &x) { return TripleAbove(x, 0.0); });
  // the same over 10: no stand-in value to_jax runs it on reaches 10, every run's output is empty
  m.def("above_ten", [](const TensorPtr &x) { return TripleAbove(x, 10.0); });
  // x's distinct elements, in order: one on zeros, more on other values
  m.def("distinct", [](const TensorPtr &x) {
    TensorPtr xc = x->contiguous();
    std::vector<double> v(xc->data<double>(), xc->data<double>() + xc->numel());
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    TensorPtr out = Tensor::empty(kFloat64, {static_cast<std::int64_t>(v.size())});
    std::copy(v.begin(), v.end(), out->data<double>());
    return out;
  });
}

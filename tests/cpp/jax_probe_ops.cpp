// Bound functions that do more than call one Function's Apply: a Function picked by a value, work before
// or after Apply, two Applies. to_jax's generic custom call runs each whole, in C++, on every call, so
// each gives eager's values and gradients (interop_jax_ffi.py probe_entry, xla_ffi_handlers.h).
#include <complex>
#include <stdexcept>

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
  // an output whose shape depends on the values: 3 * (the positive elements of x)
  m.def("positives", [](const TensorPtr &x) {
    TensorPtr xc = x->contiguous();
    std::int64_t n = 0;
    for (std::int64_t i = 0; i < xc->numel(); ++i) n += xc->data<double>()[i] > 0 ? 1 : 0;
    TensorPtr kept = Tensor::empty(kFloat64, {n});
    for (std::int64_t i = 0, k = 0; i < xc->numel(); ++i) {
      if (xc->data<double>()[i] > 0) kept->data<double>()[k++] = xc->data<double>()[i];
    }
    return Triple::Apply(kept);
  });
}

// Function<T> ops that count how many times their Forward ran (tests/test_jit_kept.py,
// benchmarks/jit.py): a jitted call's backward must use the node its forward recorded, not run
// Forward again. Float64 and float32, contiguous or not (kAcceptsViews is off: views come copied).
#include <atomic>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "opbuilder/extension.h"

namespace py = pybind11;
using namespace opbuilder;

namespace {

std::atomic<std::int64_t> g_forwards{0};

template <typename F>
TensorPtr Zip(const TensorPtr &x, const TensorPtr &y, F f) {
  if (x->shape() != y->shape() || x->dtype() != y->dtype()) {
    throw std::invalid_argument("jit_counted_ops: expected two tensors of one shape and dtype");
  }
  auto out = std::make_shared<Tensor>(x->dtype(), x->shape());
  const std::int64_t n = x->numel();
  if (x->dtype() == kFloat64) {
    const double *a = x->data<double>(), *b = y->data<double>();
    double *o = out->data<double>();
    for (std::int64_t i = 0; i < n; ++i) o[i] = f(a[i], b[i]);
  } else {
    const float *a = x->data<float>(), *b = y->data<float>();
    float *o = out->data<float>();
    for (std::int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(f(a[i], b[i]));
  }
  return out;
}


// k * x * y; Backward reads k from saved_data (a value only Forward had) and x, y from the saved tensors.
struct ScaledMul : Function<ScaledMul> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y, double k) {
    ++g_forwards;
    ctx->saved_data["k"] = py::float_(k);
    ctx->SaveForBackward({x, y});
    return Zip(x, y, [k](double a, double b) { return k * a * b; });
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    const double k = ctx->saved_data["k"].cast<double>();
    auto s = ctx->GetSavedTensors();
    auto scale = [k](double a, double b) { return k * a * b; };
    return {ctx->NeedsInputGrad(0) ? Zip(g[0], s[1], scale) : nullptr,
            ctx->NeedsInputGrad(1) ? Zip(g[0], s[0], scale) : nullptr, nullptr};
  }
};

// tanh(x), saving its output: the forward's output is what Backward reads (and version-checks).
struct Tanh : Function<Tanh> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    ++g_forwards;
    auto out = Zip(x, x, [](double a, double) { return std::tanh(a); });
    ctx->SaveForBackward({out});
    return out;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    auto out = ctx->GetSavedTensors()[0];
    return {Zip(g[0], out, [](double d, double t) { return d * (1 - t * t); })};
  }
};

// x *= k in place (MarkDirty), returns x.
struct Scale_ : Function<Scale_> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, double k) {
    ++g_forwards;
    const std::int64_t n = x->numel();
    if (x->dtype() == kFloat64) {
      double *p = x->data<double>();
      for (std::int64_t i = 0; i < n; ++i) p[i] *= k;
    } else {
      float *p = x->data<float>();
      for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(p[i] * k);
    }
    ctx->saved_data["k"] = py::float_(k);
    ctx->MarkDirty({x});
    return x;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    const double k = ctx->saved_data["k"].cast<double>();
    return {Zip(g[0], g[0], [k](double d, double) { return d * k; }), nullptr};
  }
};

// k * x, returned twice ({out, out}: one tensor at two positions); Backward weighs output 0's gradient
// by k and output 1's by w (w == k: the true derivative), so a test sees which position a gradient reached.
struct Twice : Function<Twice> {
  static TensorPtrList Forward(AutogradContext *ctx, const TensorPtr &x, double k, double w) {
    ++g_forwards;
    ctx->saved_data["k"] = py::float_(k);
    ctx->saved_data["w"] = py::float_(w);
    auto out = Zip(x, x, [k](double a, double) { return k * a; });
    return {out, out};
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    const double k = ctx->saved_data["k"].cast<double>(), w = ctx->saved_data["w"].cast<double>();
    return {Zip(g[0], g[1], [k, w](double a, double b) { return k * a + w * b; }), nullptr, nullptr};
  }
};

}  // namespace

PYBIND11_MODULE(OB_EXTENSION_NAME, m) {
  m.def("scaled_mul", [](const TensorPtr &x, const TensorPtr &y, double k) { return ScaledMul::Apply(x, y, k); });
  m.def("tanh", [](const TensorPtr &x) { return Tanh::Apply(x); });
  m.def("scale_", [](const TensorPtr &x, double k) { return Scale_::Apply(x, k); });
  m.def("twice", [](const TensorPtr &x, double k, double w) { return Twice::Apply(x, k, w); });
  m.def("forwards", []() { return g_forwards.load(); }, "how many times a Forward of this module ran");
}

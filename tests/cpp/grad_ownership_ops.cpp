// Test operators for gradient ownership, saved arguments returned unchanged and
// null gradients of C++ Functions (tests/test_grad_ownership.py). Built once per session.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "opbuilder/extension.h"

namespace py = pybind11;
using namespace opbuilder;

namespace {

// out[i] = x[i] * y[i] + k * z[i] over contiguous float64 tensors of one shape (z may be null).
TensorPtr Fma(const TensorPtr &x, const TensorPtr &y, double k = 0, const TensorPtr &z = nullptr) {
  if (x->shape() != y->shape() || x->dtype() != kFloat64 || y->dtype() != kFloat64) {
    throw std::invalid_argument("expected two float64 tensors of one shape");
  }
  TensorPtr xc = x->contiguous(), yc = y->contiguous(), zc = z ? z->contiguous() : nullptr;
  auto out = std::make_shared<Tensor>(kFloat64, xc->shape());
  const double *a = xc->data<double>(), *b = yc->data<double>(), *c = zc ? zc->data<double>() : nullptr;
  double *o = out->data<double>();
  for (std::int64_t i = 0; i < xc->numel(); ++i) o[i] = a[i] * b[i] + (c ? k * c[i] : 0.0);
  return out;
}

std::uintptr_t g_last_ptr = 0;  // the memory of the last gradient MulModes handed back for y
TensorPtr g_kept;               // a gradient MulModes also keeps ("kept")

// x * y; Backward hands y a gradient in one of several ways.
struct MulModes : Function<MulModes> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y, const std::string &mode) {
    ctx->SaveForBackward({x, y});
    ctx->saved_data["mode"] = py::cast(mode);
    return Fma(x, y);
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    auto saved = ctx->GetSavedTensors();
    const std::string mode = ctx->saved_data["mode"].cast<std::string>();
    TensorPtr gx = Fma(g[0], saved[1]);
    TensorPtr gy;
    if (mode == "fresh") {
      gy = Fma(g[0], saved[0]);
    } else if (mode == "saved") {  // x itself: y's gradient for a seed of ones
      gy = saved[0];
    } else if (mode == "kept") {
      gy = g_kept = Fma(g[0], saved[0]);
    } else if (mode == "incoming") {  // the incoming gradient itself: y's gradient when x is ones
      gy = g[0];
    } else if (mode == "incoming_view") {  // a new C++ tensor over the incoming gradient's memory
      gy = std::make_shared<Tensor>(*g[0]);
    } else if (mode == "null") {  // no gradient for y, though it may need one
      gy = nullptr;
    } else {
      throw std::invalid_argument("unknown mode " + mode);
    }
    g_last_ptr = gy ? reinterpret_cast<std::uintptr_t>(gy->data_ptr()) : 0;
    return {gx, gy, nullptr};
  }
};

// (x * x, x): the second output is the argument itself, unchanged (no MarkDirty); x is saved.
struct SquareAndSelf : Function<SquareAndSelf> {
  static TensorPtrList Forward(AutogradContext *ctx, const TensorPtr &x) {
    ctx->SaveForBackward({x});
    return {Fma(x, x), x};
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    TensorPtr x = ctx->GetSavedTensors()[0];  // Backward gets contiguous tensors
    auto gx = std::make_shared<Tensor>(kFloat64, x->shape());
    const double *px = x->data<double>(), *g0 = g[0]->data<double>(), *g1 = g[1]->data<double>();
    double *o = gx->data<double>();
    for (std::int64_t i = 0; i < gx->numel(); ++i) o[i] = 2 * px[i] * g0[i] + g1[i];
    return {gx};
  }
};

}  // namespace

PYBIND11_MODULE(OB_EXTENSION_NAME, m) {
  m.def("mul_modes", [](const TensorPtr &x, const TensorPtr &y, const std::string &mode) {
    return MulModes::Apply(x, y, mode);
  });
  m.def("last_ptr", []() { return g_last_ptr; });
  m.def("kept_sum", []() {
    double s = 0;
    for (std::int64_t i = 0; i < g_kept->numel(); ++i) s += g_kept->data<double>()[i];
    return s;
  });
  m.def("square_and_self", [](const TensorPtr &x) { return SquareAndSelf::Apply(x); });
}

// x * y (float64) that counts what its Backward computed, per input, and keeps the NeedsInputGrad
// flags its Forward last saw (tests/test_jax_needs.py): under jax.grad with respect to some inputs,
// every to_jax route (generic XLA FFI handlers, OB_XLA_FFI, the callback) asks for those gradients only.
// `nine` has nine outputs, more than the handlers offer without allocating.
#include <array>
#include <atomic>
#include <cstdint>
#include <stdexcept>

#include "opbuilder/extension.h"
#include "opbuilder/xla_ffi.h"

using namespace opbuilder;

namespace {

std::array<std::atomic<std::int64_t>, 2> g_grads{};  // gradients Backward computed, per input
std::array<std::atomic<int>, 2> g_needs{};           // NeedsInputGrad(i) in Forward's last run

TensorPtr Mul(const TensorPtr &x, const TensorPtr &y) {
  if (x->dtype() != kFloat64 || y->dtype() != kFloat64 || x->shape() != y->shape()) {
    throw std::invalid_argument("ffi_needs_ops: expected two float64 tensors of one shape");
  }
  TensorPtr xc = x->contiguous(), yc = y->contiguous();
  auto out = std::make_shared<Tensor>(kFloat64, xc->shape());
  const double *a = xc->data<double>(), *b = yc->data<double>();
  double *o = out->data<double>();
  for (std::int64_t i = 0; i < xc->numel(); ++i) o[i] = a[i] * b[i];
  return out;
}

struct CountedMul : Function<CountedMul> {
  static ShapeVector InferShape(const TensorPtr &x, const TensorPtr &) { return x->shape(); }
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y) {
    for (std::size_t i = 0; i < 2; ++i) g_needs[i] = ctx->NeedsInputGrad(i) ? 1 : 0;
    ctx->SaveForBackward({x, y});
    return Mul(x, y);
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    TensorPtrList s = ctx->GetSavedTensors();
    TensorPtrList out(2);
    for (std::size_t i = 0; i < 2; ++i) {
      if (!ctx->NeedsInputGrad(i)) continue;
      ++g_grads[i];
      out[i] = Mul(g[0], s[1 - i]);
    }
    return out;
  }
};

// The same Function under another name, for the module's own OB_XLA_FFI handlers.
struct CountedMulOwn : Function<CountedMulOwn> {
  static ShapeVector InferShape(const TensorPtr &x, const TensorPtr &) { return x->shape(); }
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y) {
    return CountedMul::Forward(ctx, x, y);
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) { return CountedMul::Backward(ctx, g); }
};

// x + k for k = 0..8: nine outputs, more than the handlers keep inline (OfferResults), each built in place.
struct NineOut : Function<NineOut> {
  static TensorPtrList Forward(AutogradContext *, const TensorPtr &x) {
    TensorPtrList out;
    for (int k = 0; k < 9; ++k) {
      auto o = std::make_shared<Tensor>(kFloat64, x->shape());
      const double *a = x->contiguous()->data<double>();
      for (std::int64_t i = 0; i < x->numel(); ++i) o->data<double>()[i] = a[i] + k;
      out.push_back(o);
    }
    return out;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) {
    auto sum = std::make_shared<Tensor>(kFloat64, g[0]->shape());
    for (std::int64_t i = 0; i < sum->numel(); ++i) {
      double v = 0;
      for (const auto &gk : g) v += gk->contiguous()->data<double>()[i];
      sum->data<double>()[i] = v;
    }
    return {sum};
  }
};

}  // namespace

OB_MODULE(m) {
  m.def("nine", [](const TensorPtr &x) { return NineOut::Apply(x); });
  m.def("mul", [](const TensorPtr &x, const TensorPtr &y) { return CountedMul::Apply(x, y); });
  m.def("mul_infer_shape", CountedMul::InferShapeFunction());
  m.def("mul_own", [](const TensorPtr &x, const TensorPtr &y) { return CountedMulOwn::Apply(x, y); });
  m.def("mul_own_infer_shape", CountedMulOwn::InferShapeFunction());
  OB_XLA_FFI(m, "mul_own", CountedMulOwn);
  // k = 0, 1: the gradients of input k Backward computed so far; k = 2, 3: NeedsInputGrad(k - 2) in
  // Forward's last run
  m.def("_count", [](int k) -> std::int64_t {
    if (k < 0 || k > 3) throw std::invalid_argument("_count: k is 0 to 3");
    return k < 2 ? g_grads[k].load() : static_cast<std::int64_t>(g_needs[k - 2].load());
  });
}

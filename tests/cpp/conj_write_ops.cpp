// tests/test_torch_routes_semantics.py: a MarkDirty op on complex tensors, for writes into conjugate views.
//   muli_(x)   x *= 1j in place (complex128), returns x
#include <complex>
#include <cstdint>
#include <stdexcept>

#include "opbuilder/extension.h"

using namespace opbuilder;

class MulI : public Function<MulI> {
 public:
  static constexpr bool kAcceptsViews = true;
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    if (x->dtype() != kComplex128) throw std::invalid_argument("muli_: expected complex128");
    const auto &shape = x->shape();
    const auto &strides = x->strides();
    auto *base = static_cast<std::complex<double> *>(x->data_ptr());
    for (std::int64_t flat = 0; flat < x->numel(); ++flat) {
      std::int64_t rest = flat, offset = 0;
      for (std::int64_t d = static_cast<std::int64_t>(shape.size()) - 1; d >= 0; --d) {
        offset += (rest % shape[d]) * strides[d];
        rest /= shape[d];
      }
      base[offset] *= std::complex<double>(0.0, 1.0);
    }
    ctx->MarkDirty({x});
    return x;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) {
    auto gc = g[0]->contiguous();
    auto out = Tensor::empty(kComplex128, gc->shape());
    const auto *pg = gc->data<std::complex<double>>();
    auto *po = out->data<std::complex<double>>();
    for (std::int64_t i = 0; i < out->numel(); ++i) po[i] = pg[i] * std::complex<double>(0.0, -1.0);
    return {out};
  }
};

OB_MODULE(m) { m.def("muli_", [](const TensorPtr &x) { return MulI::Apply(x); }); }

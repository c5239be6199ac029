// Bound functions that do more than call one Function's Apply: to_jax's probe (interop_jax_ffi.py
// probe_entry) must keep each off the C++ custom call, which would run the Function alone.
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

OB_MODULE(m) {
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
}

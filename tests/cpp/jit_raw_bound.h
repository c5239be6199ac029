// Functions for tests/test_jit_raw_modules.py: module functions and class methods bound by a module's own
// macro (NB_MODULE, PYBIND11_MODULE) that do work around a Function's Apply. Float64, contiguous.
#pragma once
#include <cstdint>

#include "opbuilder/extension.h"

namespace raw_ops {

using namespace opbuilder;

inline TensorPtr Scaled(const TensorPtr &x, double k) {
  auto xc = x->contiguous();
  auto out = Tensor::empty(kFloat64, x->shape());
  for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = k * xc->data<double>()[i];
  return out;
}

// x (y only rides along; no gradient for it)
struct Copy : Function<Copy> {
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x, const TensorPtr &) {
    auto xc = x->contiguous();
    auto out = Tensor::empty(kFloat64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = xc->data<double>()[i];
    return out;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0], nullptr}; }
};

// K * x (y only rides along)
template <int K>
struct ScaleBy : Function<ScaleBy<K>> {
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x, const TensorPtr &) { return Scaled(x, K); }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {Scaled(g[0], K), nullptr}; }
};

// An epilogue after Apply: the output scaled by 10 in place, outside any Function.
inline TensorPtr Post(const TensorPtr &x, const TensorPtr &y) {
  auto out = Copy::Apply(x, y);
  for (std::int64_t i = 0; i < out->numel(); ++i) out->data<double>()[i] *= 10.0;
  return out;
}

// A bound class whose method does the same.
struct Poster {
  double scale = 10.0;
  TensorPtr post(const TensorPtr &x, const TensorPtr &y) const {
    auto out = Copy::Apply(x, y);
    for (std::int64_t i = 0; i < out->numel(); ++i) out->data<double>()[i] *= scale;
    return out;
  }
  // a Function picked by a tensor's value: flag != 0 -> 2x, else 3x
  TensorPtr pick(const TensorPtr &x, const TensorPtr &flag) const {
    return flag->contiguous()->data<double>()[0] != 0.0 ? ScaleBy<2>::Apply(x, flag) : ScaleBy<3>::Apply(x, flag);
  }
};

}  // namespace raw_ops

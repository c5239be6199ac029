// What several test fixtures share: `k * x` as a plain kernel (float64, any strides in, contiguous out),
// and `bind`, the binding layer the fixture is built with. Include after "opbuilder/extension.h".
#pragma once

#include <cstdint>

namespace test_fixtures {

inline opbuilder::TensorPtr Scaled(const opbuilder::TensorPtr &x, double k) {
  auto xc = x->contiguous();
  auto out = opbuilder::Tensor::empty(opbuilder::kFloat64, x->shape());
  for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = k * xc->data<double>()[i];
  return out;
}

#if defined(OB_BINDING_NANOBIND)
namespace bind = nanobind;
#else
namespace bind = pybind11;
#endif

}  // namespace test_fixtures

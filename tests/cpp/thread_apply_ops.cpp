// A bound function whose Apply runs on a std::thread it starts, the GIL released around its body (the
// thread's Apply takes it): through to_torch's bridge the Apply still records in torch's graph
// (tests/test_torch_bridge_chained.py). Float64, contiguous.
#include <cstdint>
#include <thread>

#include "opbuilder/extension.h"

using namespace opbuilder;

namespace {

TensorPtr Scaled(const TensorPtr &x, double k) {
  auto xc = x->contiguous();
  auto out = Tensor::empty(kFloat64, x->shape());
  for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = k * xc->data<double>()[i];
  return out;
}

// 3 * x
struct Triple : Function<Triple> {
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) { return Scaled(x, 3.0); }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {Scaled(g[0], 3.0)}; }
};

#if defined(OB_BINDING_NANOBIND)
namespace bind = nanobind;
#else
namespace bind = pybind11;
#endif

}  // namespace

OB_MODULE(m) {
  m.def("triple_on_thread", [](const TensorPtr &x) {
    TensorPtr r;
    std::thread t([&] { r = Triple::Apply(x); });
    t.join();
    return r;
  }, bind::call_guard<bind::gil_scoped_release>());
}

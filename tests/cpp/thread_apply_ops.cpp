// A bound function whose Apply runs on a std::thread it starts, the GIL released around its body (the
// thread's Apply takes it): through to_torch's bridge the Apply still records in torch's graph
// (tests/test_torch_bridge_chained.py). Float64, contiguous.
#include <cstdint>
#include <thread>

#include "opbuilder/extension.h"
#include "scaled_kernel.h"  // Scaled, bind

using namespace opbuilder;
using namespace test_fixtures;

namespace {

// 3 * x
struct Triple : Function<Triple> {
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) { return Scaled(x, 3.0); }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {Scaled(g[0], 3.0)}; }
};

}  // namespace

OB_MODULE(m) {
  m.def("triple_on_thread", [](const TensorPtr &x) {
    TensorPtr r;
    std::thread t([&] { r = Triple::Apply(x); });
    t.join();
    return r;
  }, bind::call_guard<bind::gil_scoped_release>());
}

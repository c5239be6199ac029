// Test operators for what a Function type's calls show of its writes into arguments
// (tests/test_write_knowledge.py, include/opbuilder/detail/call_rules.h WriteKnowledge): arguments a
// write would be refused for are kept before Forward only while the type may write them.
#include <cstdint>

#include "binding_compat.h"  // py:: is pybind11 or nanobind, as the test builds it

using namespace opbuilder;

namespace {

// Returns x * 2 (float64, a new tensor); when `write`, first adds 1 to x[0] through its raw pointer, and
// when `mark` too, says so (MarkDirty) and returns x itself. One type per Tag: each test learns anew.
template <int Tag>
struct WriteIf : Function<WriteIf<Tag>> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, bool write, bool mark) {
    double *p = static_cast<double *>(x->data_ptr());
    if (write) p[0] += 1.0;
    if (write && mark) {
      ctx->MarkDirty({x});
      return x;
    }
    auto out = std::make_shared<Tensor>(kFloat64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) out->template data<double>()[i] = p[i] * 2.0;
    return out;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0], nullptr, nullptr}; }
};

// x * w, elementwise (float32, one shape): an op that reads its arguments, as most do.
struct Mul : Function<Mul> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &w) {
    ctx->SaveForBackward({x, w});
    auto out = std::make_shared<Tensor>(kFloat32, x->shape());
    const float *a = x->data<float>(), *b = w->data<float>();
    float *o = out->data<float>();
    for (std::int64_t i = 0; i < x->numel(); ++i) o[i] = a[i] * b[i];
    return out;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    const TensorPtrList s = ctx->GetSavedTensors();
    TensorPtr gc = g[0]->contiguous();
    auto gx = std::make_shared<Tensor>(kFloat32, gc->shape()), gw = std::make_shared<Tensor>(kFloat32, gc->shape());
    for (std::int64_t i = 0; i < gc->numel(); ++i) {
      gx->data<float>()[i] = gc->data<float>()[i] * s[1]->data<float>()[i];
      gw->data<float>()[i] = gc->data<float>()[i] * s[0]->data<float>()[i];
    }
    return {gx, gw};
  }
};

}  // namespace

OB_MODULE(m) {
  m.def("write_if_0", [](const TensorPtr &x, bool w, bool k) { return WriteIf<0>::Apply(x, w, k); });
  m.def("write_if_1", [](const TensorPtr &x, bool w, bool k) { return WriteIf<1>::Apply(x, w, k); });
  m.def("write_if_2", [](const TensorPtr &x, bool w, bool k) { return WriteIf<2>::Apply(x, w, k); });
  m.def("write_if_3", [](const TensorPtr &x, bool w, bool k) { return WriteIf<3>::Apply(x, w, k); });
  m.def("mul", [](const TensorPtr &x, const TensorPtr &w) { return Mul::Apply(x, w); });
}

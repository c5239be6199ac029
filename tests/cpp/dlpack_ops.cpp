// Operators that report what their tensor argument is (address, layout, writability), to show
// that other frameworks' tensors (torch, JAX, anything with __dlpack__) arrive without a copy
// and follow the boundary rules: a plain function and a default Function get them, a
// kAcceptsViews Function gets strided views as they are.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "binding_compat.h"  // py:: is pybind11 or nanobind, as the test builds it

using namespace opbuilder;

namespace {

// What the last Forward got.
struct Seen {
  std::int64_t address = 0;
  bool contiguous = false;
  bool writable = false;
};
Seen g_seen;

void Record(const TensorPtr &x) {
  g_seen.address = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(x->data_ptr()));
  g_seen.contiguous = x->is_contiguous();
  g_seen.writable = x->is_writable();
}

// 2 * x for float64 x of any strides (C order out).
TensorPtr Twice(const TensorPtr &x) {
  if (x->dtype() != kFloat64) throw std::invalid_argument("twice: expected float64");
  TensorPtr c = x->contiguous();
  auto out = std::make_shared<Tensor>(kFloat64, x->shape());
  const double *px = c->data<double>();
  double *po = out->data<double>();
  for (std::int64_t i = 0; i < out->numel(); ++i) po[i] = 2 * px[i];
  return out;
}

class TwiceFn : public Function<TwiceFn> {
 public:
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) {
    Record(x);
    return Twice(x);
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList grad_outputs) { return {Twice(grad_outputs[0])}; }
};

class TwiceViews : public Function<TwiceViews> {
 public:
  static constexpr bool kAcceptsViews = true;
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) {
    Record(x);
    return Twice(x);
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList grad_outputs) { return {Twice(grad_outputs[0])}; }
};

}  // namespace

OB_MODULE(m) {
  m.def("twice", [](const TensorPtr &x) { return TwiceFn::Apply(x); });
  m.def("twice_views", [](const TensorPtr &x) { return TwiceViews::Apply(x); });
  // No Function: the tensor exactly as the caster made it.
  m.def("address", [](const TensorPtr &x) {
    return static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(x->data_ptr()));
  });
  m.def("first", [](const TensorPtr &x) { return x->data<double>()[0]; });  // refuses a strided view
  m.def("identity", [](const TensorPtr &x) { return x; });
  m.def("seen", []() { return py::make_tuple(g_seen.address, g_seen.contiguous, g_seen.writable); });
}

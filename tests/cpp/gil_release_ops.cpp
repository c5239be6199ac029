// Bound functions that release the GIL around their body (call_guard<gil_scoped_release>), as a user does
// for a long kernel: Apply takes the GIL back for what it records (tests/test_gil_release.py). And
// bodies, Forwards and Backwards that release it themselves, which to_jax's XLA FFI route runs on a
// thread without the GIL (detail/gil_wrap.h).
#include <cstdint>
#include <stdexcept>

#include "opbuilder/extension.h"
#include "scaled_kernel.h"  // Scaled, bind

using namespace opbuilder;
using namespace test_fixtures;

namespace {

// 2 * x
struct Twice : Function<Twice> {
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) { return Scaled(x, 2.0); }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {Scaled(g[0], 2.0)}; }
};

// x * y, both saved
struct Mul : Function<Mul> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y) {
    ctx->SaveForBackward({x, y});
    auto xc = x->contiguous(), yc = y->contiguous();
    auto out = Tensor::empty(kFloat64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = xc->data<double>()[i] * yc->data<double>()[i];
    return out;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    auto s = ctx->GetSavedTensors();
    return {Mul::Apply(g[0], s[1]), Mul::Apply(g[0], s[0])};
  }
};

// 3 * x, its Forward and Backward releasing the GIL around their loops
struct Thrice : Function<Thrice> {
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) {
    bind::gil_scoped_release unlocked;
    return Scaled(x, 3.0);
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) {
    bind::gil_scoped_release unlocked;
    return {Scaled(g[0], 3.0)};
  }
};

// a bound class's method: jit cannot record it whole, so a trace meeting its Apply stops (with a warning)
struct Scaler {
  TensorPtr apply(const TensorPtr &x) const { return Twice::Apply(x); }
};

}  // namespace

OB_MODULE(m) {
  m.def("twice", [](const TensorPtr &x) { return Twice::Apply(x); }, bind::call_guard<bind::gil_scoped_release>());
  // two Applies and a plain tensor made between them, all without the GIL
  m.def("mul_twice", [](const TensorPtr &x, const TensorPtr &y) { return Mul::Apply(Twice::Apply(x), y); },
        bind::call_guard<bind::gil_scoped_release>());
  m.def("thrice", [](const TensorPtr &x) { return Thrice::Apply(x); });
  // the body releases the GIL itself and calls Apply without it; then with CPython's own macros
  m.def("released_twice", [](const TensorPtr &x) {
    bind::gil_scoped_release unlocked;
    return Twice::Apply(x);
  });
  m.def("c_api_mul_twice", [](const TensorPtr &x, const TensorPtr &y) {
    TensorPtr out;
    Py_BEGIN_ALLOW_THREADS
    out = Mul::Apply(Thrice::Apply(x), y);
    Py_END_ALLOW_THREADS
    return out;
  });
  // the idiom "take the GIL if this thread lacks it, then touch Python": on the FFI route the check takes it
  m.def("checked_twice", [](const TensorPtr &x) {
    double k;
    if (PyGILState_Check()) {
      k = bind::cast<double>(bind::float_(2.0));
    } else {
      bind::gil_scoped_acquire held;
      k = bind::cast<double>(bind::float_(2.0));
    }
    if (k != 2.0) throw std::runtime_error("checked_twice: Python's float(2.0) was not 2.0");
    return Twice::Apply(x);
  });
  bind::class_<Scaler>(m, "Scaler")
      .def(bind::init<>())
      .def("apply", &Scaler::apply, bind::call_guard<bind::gil_scoped_release>());
}

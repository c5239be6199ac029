// Module functions that do more than one Function's Apply (tests/test_jit_semantics_routes.py): runtime.jit
// records the whole call of each (include/opbuilder/detail/bound_call.h), so a replay equals eager.
// Float64, contiguous. Built with both binding layers (OB_MODULE).
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "opbuilder/extension.h"
#include "scaled_kernel.h"  // Scaled, bind

using namespace opbuilder;
using namespace test_fixtures;

namespace {

// K * x; `y` only rides along (its gradient is none).
template <int K>
struct ScaleBy : Function<ScaleBy<K>> {
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x, const TensorPtr &) { return Scaled(x, K); }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {Scaled(g[0], K), nullptr}; }
};

// x * y
struct Mul : Function<Mul> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y) {
    ctx->SaveForBackward({x, y});
    auto xc = x->contiguous(), yc = y->contiguous();
    auto out = Tensor::empty(kFloat64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) {
      out->data<double>()[i] = xc->data<double>()[i] * yc->data<double>()[i];
    }
    return out;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList g) {
    auto s = ctx->GetSavedTensors();
    auto gc = g[0]->contiguous();
    auto gx = Tensor::empty(kFloat64, gc->shape()), gy = Tensor::empty(kFloat64, gc->shape());
    for (std::int64_t i = 0; i < gc->numel(); ++i) {
      gx->data<double>()[i] = gc->data<double>()[i] * s[1]->data<double>()[i];
      gy->data<double>()[i] = gc->data<double>()[i] * s[0]->data<double>()[i];
    }
    return {gx, gy};
  }
};

// x *= 2 in place (MarkDirty), returned at two positions: {x, x}
struct DirtyTwice : Function<DirtyTwice> {
  static TensorPtrList Forward(AutogradContext *ctx, const TensorPtr &x) {
    for (std::int64_t i = 0; i < x->numel(); ++i) x->data<double>()[i] *= 2;
    ctx->MarkDirty({x});
    return {x, x};
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) {
    auto out = Tensor::zeros(kFloat64, g[0] ? g[0]->shape() : g[1]->shape());
    for (int k = 0; k < 2; ++k) {
      if (!g[k]) continue;
      auto gc = g[k]->contiguous();
      for (std::int64_t i = 0; i < out->numel(); ++i) out->data<double>()[i] += 2 * gc->data<double>()[i];
    }
    return {out};
  }
};

// x *= 3 in place (MarkDirty), returned: a running statistic's update
struct Scale3 : Function<Scale3> {
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    for (std::int64_t i = 0; i < x->numel(); ++i) x->data<double>()[i] *= 3;
    ctx->MarkDirty({x});
    return x;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {Scaled(g[0], 3)}; }
};

#if defined(OB_BINDING_NANOBIND)
}  // namespace
#include <nanobind/stl/tuple.h>
namespace {
#endif

TensorPtr Post(const TensorPtr &x, const TensorPtr &y) {
  auto out = ScaleBy<1>::Apply(x, y);
  for (std::int64_t i = 0; i < out->numel(); ++i) out->data<double>()[i] *= 10.0;
  return out;
}

// A helper binding into the module it is handed, as a source of its own would (opbuilder::ObModule), and
// into a submodule of it.
void BindMore(ObModule m) {
  m.def("post_helper", &Post);
  decltype(m) sub = m.def_submodule("sub");
  sub.def("post", &Post);
}

}  // namespace

OB_MODULE(m) {
  BindMore(m);
  // one Function applied to one argument twice: x * x (the node has two edges to x)
  m.def("sq", [](const TensorPtr &x) { return Mul::Apply(x, x); });
  // two Functions' outputs: x * y and x * x
  m.def("two", [](const TensorPtr &x, const TensorPtr &y) { return TensorPtrList{Mul::Apply(x, y), Mul::Apply(x, x)}; });
  // one output returned twice
  m.def("pair", [](const TensorPtr &x) {
    auto o = Mul::Apply(x, x);
    return std::make_tuple(o, o);
  });
  // two overloads of one name (nanobind makes a new function object for the second)
  m.def("scale2", [](const TensorPtr &x, double k) { return k > 0 ? ScaleBy<2>::Apply(x, x) : ScaleBy<3>::Apply(x, x); });
  m.def("scale2", [](const TensorPtr &x, const TensorPtr &y) { return Mul::Apply(x, y); });
  // a keyword-only argument: a replay passes arguments by position, so the trace stops
  m.def("scale_kw", [](const TensorPtr &x, double k) { return k > 0 ? ScaleBy<2>::Apply(x, x) : ScaleBy<3>::Apply(x, x); },
        bind::arg("x"), bind::kw_only(), bind::arg("k") = 1.0);
  // an argument handed back as it is, beside a Function's output or alone (that output dropped)
  m.def("ret_in", [](const TensorPtr &a, const TensorPtr &b) { return TensorPtrList{Mul::Apply(a, b), a}; });
  m.def("ret_in_only", [](const TensorPtr &a, const TensorPtr &b) {
    Mul::Apply(a, b);
    return a;
  });
  // a null result (None) for k < 0
  m.def("maybe_none", [](const TensorPtr &x, double k) { return k < 0 ? TensorPtr() : Mul::Apply(x, x); });
  // a Function picked by a tensor's value: flag != 0 -> 2x, else 3x
  m.def("pick", [](const TensorPtr &x, const TensorPtr &flag) {
    return flag->contiguous()->data<double>()[0] != 0.0 ? ScaleBy<2>::Apply(x, flag) : ScaleBy<3>::Apply(x, flag);
  });
  // an epilogue after Apply: the output scaled by 10 in place, outside any Function
  m.def("post", [](const TensorPtr &x, const TensorPtr &y) {
    auto out = ScaleBy<1>::Apply(x, y);
    for (std::int64_t i = 0; i < out->numel(); ++i) out->data<double>()[i] *= 10.0;
    return out;
  });
  // a prologue before Apply: the input's negatives clamped to 0 in place, outside any Function
  m.def("pre", [](const TensorPtr &x, const TensorPtr &y) {
    for (std::int64_t i = 0; i < x->numel(); ++i) {
      if (x->data<double>()[i] < 0) x->data<double>()[i] = 0;
    }
    return ScaleBy<1>::Apply(x, y);
  });
  // two Functions: (x * y) * y, and the arguments handed over in another order
  m.def("mul_twice", [](const TensorPtr &x, const TensorPtr &y) { return Mul::Apply(Mul::Apply(x, y), y); });
  m.def("mul_swapped", [](const TensorPtr &x, const TensorPtr &y) { return ScaleBy<2>::Apply(y, x); });
  // a plain function pointer with a number argument: 2x for k > 0, else 3x
  m.def("scale_k", +[](const TensorPtr &x, double k) -> TensorPtr {
    return k > 0 ? ScaleBy<2>::Apply(x, x) : ScaleBy<3>::Apply(x, x);
  });
  // a result declared `const TensorPtr` (by value): recorded as a TensorPtr one
  m.def("scale_const", [](const TensorPtr &x) -> const TensorPtr { return ScaleBy<2>::Apply(x, x); });
  // an optional number: 2x with one, 3x without
  m.def("scale_opt", [](const TensorPtr &x, std::optional<double> k) {
    return k ? ScaleBy<2>::Apply(x, x) : ScaleBy<3>::Apply(x, x);
  });
  // a mutable function with state of its own: the n-th call, on any route, gives n * x (no Function)
  m.def("count_scale", [n = 0.0](const TensorPtr &x) mutable {
    n += 1;
    return Scaled(x, n);
  });
  m.def("dirty_twice", [](const TensorPtr &x) { return DirtyTwice::Apply(x); });
  m.def("scale3_", [](const TensorPtr &x) { return Scale3::Apply(x); });
  // a result a graph node cannot hold: a float (the trace stops; the call runs eagerly)
  m.def("total", [](const TensorPtr &x) {
    auto xc = x->contiguous();
    double s = 0;
    for (std::int64_t i = 0; i < xc->numel(); ++i) s += xc->data<double>()[i];
    return s;
  });
  // a list of tensors in, its pairwise products out (two Functions)
  m.def("products", [](const std::vector<TensorPtr> &xs) {
    return TensorPtrList{Mul::Apply(xs[0], xs[1]), Mul::Apply(xs[1], xs[2])};
  });
}

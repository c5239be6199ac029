// Operators written the way seed 003 writes them: flat loops over data<T>(),
// no thought given to strides. Function<T> must make them right for every
// view a user passes in and every gradient the engine hands to Backward.
// Also: a Function that opts in to views (kAcceptsViews) and walks strides
// itself, and an in-place op (MarkDirty).
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "binding_compat.h"  // py:: is pybind11 or nanobind, as the test builds it

using namespace opbuilder;

namespace {

void CheckSameShape(const TensorPtr &a, const TensorPtr &b, const char *op) {
  if (a->shape() != b->shape() || a->dtype() != b->dtype()) {
    throw std::invalid_argument(std::string(op) + ": expected two tensors of one shape and dtype");
  }
}

// out = a * b, a flat loop (the seed's kernel, on the CPU)
template <typename T>
TensorPtr FlatMul(const TensorPtr &a, const TensorPtr &b) {
  CheckSameShape(a, b, "mul");
  auto out = std::make_shared<Tensor>(a->dtype(), a->shape());
  const T *pa = a->data<T>();
  const T *pb = b->data<T>();
  T *po = out->data<T>();
  for (std::int64_t i = 0; i < out->numel(); ++i) po[i] = pa[i] * pb[i];
  return out;
}

TensorPtr Mul(const TensorPtr &a, const TensorPtr &b) {
  return a->dtype() == kFloat64 ? FlatMul<double>(a, b) : FlatMul<float>(a, b);
}

class SeedMul : public Function<SeedMul> {
 public:
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y) {
    auto out = Mul(x, y);
    const bool gx = ctx->NeedGrad(x), gy = ctx->NeedGrad(y);
    if (gx || gy) ctx->SaveForBackward({gx ? y : nullptr, gy ? x : nullptr});
    return out;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList grad_outputs) {
    auto saved = ctx->GetSavedTensors();
    auto dout = grad_outputs[0];
    return {ctx->NeedsInputGrad(0) ? Mul(dout, saved[0]) : nullptr,
            ctx->NeedsInputGrad(1) ? Mul(dout, saved[1]) : nullptr};
  }
};

// What the last SeedSquare Forward/Backward saw, for the tests.
struct Seen {
  bool forward_contiguous = false;
  bool saved_contiguous = false;
  bool saved_same_as_forward = false;
  bool grad_contiguous = false;
  const Tensor *forward_arg = nullptr;
};
Seen g_seen;

// x * x with a flat loop; Backward: 2 * x * dout, also flat.
class SeedSquare : public Function<SeedSquare> {
 public:
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    g_seen.forward_contiguous = x->is_contiguous();
    g_seen.forward_arg = x.get();
    ctx->SaveForBackward({x});
    return Mul(x, x);
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList grad_outputs) {
    auto x = ctx->GetSavedTensors()[0];
    auto dout = grad_outputs[0];
    g_seen.saved_contiguous = x->is_contiguous();
    g_seen.saved_same_as_forward = x.get() == g_seen.forward_arg;
    g_seen.grad_contiguous = dout->is_contiguous();
    auto two_x = std::make_shared<Tensor>(x->dtype(), x->shape());
    if (x->dtype() == kFloat64) {
      for (std::int64_t i = 0; i < x->numel(); ++i) two_x->data<double>()[i] = 2 * x->data<double>()[i];
    } else {
      for (std::int64_t i = 0; i < x->numel(); ++i) two_x->data<float>()[i] = 2 * x->data<float>()[i];
    }
    return {Mul(dout, two_x)};
  }
};

// Strides (in elements) of what the last ViewSquare Forward / Backward got.
std::vector<std::int64_t> g_view_forward_strides, g_view_grad_strides;

// Element `i` (flat, C order) of a float64 tensor of any strides.
double At(const Tensor &t, std::int64_t i) {
  const ShapeVector st = t.strides();
  std::int64_t off = 0;
  for (std::int64_t d = t.ndim(); d-- > 0;) {
    const std::int64_t n = t.shape()[static_cast<std::size_t>(d)];
    off += (i % n) * st[static_cast<std::size_t>(d)];
    i /= n;
  }
  return static_cast<const double *>(t.data_ptr())[off];
}

// x * x for float64, written for views: it asks for them and walks strides itself.
class ViewSquare : public Function<ViewSquare> {
 public:
  static constexpr bool kAcceptsViews = true;
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x) {
    g_view_forward_strides = x->strides();
    ctx->SaveForBackward({x});
    auto out = std::make_shared<Tensor>(kFloat64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = At(*x, i) * At(*x, i);
    return out;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList grad_outputs) {
    auto x = ctx->GetSavedTensors()[0];
    auto dout = grad_outputs[0];
    g_view_grad_strides = dout->strides();
    auto gx = std::make_shared<Tensor>(kFloat64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) gx->data<double>()[i] = 2 * At(*x, i) * At(*dout, i);
    return {gx};
  }
};

// x += y in place (x marked dirty), flat loops; float64.
class AddInPlace : public Function<AddInPlace> {
 public:
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y) {
    CheckSameShape(x, y, "add_");
    double *px = x->data<double>();
    const double *py = y->data<double>();
    for (std::int64_t i = 0; i < x->numel(); ++i) px[i] += py[i];
    ctx->MarkDirty({x});
    return x;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList grad_outputs) {
    return {grad_outputs[0], grad_outputs[0]};
  }
};

// Writes into x without declaring it (a bug in the op): Forward's private copy
// of a read-only input takes the write.
class SneakyWrite : public Function<SneakyWrite> {
 public:
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) {
    double *p = x->data<double>();
    for (std::int64_t i = 0; i < x->numel(); ++i) p[i] = -1.0;
    return Tensor::zeros(kFloat64, x->shape());
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList) { return {nullptr}; }
};

// Sums a list of same-shape tensors with a flat loop (TensorPtrList arguments are made contiguous too).
class SumList : public Function<SumList> {
 public:
  static TensorPtr Forward(AutogradContext *, const TensorPtrList &xs) {
    auto out = Tensor::zeros(kFloat64, xs.at(0)->shape());
    for (const auto &x : xs) {
      for (std::int64_t i = 0; i < out->numel(); ++i) out->data<double>()[i] += x->data<double>()[i];
    }
    return out;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList) { return {nullptr}; }
};

// floor(x) as int64: an integer output, which takes no gradient.
class FloorInt : public Function<FloorInt> {
 public:
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) {
    auto out = std::make_shared<Tensor>(kInt64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) {
      out->data<std::int64_t>()[i] = static_cast<std::int64_t>(x->data<double>()[i]);
    }
    return out;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList) {
    throw std::logic_error("FloorInt::Backward must never run: its output is an integer tensor");
  }
};

}  // namespace

OB_MODULE(m) {
  m.def("mul", [](const TensorPtr &x, const TensorPtr &y) { return SeedMul::Apply(x, y); });
  m.def("square", [](const TensorPtr &x) { return SeedSquare::Apply(x); });
  m.def("view_square", [](const TensorPtr &x) { return ViewSquare::Apply(x); });
  m.def("add_", [](const TensorPtr &x, const TensorPtr &y) { return AddInPlace::Apply(x, y); });
  m.def("sneaky_write", [](const TensorPtr &x) { return SneakyWrite::Apply(x); });
  m.def("floor_int", [](const TensorPtr &x) { return FloorInt::Apply(x); });
  m.def("sum_list", [](const TensorPtrList &xs) { return SumList::Apply(xs); });
  m.def("seen", []() {
    py::dict d;
    d["forward_contiguous"] = g_seen.forward_contiguous;
    d["saved_contiguous"] = g_seen.saved_contiguous;
    d["saved_same_as_forward"] = g_seen.saved_same_as_forward;
    d["grad_contiguous"] = g_seen.grad_contiguous;
    d["view_forward_strides"] = g_view_forward_strides;
    d["view_grad_strides"] = g_view_grad_strides;
    return d;
  });
  // No Function: the tensor exactly as passed, to show data<T>()'s check.
  m.def("raw_first", [](const TensorPtr &t) { return t->data<double>()[0]; });
  m.def("raw_first_c", [](const TensorPtr &t) { return *static_cast<double *>(t->data_c()); });
  m.def("raw_ptr_offset", [](const TensorPtr &a, const TensorPtr &b) {  // data_ptr() stays raw
    return static_cast<const char *>(b->data_ptr()) - static_cast<const char *>(a->data_ptr());
  });
  m.def("empty", [](const std::vector<std::int64_t> &shape) { return Tensor::empty(kFloat32, shape); });
}

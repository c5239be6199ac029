// Functions with a shape rule (static InferShape, Forward's arguments minus ctx), each bound with
// its companion "<name>_infer_shape" (Function<T>::InferShapeFunction()), and one whose rule lies
// (OPBUILDER_DEBUG catches it). Counters show that the companions run no kernel.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "binding_compat.h"  // py:: is pybind11 or nanobind, as the test builds it

using namespace opbuilder;

namespace {

std::int64_t g_forward_calls = 0;

void CheckFloat64(const TensorPtr &t, const char *op) {
  if (t->dtype() != kFloat64 || t->ndim() != 1) throw std::invalid_argument(std::string(op) + ": expected 1-D float64");
}

// out[i, j] = x[i] * y[j]
class Outer : public Function<Outer> {
 public:
  static ShapeVector InferShape(const TensorPtr &x, const TensorPtr &y) { return {x->numel(), y->numel()}; }
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y) {
    ++g_forward_calls;
    CheckFloat64(x, "outer");
    CheckFloat64(y, "outer");
    const std::int64_t n = x->numel(), m = y->numel();
    auto out = std::make_shared<Tensor>(kFloat64, ShapeVector{n, m});
    const double *px = x->data<double>(), *py = y->data<double>();
    double *po = out->data<double>();
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j < m; ++j) po[i * m + j] = px[i] * py[j];
    }
    ctx->SaveForBackward({x, y});
    return out;
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList grad_outputs) {
    auto saved = ctx->GetSavedTensors();
    const TensorPtr &x = saved[0], &y = saved[1], &g = grad_outputs[0];
    const std::int64_t n = x->numel(), m = y->numel();
    auto gx = Tensor::zeros(kFloat64, {n});
    auto gy = Tensor::zeros(kFloat64, {m});
    const double *px = x->data<double>(), *py = y->data<double>(), *pg = g->data<double>();
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j < m; ++j) {
        gx->data<double>()[i] += pg[i * m + j] * py[j];
        gy->data<double>()[j] += pg[i * m + j] * px[i];
      }
    }
    return {gx, gy};
  }
};

// x[:k] and x[k:] (two outputs, a plain argument)
class SplitAt : public Function<SplitAt> {
 public:
  static std::vector<ShapeVector> InferShape(const TensorPtr &x, std::int64_t k) {
    if (k < 0 || k > x->numel()) throw std::out_of_range("split_at: k out of range");
    return {{k}, {x->numel() - k}};
  }
  static TensorPtrList Forward(AutogradContext *, const TensorPtr &x, std::int64_t k) {
    ++g_forward_calls;
    CheckFloat64(x, "split_at");
    if (k < 0 || k > x->numel()) throw std::out_of_range("split_at: k out of range");
    auto a = std::make_shared<Tensor>(kFloat64, ShapeVector{k});
    auto b = std::make_shared<Tensor>(kFloat64, ShapeVector{x->numel() - k});
    for (std::int64_t i = 0; i < x->numel(); ++i) {
      (i < k ? a->data<double>()[i] : b->data<double>()[i - k]) = x->data<double>()[i];
    }
    return {a, b};
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) {
    const std::int64_t k = g[0]->numel(), n = k + g[1]->numel();
    auto gx = std::make_shared<Tensor>(kFloat64, ShapeVector{n});
    for (std::int64_t i = 0; i < n; ++i) gx->data<double>()[i] = i < k ? g[0]->data<double>()[i] : g[1]->data<double>()[i - k];
    return {gx, nullptr};
  }
};

// 2 * x, but its rule claims one element more.
class Liar : public Function<Liar> {
 public:
  static ShapeVector InferShape(const TensorPtr &x) { return {x->numel() + 1}; }
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) {
    ++g_forward_calls;
    CheckFloat64(x, "liar");
    auto out = std::make_shared<Tensor>(kFloat64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) out->data<double>()[i] = 2 * x->data<double>()[i];
    return out;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList g) { return {g[0]}; }
};

// Rounds float64 to int64: its rule's dtype (the first argument's) is not what Forward returns.
class ToInt : public Function<ToInt> {
 public:
  static ShapeVector InferShape(const TensorPtr &x) { return x->shape(); }
  static TensorPtr Forward(AutogradContext *, const TensorPtr &x) {
    ++g_forward_calls;
    CheckFloat64(x, "to_int");
    auto out = std::make_shared<Tensor>(kInt64, x->shape());
    for (std::int64_t i = 0; i < x->numel(); ++i) {
      out->data<std::int64_t>()[i] = static_cast<std::int64_t>(x->data<double>()[i]);
    }
    return out;
  }
  static TensorPtrList Backward(AutogradContext *, TensorPtrList) { return {nullptr}; }
};

}  // namespace

OB_MODULE(m) {
  m.def("outer", [](const TensorPtr &x, const TensorPtr &y) { return Outer::Apply(x, y); });
  m.def("outer_infer_shape", Outer::InferShapeFunction());
  m.def("split_at", [](const TensorPtr &x, std::int64_t k) { return SplitAt::Apply(x, k); });
  m.def("split_at_infer_shape", SplitAt::InferShapeFunction());
  m.def("liar", [](const TensorPtr &x) { return Liar::Apply(x); });
  m.def("liar_infer_shape", Liar::InferShapeFunction());
  m.def("to_int", [](const TensorPtr &x) { return ToInt::Apply(x); });
  m.def("forward_calls", []() { return g_forward_calls; });
}

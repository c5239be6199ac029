// Test operators for ms_extension.h's host custom::CustomLaunchAclnn (tests/seeds/test_aclnn_host.py):
// `launch` calls any operator with arguments from Python; `forms` spells the arguments as MindSpore
// sources do; a few Functions written MindSpore-style compose the operators in Forward and Backward.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ms_extension.h"

namespace py = pybind11;

namespace mindspore::pynative {
namespace autograd {
namespace {

TypeId DtypeNamed(const std::string &name) {
  for (int t = 0; t < opbuilder::kNumDataTypes; ++t) {
    if (name == opbuilder::DataTypeName(static_cast<TypeId>(t))) return static_cast<TypeId>(t);
  }
  throw std::invalid_argument("no dtype named " + name);
}

// A Python value as an aclnn argument: None (an absent tensor), bool, int, float, a list of ints (dims),
// a dtype name ("float32"), or a tensor.
custom::AclnnArg ToArg(const py::handle &h) {
  if (h.is_none()) return nullptr;
  if (py::isinstance<py::bool_>(h)) return h.cast<bool>();
  if (py::isinstance<py::int_>(h)) return h.cast<std::int64_t>();
  if (py::isinstance<py::float_>(h)) return h.cast<double>();
  if (py::isinstance<py::list>(h) || py::isinstance<py::tuple>(h)) return h.cast<std::vector<std::int64_t>>();
  if (py::isinstance<py::str>(h)) return DtypeNamed(h.cast<std::string>());
  return h.cast<BaseTensorPtr>();
}

BaseTensorPtr New(const BaseTensorPtr &like, ShapeVector shape) {
  return std::make_shared<BaseTensor>(like->data_type(), std::move(shape));
}

ShapeVector Broadcast(const ShapeVector &a, const ShapeVector &b) {
  ShapeVector r(std::max(a.size(), b.size()), 1);
  for (size_t i = 0; i < r.size(); ++i) {
    const int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1, db = i < b.size() ? b[b.size() - 1 - i] : 1;
    r[r.size() - 1 - i] = da == 1 ? db : da;
  }
  return r;
}

// y = x + alpha * other (aclnnAdd with alpha); backward: dout, alpha * dout (aclnnMuls).
class AddAlpha : public Function<AddAlpha> {
 public:
  static BaseTensorPtr Forward(AutogradContext *ctx, const BaseTensorPtr &x, const BaseTensorPtr &y, double alpha) {
    auto out = New(x, Broadcast(x->shape(), y->shape()));
    custom::CustomLaunchAclnn("aclnnAdd", {x, y, MakeValue(alpha)}, {out});
    ctx->saved_data["alpha"] = py::cast(alpha);
    return out;
  }
  static BaseTensorPtrList Backward(AutogradContext *ctx, BaseTensorPtrList grad_outputs) {
    auto dout = grad_outputs[0];
    auto gy = New(dout, dout->shape());
    custom::CustomLaunchAclnn("aclnnMuls", {dout, MakeValue(ctx->saved_data["alpha"].cast<double>())}, {gy});
    return {dout, gy, nullptr};
  }
};

// y = sum(exp(x), dims, keepDim=true) (aclnnExp, aclnnReduceSum); backward: dout * exp(x) (aclnnMul,
// dout broadcast over the summed dimensions).
class ExpSum : public Function<ExpSum> {
 public:
  static BaseTensorPtr Forward(AutogradContext *ctx, const BaseTensorPtr &x, const std::vector<int64_t> &dims) {
    auto e = New(x, x->shape());
    custom::CustomLaunchAclnn("aclnnExp", {x}, {e});
    ShapeVector kept = x->shape();
    for (auto d : dims) kept[static_cast<size_t>(d < 0 ? d + x->ndim() : d)] = 1;
    auto out = New(x, kept);
    custom::CustomLaunchAclnn("aclnnReduceSum", {e, MakeValue(dims), MakeValue(true),
                                                 MakeValue(x->data_type())}, {out});
    ctx->SaveForBackward({e});
    return out;
  }
  static BaseTensorPtrList Backward(AutogradContext *ctx, BaseTensorPtrList grad_outputs) {
    auto e = ctx->GetSavedTensors()[0];
    auto g = New(e, e->shape());
    custom::CustomLaunchAclnn("aclnnMul", {grad_outputs[0], e}, {g});
    return {g};
  }
};

// y = tanh(x); backward: dout * (1 - y * y) (aclnnMul, aclnnNeg, aclnnAdds).
class Tanh : public Function<Tanh> {
 public:
  static BaseTensorPtr Forward(AutogradContext *ctx, const BaseTensorPtr &x) {
    auto y = New(x, x->shape());
    custom::CustomLaunchAclnn("aclnnTanh", {x}, {y});
    ctx->SaveForBackward({y});
    return y;
  }
  static BaseTensorPtrList Backward(AutogradContext *ctx, BaseTensorPtrList grad_outputs) {
    auto y = ctx->GetSavedTensors()[0];
    auto t = New(y, y->shape());
    custom::CustomLaunchAclnn("aclnnMul", {y, y}, {t});
    custom::CustomLaunchAclnn("aclnnNeg", {t}, {t});
    custom::CustomLaunchAclnn("aclnnAdds", {t, 1, 1}, {t});
    auto g = New(y, y->shape());
    custom::CustomLaunchAclnn("aclnnMul", {grad_outputs[0], t}, {g});
    return {g};
  }
};

}  // namespace
}  // namespace autograd
}  // namespace mindspore::pynative

PYBIND11_MODULE(MS_EXTENSION_NAME, m) {
  using namespace mindspore;
  using namespace mindspore::pynative::autograd;
  m.def("launch", [](const std::string &name, const py::list &args, const tensor::BaseTensorPtrList &outs) {
    ValuePtrList inputs;
    for (const auto &a : args) inputs.push_back(ToArg(a));
    custom::CustomLaunchAclnn(name, inputs, outs);
  });
  // The argument forms of MindSpore sources, compiled as written: one result per form.
  m.def("forms", [](const tensor::BaseTensorPtr &x, const tensor::BaseTensorPtr &y) {
    tensor::BaseTensorPtrList r;
    auto out = [&](TypeId t, ShapeVector s) { return r.emplace_back(std::make_shared<tensor::BaseTensor>(t, s)); };
    custom::CustomLaunchAclnn("aclnnAdd", {x, y, MakeValue<int64_t>(1)}, {out(x->data_type(), x->shape())});
    custom::CustomLaunchAclnn("aclnnAdd", {x, y, MakeValue(2.5f)}, {out(x->data_type(), x->shape())});
    custom::CustomLaunchAclnn("aclnnSub", {x, y, 3}, {out(x->data_type(), x->shape())});
    custom::CustomLaunchAclnn("aclnnReduceSum",
                              {x, MakeValue(std::vector<int64_t>{0}), MakeValue(false), MakeValue(kNumberTypeFloat64)},
                              {out(kNumberTypeFloat64, ShapeVector(x->shape().begin() + 1, x->shape().end()))});
    ValuePtrList inputs{x, y};
    tensor::BaseTensorPtrList outputs{out(x->data_type(), x->shape())};
    custom::CustomLaunchAclnn("aclnnMul", inputs, outputs);
    return r;
  });
  m.def("add_alpha", [](const tensor::BaseTensorPtr &x, const tensor::BaseTensorPtr &y, double alpha) {
    return AddAlpha::Apply(x, y, alpha);
  });
  m.def("exp_sum", [](const tensor::BaseTensorPtr &x, const std::vector<int64_t> &dims) {
    return ExpSum::Apply(x, dims);
  });
  m.def("tanh", [](const tensor::BaseTensorPtr &x) { return Tanh::Apply(x); });
}

// Test operators for the extended dtypes (tests/test_dtypes_cpp.py): a Function whose kernels
// are written once with the OB_DISPATCH_* macros and run on float32/64, bfloat16 and complex;
// integer ops on uint16/32/64; tensors of every dtype made in C++ and returned to Python.
#include <complex>
#include <cstdint>
#include <string>

#include "opbuilder/extension.h"

using namespace opbuilder;

namespace {

void CheckPair(const TensorPtr &a, const TensorPtr &b, const char *op) {
  if (a->shape() != b->shape() || a->dtype() != b->dtype()) {
    throw detail::ValueError(std::string(op) + ": expected two tensors of one shape and dtype, got " +
                             DataTypeName(a->dtype()) + " and " + DataTypeName(b->dtype()));
  }
}

// a * b elementwise, or a * conj(b) (what a gradient multiplies by).
TensorPtr Multiply(const TensorPtr &a, const TensorPtr &b, bool conj_b) {
  CheckPair(a, b, "dtype_ops.mul");
  TensorPtr ac = a->contiguous(), bc = b->contiguous();
  auto out = std::make_shared<Tensor>(ac->dtype(), ac->shape());
  OB_DISPATCH_FLOATING_AND_COMPLEX_TYPES_AND_BF16(ac->dtype(), "dtype_ops.mul", [&] {
    const scalar_t *p = ac->data<scalar_t>();
    const scalar_t *q = bc->data<scalar_t>();
    scalar_t *o = out->data<scalar_t>();
    for (std::int64_t i = 0; i < ac->numel(); ++i) o[i] = p[i] * (conj_b ? Conj(q[i]) : q[i]);
  });
  return out;
}

// z = x * y; gradients (PyTorch's convention for complex): g * conj(y), g * conj(x).
class Mul : public Function<Mul> {
 public:
  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y) {
    ctx->SaveForBackward({x, y});
    return Multiply(x, y, false);
  }
  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList grad_outputs) {
    auto saved = ctx->GetSavedTensors();
    return {Multiply(grad_outputs[0], saved[1], true), Multiply(grad_outputs[0], saved[0], true)};
  }
};

// x + 1 for the integers, float32 and float64 (uint64 without going through a signed type).
TensorPtr AddOne(const TensorPtr &x) {
  TensorPtr xc = x->contiguous();
  auto out = std::make_shared<Tensor>(xc->dtype(), xc->shape());
  OB_DISPATCH_ALL_TYPES(xc->dtype(), "dtype_ops.add_one", [&] {
    const scalar_t *p = xc->data<scalar_t>();
    scalar_t *o = out->data<scalar_t>();
    for (std::int64_t i = 0; i < xc->numel(); ++i) o[i] = static_cast<scalar_t>(p[i] + scalar_t(1));
  });
  return out;
}

// The sum of a float32/float64 tensor as a double: the plainest dispatch, and its error.
double SumFloating(const TensorPtr &x) {
  TensorPtr xc = x->contiguous();
  return OB_DISPATCH_FLOATING_TYPES(xc->dtype(), "dtype_ops.sum_floating", [&] {
    const scalar_t *p = xc->data<scalar_t>();
    double s = 0;
    for (std::int64_t i = 0; i < xc->numel(); ++i) s += static_cast<double>(p[i]);
    return s;
  });
}

// [0, 1, ..., n-1] (real parts) made in C++ in the named dtype, handed to Python.
TensorPtr Iota(const std::string &name, std::int64_t n) {
  const DataType t = DataTypeFromName(name.c_str());
  auto out = std::make_shared<Tensor>(t == kTypeUnknown ? kFloat32 : t, ShapeVector{n});
  auto fill = [&](auto *o) {
    using T = std::remove_pointer_t<decltype(o)>;
    for (std::int64_t i = 0; i < n; ++i) o[i] = T(static_cast<float>(i));
  };
  if (t == kBFloat16) {
    fill(out->data<bfloat16>());
  } else {
    OB_DISPATCH_ALL_TYPES_AND_COMPLEX(t, "dtype_ops.iota", [&] { fill(out->data<scalar_t>()); });
  }
  return out;
}

// float32 -> bfloat16 with opbuilder::bfloat16's rounding, and back.
TensorPtr ToBFloat16(const TensorPtr &x) {
  TensorPtr xc = x->contiguous();
  auto out = std::make_shared<Tensor>(kBFloat16, xc->shape());
  const float *p = xc->data<float>();
  bfloat16 *o = out->data<bfloat16>();
  for (std::int64_t i = 0; i < xc->numel(); ++i) o[i] = bfloat16(p[i]);
  return out;
}

TensorPtr FromBFloat16(const TensorPtr &x) {
  TensorPtr xc = x->contiguous();
  auto out = std::make_shared<Tensor>(kFloat32, xc->shape());
  const bfloat16 *p = xc->data<bfloat16>();
  float *o = out->data<float>();
  for (std::int64_t i = 0; i < xc->numel(); ++i) o[i] = static_cast<float>(p[i]);
  return out;
}

}  // namespace

OB_MODULE(m) {
  m.def("mul", [](const TensorPtr &x, const TensorPtr &y) { return Mul::Apply(x, y); });
  m.def("add_one", &AddOne);
  m.def("sum_floating", &SumFloating);
  m.def("iota", &Iota);
  m.def("to_bfloat16", &ToBFloat16);
  m.def("from_bfloat16", &FromBFloat16);
  m.def("dtype_name", [](const TensorPtr &x) { return std::string(DataTypeName(x->dtype())); });
}

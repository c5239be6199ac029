// A broadcasting multiply (float32, float64) with its backward, on opbuilder's native API.
//
//   ops = CustomOpBuilder("my_ops", ["custom_src/function_ops.cpp"]).load()
//   z = ops.mul(x, y)        # runtime.Tensor in, runtime.Tensor out, no copies
//
// Backward returns dout * y and dout * x in the output's (broadcast) shape;
// the runtime sums each down to its input's shape. The kernel walks strides,
// so CustomMul takes views as they are (kAcceptsViews): a transpose or a
// broadcast input is never copied. A Function without kAcceptsViews gets
// C-contiguous tensors and may loop over data<T>() flat.
#include <stdexcept>
#include <string>
#include <vector>

#include "opbuilder/extension.h"

using namespace opbuilder;

namespace {

ShapeVector BroadcastShape(const ShapeVector &a, const ShapeVector &b) {
  ShapeVector out(std::max(a.size(), b.size()), 1);
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1;
    const int64_t db = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (da != db && da != 1 && db != 1) {
      throw std::invalid_argument("mul: shapes cannot be broadcast together (dimension " + std::to_string(da) +
                                  " vs " + std::to_string(db) + ")");
    }
    out[out.size() - 1 - i] = da == 1 ? db : da;
  }
  return out;
}

// Element strides of `t` seen as an array of shape `out` (0 where broadcast).
std::vector<int64_t> BroadcastStrides(const TensorPtr &t, const ShapeVector &out) {
  std::vector<int64_t> s(out.size(), 0);
  const ShapeVector st = t->strides();
  const size_t lead = out.size() - static_cast<size_t>(t->ndim());
  for (size_t i = 0; i < st.size(); ++i) {
    s[lead + i] = t->shape()[i] == 1 ? 0 : st[i];
  }
  return s;
}

template <typename T>
void MulKernel(const TensorPtr &x, const TensorPtr &y, const TensorPtr &out) {
  const T *px = static_cast<const T *>(x->data_ptr());  // x, y may be strided views
  const T *py = static_cast<const T *>(y->data_ptr());
  T *po = out->data<T>();
  const int64_t n = out->numel();
  if (x->is_contiguous() && y->is_contiguous() && x->shape() == y->shape()) {
    for (int64_t i = 0; i < n; ++i) po[i] = px[i] * py[i];
    return;
  }
  // General case: walk the output's index space with per-input strides.
  const ShapeVector &shape = out->shape();
  const auto sx = BroadcastStrides(x, shape);
  const auto sy = BroadcastStrides(y, shape);
  const size_t nd = shape.size();
  std::vector<int64_t> idx(nd, 0);
  int64_t ox = 0, oy = 0;
  for (int64_t i = 0; i < n; ++i) {
    po[i] = px[ox] * py[oy];
    for (size_t d = nd; d-- > 0;) {
      if (++idx[d] < shape[d]) {
        ox += sx[d];
        oy += sy[d];
        break;
      }
      ox -= sx[d] * (shape[d] - 1);
      oy -= sy[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

TensorPtr Mul(const TensorPtr &x, const TensorPtr &y) {
  if (x->dtype() != y->dtype() || (x->dtype() != kFloat32 && x->dtype() != kFloat64)) {
    throw std::invalid_argument(std::string("mul: expected two float32 or two float64 tensors, got ") +
                                DataTypeName(x->dtype()) + " and " + DataTypeName(y->dtype()));
  }
  auto out = std::make_shared<Tensor>(x->dtype(), BroadcastShape(x->shape(), y->shape()));
  if (x->dtype() == kFloat32) {
    MulKernel<float>(x, y, out);
  } else {
    MulKernel<double>(x, y, out);
  }
  return out;
}

}  // namespace

class CustomMul : public Function<CustomMul> {
 public:
  static constexpr bool kAcceptsViews = true;  // Mul handles any strides
  static constexpr bool kConstArgs = true;     // and writes neither input: to_jax lends it JAX's buffers

  static TensorPtr Forward(AutogradContext *ctx, const TensorPtr &x, const TensorPtr &y) {
    auto out = Mul(x, y);
    const bool gx = ctx->NeedGrad(x);
    const bool gy = ctx->NeedGrad(y);
    if (gx || gy) ctx->SaveForBackward({gx ? y : nullptr, gy ? x : nullptr});
    return out;
  }

  static TensorPtrList Backward(AutogradContext *ctx, TensorPtrList grad_outputs) {
    auto saved = ctx->GetSavedTensors();
    const TensorPtr &dout = grad_outputs[0];
    TensorPtr gx = ctx->NeedsInputGrad(0) ? Mul(dout, saved[0]) : nullptr;
    TensorPtr gy = ctx->NeedsInputGrad(1) ? Mul(dout, saved[1]) : nullptr;
    return {gx, gy};
  }
};

// nanobind (the builder sees OB_MODULE); PYBIND11_MODULE(OB_EXTENSION_NAME, m) builds with pybind11
OB_MODULE(m) {
  m.doc() = "Example operators written with opbuilder's Function API";
  m.def("mul", [](const TensorPtr &x, const TensorPtr &y) { return CustomMul::Apply(x, y); },
        "x * y with broadcasting (float32 or float64), differentiable in both");
}

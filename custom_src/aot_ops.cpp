// Example aot operators for runtime.ops.Custom (func "custom_src/aot_ops.cpp:<Symbol>"),
// each for float32 and float64:
//
//   LeakyRelu(x) -> y          slope: attribute "negative_slope" if the op has one, else 0.01
//   Square(x) -> x*x           with SquareGrad(x, dout) -> 2*x*dout for its bprop
//   SinCos(x) -> (sin x, cos x)   two outputs
//   ScaleShift(x) -> scale*x + shift   attributes read once, in ScaleShiftInit
//
// Status codes: 1 wrong parameter count, 2 unsupported dtype.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "opbuilder/aot.h"

namespace {

int64_t NumElements(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

bool IsDtype(const char *dtype, const char *name) { return std::strcmp(dtype, name) == 0; }

// Calls f(T{}) with T the element type named by `dtype` (float32 or float64); 2 otherwise.
template <typename F>
int ForFloat(const char *dtype, F &&f) {
  if (IsDtype(dtype, "float32")) return f(float{});
  if (IsDtype(dtype, "float64")) return f(double{});
  return 2;
}

// Element-wise y[i] = op(x[i]) over params[0] -> params[1].
template <typename Op>
int Unary(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, Op op) {
  if (nparam != 2) return 1;
  if (std::strcmp(dtypes[0], dtypes[1]) != 0) return 2;
  const int64_t n = NumElements(ndims[1], shapes[1]);
  return ForFloat(dtypes[0], [&](auto zero) {
    using T = decltype(zero);
    const T *x = static_cast<const T *>(params[0]);
    T *y = static_cast<T *>(params[1]);
    for (int64_t i = 0; i < n; ++i) y[i] = op(x[i]);
    return 0;
  });
}

struct ScaleShiftData : public AotKernelData {
  double scale = 1.0;
  double shift = 0.0;
};

}  // namespace

extern "C" int LeakyRelu(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                         void *stream, void *extra) {
  (void)stream;
  const AotExtra *ex = static_cast<AotExtra *>(extra);
  const double slope = ex->HasAttr("negative_slope") ? ex->Attr<double>("negative_slope") : 0.01;
  return Unary(nparam, params, ndims, shapes, dtypes, [slope](auto v) {
    using T = decltype(v);
    return v > T(0) ? v : static_cast<T>(slope) * v;
  });
}

extern "C" int Square(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                      void *extra) {
  (void)stream;
  (void)extra;
  return Unary(nparam, params, ndims, shapes, dtypes, [](auto v) { return v * v; });
}

extern "C" int SquareGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                          void *stream, void *extra) {
  (void)stream;
  (void)extra;
  if (nparam != 3) return 1;
  const int64_t n = NumElements(ndims[2], shapes[2]);
  return ForFloat(dtypes[0], [&](auto zero) {
    using T = decltype(zero);
    const T *x = static_cast<const T *>(params[0]);
    const T *dout = static_cast<const T *>(params[1]);
    T *dx = static_cast<T *>(params[2]);
    for (int64_t i = 0; i < n; ++i) dx[i] = T(2) * x[i] * dout[i];
    return 0;
  });
}

extern "C" int SinCos(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                      void *extra) {
  (void)stream;
  (void)extra;
  if (nparam != 3) return 1;
  const int64_t n = NumElements(ndims[0], shapes[0]);
  return ForFloat(dtypes[0], [&](auto zero) {
    using T = decltype(zero);
    const T *x = static_cast<const T *>(params[0]);
    T *s = static_cast<T *>(params[1]);
    T *c = static_cast<T *>(params[2]);
    for (int64_t i = 0; i < n; ++i) {
      s[i] = std::sin(x[i]);
      c[i] = std::cos(x[i]);
    }
    return 0;
  });
}

// Runs once, before the first ScaleShift call: reads the attributes and keeps them.
extern "C" int ScaleShiftInit(int *ndims, int64_t **shapes, const char **dtypes, AotExtra *extra) {
  (void)ndims;
  (void)shapes;
  if (!IsDtype(dtypes[0], "float32") && !IsDtype(dtypes[0], "float64")) return 2;
  auto *data = new ScaleShiftData;
  data->scale = extra->Attr<double>("scale");
  data->shift = extra->HasAttr("shift") ? extra->Attr<double>("shift") : 0.0;
  extra->SetKernelData(data);  // the runtime deletes it with the op
  return 0;
}

extern "C" int ScaleShift(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                          void *stream, void *extra) {
  (void)stream;
  const auto *data = static_cast<const ScaleShiftData *>(static_cast<AotExtra *>(extra)->KernelData());
  const double scale = data->scale, shift = data->shift;
  return Unary(nparam, params, ndims, shapes, dtypes, [scale, shift](auto v) {
    using T = decltype(v);
    return static_cast<T>(scale) * v + static_cast<T>(shift);
  });
}

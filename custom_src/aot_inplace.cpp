// An aot operator that writes one of its inputs: AssignAdd(x, y) adds y to x
// in place (as MindSpore's AssignAdd updates a variable) and returns the new
// value as its output. Its op-info declares the write, so the runtime checks
// that x may be written (a read-only array is refused with a ValueError) and
// bumps x's version:
//
//   info = (CustomRegOp("assign_add").input(0, "x", inplace=True).input(1, "y").output(0, "out")
//           .dtype_format(DataType.F32_Default, DataType.F32_Default, DataType.F32_Default)
//           .dtype_format(DataType.F64_Default, DataType.F64_Default, DataType.F64_Default).get_op_info())
//   assign_add = ops.Custom("custom_src/aot_inplace.cpp:AssignAdd", lambda x, y: x, lambda x, y: x, reg_info=info)
//   assign_add(x, y)   # x is now x + y; so is the output
//
// Without that declaration, a read-only x reaches the kernel as a private
// copy: the write lands there, and the caller's memory is untouched.
//
// Status codes: 1 wrong parameter count, 2 unsupported dtype, 3 y's size is not x's.
#include <cstdint>
#include <cstring>

namespace {

int64_t NumElements(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

template <typename T>
void AddInto(void **params, int64_t n) {
  T *x = static_cast<T *>(params[0]);
  const T *y = static_cast<const T *>(params[1]);
  T *out = static_cast<T *>(params[2]);
  for (int64_t i = 0; i < n; ++i) {
    x[i] += y[i];
    out[i] = x[i];
  }
}

}  // namespace

extern "C" int AssignAdd(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                         void *stream, void *extra) {
  (void)stream;
  (void)extra;
  if (nparam != 3) return 1;
  const int64_t n = NumElements(ndims[0], shapes[0]);
  if (NumElements(ndims[1], shapes[1]) != n || NumElements(ndims[2], shapes[2]) != n) return 3;
  for (int i = 1; i < nparam; ++i) {
    if (std::strcmp(dtypes[i], dtypes[0]) != 0) return 2;
  }
  if (std::strcmp(dtypes[0], "float32") == 0) {
    AddInto<float>(params, n);
  } else if (std::strcmp(dtypes[0], "float64") == 0) {
    AddInto<double>(params, n);
  } else {
    return 2;
  }
  return 0;
}

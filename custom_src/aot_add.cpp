// The seed tutorial's CustomAdd (an aot operator; its CUDA form is custom_add.cu),
// written for the CPU:
//
//   add = ops.Custom("custom_src/aot_add.cpp:CustomAdd", out_shape=[3], out_dtype=rt.float32,
//                    func_type="aot")
//   add(Tensor([1., 2., 3.]), Tensor([3., 2., 1.]))   # [4. 4. 4.]
//
// The C ABI: params holds the inputs, then the outputs (allocated by the
// runtime, C-contiguous); ndims/shapes/dtypes describe each. 0 means success;
// any other status becomes a RuntimeError naming this symbol and the status.
#include <cstdint>
#include <cstring>

extern "C" int CustomAdd(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                         void *stream, void *extra) {
  (void)stream;
  (void)extra;
  constexpr int kOutput = 2;
  if (nparam != 3) return 1;
  for (int i = 0; i < nparam; ++i) {
    if (std::strcmp(dtypes[i], "float32") != 0) return 2;
  }
  const float *x = static_cast<const float *>(params[0]);
  const float *y = static_cast<const float *>(params[1]);
  float *out = static_cast<float *>(params[kOutput]);
  int64_t size = 1;
  for (int d = 0; d < ndims[kOutput]; ++d) size *= shapes[kOutput][d];
  for (int d = 0; d < 2; ++d) {  // inputs must hold as many elements as the output
    int64_t n = 1;
    for (int k = 0; k < ndims[d]; ++k) n *= shapes[d][k];
    if (n != size) return 3;
  }
  for (int64_t i = 0; i < size; ++i) out[i] = x[i] + y[i];
  return 0;
}

// The seed tutorial's CustomAdd as a CUDA aot operator (backend "GPU": built
// with nvcc). `stream` is the CUDA stream to launch on.
//
//   add = ops.Custom("custom_src/custom_add.cu:CustomAdd", out_shape=[n], out_dtype=rt.float32,
//                    func_type="aot")
#include <cstdint>
#include <cstring>

#include <cuda_runtime.h>

namespace {
constexpr int kThreads = 256;

__global__ void CustomAddKernel(const float *x, const float *y, float *out, int64_t size) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < size) out[i] = x[i] + y[i];
}
}  // namespace

extern "C" int CustomAdd(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                         void *stream, void *extra) {
  (void)extra;
  constexpr int kOutput = 2;
  if (nparam != 3) return 1;
  for (int i = 0; i < nparam; ++i) {
    if (std::strcmp(dtypes[i], "float32") != 0) return 2;
  }
  int64_t size = 1;
  for (int d = 0; d < ndims[kOutput]; ++d) size *= shapes[kOutput][d];
  if (size == 0) return 0;
  const unsigned blocks = static_cast<unsigned>((size + kThreads - 1) / kThreads);
  CustomAddKernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const float *>(params[0]), static_cast<const float *>(params[1]),
      static_cast<float *>(params[kOutput]), size);
  return cudaGetLastError() == cudaSuccess ? 0 : 4;
}

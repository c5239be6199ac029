// y = x * x + s * x and its gradient, as CUDA kernels: the .cu Function op of
// cuda_function_ops.cu and its PyTorch twin (benchmarks/torch_cuda_square_plus.cu)
// run these same kernels, so benchmarks/gpu.py compares the frameworks' overhead only.
#pragma once
#include <cstdint>

namespace square_plus {

constexpr int kThreads = 256;

__global__ void Forward(const double *x, double s, double *y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * x[i] + s * x[i];
}

__global__ void Backward(const double *x, const double *g, double s, double *dx, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dx[i] = g[i] * (2.0 * x[i] + s);
}

inline unsigned Blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace square_plus

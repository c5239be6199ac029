// The torch peers' forward (benchmarks/torch_plain_mul.cpp, torch_function_mul.cpp): bench::MulKernel on
// two float32 tensors of one shape, into a new tensor.
#pragma once

#include <torch/extension.h>

#include "mul_kernel.h"

namespace bench {

inline torch::Tensor Mul(const torch::Tensor &x, const torch::Tensor &y) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat && y.scalar_type() == torch::kFloat && x.sizes() == y.sizes(),
              "mul: expected two float32 tensors of one shape");
  torch::Tensor xc = x.contiguous(), yc = y.contiguous();
  torch::Tensor out = torch::empty_like(xc);
  bench::MulKernel(xc.data_ptr<float>(), yc.data_ptr<float>(), out.data_ptr<float>(), xc.numel());
  return out;
}

}  // namespace bench

// The kernel every benchmark operator runs: out[i] = x[i] * y[i] over
// contiguous float32 buffers of one shape. Shared by the opbuilder and the
// PyTorch operator so that the two differ only in their calling machinery.
#pragma once

#include <cstdint>

namespace bench {

inline void MulKernel(const float *x, const float *y, float *out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = x[i] * y[i];
}

}  // namespace bench

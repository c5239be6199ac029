// The two loops of Swish, y = x * sigmoid(x), and its gradient: shared by examples/swish_op.cpp,
// examples/swish_xla_op.cpp and benchmarks/torch_swish.cpp (torch's side of benchmarks/train.py runs the
// very same loops). Plain C++: no opbuilder or torch type.
#pragma once

#include <cmath>
#include <cstdint>

namespace swish {

template <typename T>
void Forward(const T *x, T *y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (T(1) + std::exp(-x[i]));
}

// dx = dy * (s + x * s * (1 - s)), s = sigmoid(x)
template <typename T>
void Backward(const T *x, const T *dy, T *dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T s = T(1) / (T(1) + std::exp(-x[i]));
    dx[i] = dy[i] * (s + x[i] * s * (T(1) - s));
  }
}

}  // namespace swish

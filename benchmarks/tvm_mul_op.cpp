// The benchmark's tvm-ffi counterpart of custom_src/function_ops.cpp (benchmarks/builder.py's peer
// column): the same float32/float64 multiply of two tensors of one shape, built by
// tvm_ffi.cpp.load. Forward only: tvm-ffi has no autograd Function, so this side compiles
// less than the other two (say so next to its figures).
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include <cstdint>

namespace {

template <typename T>
void MulKernel(tvm::ffi::TensorView x, tvm::ffi::TensorView y, tvm::ffi::TensorView out) {
  const T *a = static_cast<const T *>(x.data_ptr());
  const T *b = static_cast<const T *>(y.data_ptr());
  T *o = static_cast<T *>(out.data_ptr());
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) o[i] = a[i] * b[i];
}

void Mul(tvm::ffi::TensorView x, tvm::ffi::TensorView y, tvm::ffi::TensorView out) {
  TVM_FFI_CHECK(x.numel() == y.numel() && x.numel() == out.numel(), ValueError) << "mul: shapes differ";
  TVM_FFI_CHECK(x.dtype().code == kDLFloat && x.dtype().bits == y.dtype().bits, TypeError)
      << "mul: expected two float32 or two float64 tensors";
  if (x.dtype().bits == 32) {
    MulKernel<float>(x, y, out);
  } else {
    MulKernel<double>(x, y, out);
  }
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(mul, Mul);

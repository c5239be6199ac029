// tvm-ffi's counterpart of an operator that allocates its result, for benchmarks/interop.py's peer
// columns: bench::MulKernel over two float32 tensors of one shape, the output allocated through
// tvm-ffi's environment allocator (the caller's framework: torch's, for torch tensors). Forward
// only: tvm-ffi has no autograd. Built -O3 by tvm_ffi.cpp.load.
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

#include "mul_kernel.h"

namespace {

tvm::ffi::Tensor Mul(tvm::ffi::TensorView x, tvm::ffi::TensorView y) {
  TVM_FFI_CHECK(x.dtype().code == kDLFloat && x.dtype().bits == 32 && y.dtype().code == kDLFloat &&
                    y.dtype().bits == 32 && x.numel() == y.numel() && x.IsContiguous() && y.IsContiguous(),
                TypeError)
      << "mul: expected two contiguous float32 tensors of one shape";
  tvm::ffi::Tensor out = tvm::ffi::Tensor::FromEnvAlloc(TVMFFIEnvTensorAlloc, x.shape(), x.dtype(), x.device());
  bench::MulKernel(static_cast<const float *>(x.data_ptr()), static_cast<const float *>(y.data_ptr()),
                   static_cast<float *>(out.data_ptr()), x.numel());
  return out;
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(mul, Mul);

// CUDA helpers for operator authors: the runtime's current stream and error checks.
//
// Included by opbuilder/extension.h when compiling with nvcc (__CUDACC__) or
// when OPBUILDER_WITH_CUDA is defined (a host .cpp of a GPU build that
// launches kernels declared elsewhere); CPU builds never see CUDA headers.
//
//   cudaStream_t s = opbuilder::cuda::CurrentStream();   // the stream ops run on now
//   MyKernel<<<blocks, threads, 0, s>>>(...);
//   OB_CUDA_CHECK(cudaGetLastError());                    // a CUDA error -> a Python RuntimeError
#pragma once

#include "opbuilder/detail/visibility.h"

#include <Python.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "opbuilder/detail/tensor_details.h"

namespace opbuilder {
namespace cuda {

// A CUDA error as a C++ exception; both binding layers raise it as RuntimeError with this text.
class CudaError : public std::runtime_error {
 public:
  CudaError(cudaError_t code, const char *expr, const char *file, int line)
      : std::runtime_error(std::string("CUDA error ") + cudaGetErrorName(code) + ": " + cudaGetErrorString(code) +
                           " (" + expr + " at " + file + ":" + std::to_string(line) + ")"),
        code_(code) {}
  cudaError_t code() const { return code_; }

 private:
  cudaError_t code_;
};

// The runtime's current stream (runtime.cuda.current_stream(); set with runtime.cuda.stream(s));
// inside a call through to_torch's bridge, torch's (torch.cuda.current_stream()). Launch on it so a
// Function op is ordered with the ops before and after it.
inline cudaStream_t CurrentStream() { return reinterpret_cast<cudaStream_t>(detail::CurrentDeviceStream()); }

}  // namespace cuda
}  // namespace opbuilder

// Evaluates a CUDA runtime call; anything but cudaSuccess throws opbuilder::cuda::CudaError.
// The runtime also records a failed call as the thread's last error; it is cleared here (it is
// reported by the exception), or the next op's OB_CUDA_CHECK(cudaGetLastError()) would raise it again.
#define OB_CUDA_CHECK(expr)                                                      \
  do {                                                                           \
    const cudaError_t ob_cuda_status_ = (expr);                                  \
    if (ob_cuda_status_ != cudaSuccess) {                                        \
      static_cast<void>(cudaGetLastError());                                     \
      throw ::opbuilder::cuda::CudaError(ob_cuda_status_, #expr, __FILE__, __LINE__); \
    }                                                                            \
  } while (0)

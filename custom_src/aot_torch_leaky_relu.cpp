// Calling a PyTorch ATen operator from an aot operator (the seed tutorial's
// leaky_relu.cpp): the runtime's buffers are wrapped as ATen tensors without
// copying, and torch::leaky_relu_out writes straight into the output.
//
//   import torch, os
//   tlib = os.path.join(os.path.dirname(torch.__file__), "lib")
//   tinc = os.path.join(os.path.dirname(torch.__file__), "include")
//   lib = opbuilder.build_library("aot_torch_leaky_relu", ["custom_src/aot_torch_leaky_relu.cpp"],
//                                 cflags=["-isystem", tinc],
//                                 ldflags=[f"-L{tlib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{tlib}"])
//   leaky_relu = ops.Custom(f"{lib}:LeakyRelu", out_shape=lambda x: x, out_dtype=lambda x: x)
//
// Only the ATen headers this file uses are included (about 7 s to compile,
// against 15 s for <torch/types.h> and more for <torch/extension.h>).
#include <cstdint>
#include <cstring>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/leaky_relu.h>

// <torch/types.h> makes ATen's functions torch::<name> with exactly this line.
namespace torch {
using namespace at;  // NOLINT(build/namespaces)
}  // namespace torch

namespace {

bool ScalarTypeOf(const char *dtype, c10::ScalarType *out) {
  static const struct {
    const char *name;
    c10::ScalarType type;
  } kTypes[] = {{"float16", c10::kHalf}, {"float32", c10::kFloat}, {"float64", c10::kDouble},
                {"int8", c10::kChar},    {"int16", c10::kShort},   {"int32", c10::kInt},
                {"int64", c10::kLong},   {"uint8", c10::kByte},    {"bool", c10::kBool}};
  for (const auto &t : kTypes) {
    if (std::strcmp(dtype, t.name) == 0) {
      *out = t.type;
      return true;
    }
  }
  return false;
}

// Every param as an ATen CPU tensor over the runtime's memory (no copy).
bool AsTensors(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
               std::vector<at::Tensor> *out) {
  for (int i = 0; i < nparam; ++i) {
    c10::ScalarType type;
    if (!ScalarTypeOf(dtypes[i], &type)) return false;
    out->push_back(at::from_blob(params[i], c10::IntArrayRef(shapes[i], static_cast<size_t>(ndims[i])),
                                 at::TensorOptions().dtype(type).device(c10::kCPU)));
  }
  return true;
}

}  // namespace

extern "C" int LeakyRelu(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                         void *stream, void *extra) {
  (void)stream;
  (void)extra;
  if (nparam != 2) return 1;
  try {  // an exception must not cross the C ABI
    std::vector<at::Tensor> tensors;
    if (!AsTensors(nparam, params, ndims, shapes, dtypes, &tensors)) return 2;
    torch::leaky_relu_out(tensors[1], tensors[0]);  // negative_slope 0.01
  } catch (const std::exception &) {
    return 3;
  }
  return 0;
}

// The floors of benchmarks/binding_call.py, built by the builder with the operator's flags and bound
// with nanobind against the same prebuilt libnanobind (OB_MODULE): `floor_mul`, a bare nanobind
// function that takes two float32 numpy arrays and returns a new one (what any call on arrays must
// do: read two buffers, allocate the output, hand it back), and `bench_floor_mul`, a C function the
// benchmark calls through ctypes with prebuilt arguments (a call with no conversions at all).
// Neither touches opbuilder's Tensor or autograd: the difference to the operator is what they add.
#include <cstddef>
#include <cstdint>

#include <nanobind/ndarray.h>

#include "mul_kernel.h"
#include "opbuilder/extension.h"

namespace nb = nanobind;

extern "C" __attribute__((visibility("default"))) void bench_floor_mul(const float *x, const float *y, float *out,
                                                                       std::int64_t n) {
  bench::MulKernel(x, y, out, n);
}

using Array = nb::ndarray<float, nb::numpy, nb::c_contig, nb::device::cpu>;

OB_MODULE(m) {
  m.def("floor_mul", [](Array x, Array y) {
    if (x.size() != y.size()) throw nb::value_error("floor_mul: expected two arrays of one size");
    const std::size_t n = x.size();
    float *data = new float[n];
    nb::capsule owner(data, [](void *p) noexcept { delete[] static_cast<float *>(p); });
    bench::MulKernel(x.data(), y.data(), data, static_cast<std::int64_t>(n));
    std::size_t shape[1] = {n};
    return Array(data, 1, shape, owner);
  });
}

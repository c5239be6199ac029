// Test operators exercising opbuilder's C++ Tensor API and the Python bridge.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "opbuilder/extension.h"
#include "ms_extension.h"

namespace py = pybind11;
using namespace opbuilder;

namespace {
std::uintptr_t g_last_alloc = 0;
}

PYBIND11_MODULE(OB_EXTENSION_NAME, m) {
  // the MindSpore names' sizes: DataSize() counts elements, Size() bytes; data_c() is the data
  m.def("ms_sizes", [](const mindspore::tensor::BaseTensorPtr &t) {
    return py::make_tuple(t->DataSize(), t->Size(), t->data_c() == t->data_ptr(),
                          t->data_type() == mindspore::TypeId::kNumberTypeFloat64);
  });
  m.def("data_ptr", [](const TensorPtr &t) { return reinterpret_cast<std::uintptr_t>(t->data_ptr()); });
  m.def("info", [](const TensorPtr &t) {
    py::dict d;
    d["shape"] = t->shape();
    d["strides"] = t->strides();
    d["dtype"] = std::string(DataTypeName(t->dtype()));
    d["same_dtype"] = t->dtype() == t->data_type();
    d["numel"] = t->numel();
    d["ndim"] = t->ndim();
    d["nbytes"] = t->nbytes();
    d["contiguous"] = t->is_contiguous();
    d["requires_grad"] = t->requires_grad();
    d["device"] = t->device();
    return d;
  });
  m.def("identity", [](const TensorPtr &t) { return t; });
  m.def("arange", [](std::int64_t n) {
    auto t = std::make_shared<Tensor>(kFloat32, ShapeVector{n});
    float *p = t->data<float>();
    for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(i);
    g_last_alloc = reinterpret_cast<std::uintptr_t>(t->data_ptr());
    return t;
  });
  m.def("last_alloc", []() { return g_last_alloc; });
  m.def("fill_", [](const TensorPtr &t, double v) {  // writes through the shared buffer
    auto *p = t->data<double>();
    for (std::int64_t i = 0; i < t->numel(); ++i) p[i] = v;
  });
  m.def("contiguous", [](const TensorPtr &t) { return t->contiguous(); });
  // x (2-d) transposed, over a copy of its memory: a new tensor with other than contiguous strides
  m.def("transposed_copy", [](const TensorPtr &x) {
    TensorPtr c = x->contiguous_copy();
    const std::int64_t n = x->shape()[0], k = x->shape()[1];
    return std::make_shared<Tensor>(x->dtype(), ShapeVector{k, n}, ShapeVector{1, k}, c->data_ptr(), c->storage());
  });
  m.def("zeros", [](const ShapeVector &shape, int dtype) { return Tensor::zeros(static_cast<DataType>(dtype), shape); });
  m.def("empty_like", [](const TensorPtr &t) { return Tensor::empty_like(t); });
  m.def("read_double", [](const TensorPtr &t) { return t->data<double>()[0]; });
  m.def("count", [](const TensorPtrList &ts) { return ts.size(); });
  m.def("pair", [](const TensorPtr &t) { return TensorPtrList{t, Tensor::zeros_like(t)}; });
  m.def("half_roundtrip", [](float f) { return static_cast<float>(Half(f)); });
  m.def("half_bits", [](float f) { return Half(f).bits; });
  m.def("throw_", [](const std::string &kind) {
    if (kind == "invalid_argument") throw std::invalid_argument("bad argument from C++");
    if (kind == "out_of_range") throw std::out_of_range("index out of range from C++");
    throw std::runtime_error("runtime failure from C++");
  });
}

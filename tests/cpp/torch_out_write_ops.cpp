// Functions that write an argument they do not declare (to_torch's ``mutates``), for
// tests/test_torch_out_writes.py: the out= pattern returning nothing (add_out), one returning a new
// tensor while it writes an argument it does not return (add_ret_out), one writing nothing (add), and
// copy_out for any dtype.
#include <cstdint>
#include <cstring>

#include "opbuilder/extension.h"

using opbuilder::Tensor;
using opbuilder::TensorPtr;

namespace {

template <typename T>
void Sum(const TensorPtr &x, const TensorPtr &y, const TensorPtr &out) {
  const T *a = x->data<T>(), *b = y->data<T>();
  T *o = out->data<T>();
  for (std::int64_t i = 0; i < out->numel(); ++i) o[i] = a[i] + b[i];
}

void AddOut(const TensorPtr &x, const TensorPtr &y, const TensorPtr &out) { Sum<double>(x, y, out); }

// x + y as a new tensor, also written into `out`
TensorPtr AddRetOut(const TensorPtr &x, const TensorPtr &y, const TensorPtr &out) {
  Sum<double>(x, y, out);
  auto r = std::make_shared<Tensor>(x->dtype(), x->shape());
  Sum<double>(x, y, r);
  return r;
}

TensorPtr Add(const TensorPtr &x, const TensorPtr &y) {
  auto r = std::make_shared<Tensor>(x->dtype(), x->shape());
  Sum<double>(x, y, r);
  return r;
}

// x's bytes into `out` (any dtype, the same size): returns nothing
void CopyOut(const TensorPtr &x, const TensorPtr &out) {
  std::memcpy(out->data_ptr(), x->data_ptr(), static_cast<std::size_t>(x->nbytes()));
}

}  // namespace

OB_MODULE(m) {
  m.def("add_out", &AddOut);
  m.def("add_ret_out", &AddRetOut);
  m.def("add", &Add);
  m.def("copy_out", &CopyOut);
}

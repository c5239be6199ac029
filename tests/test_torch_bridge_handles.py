"""How to_torch's C++ bridge holds torch tensors (src/torch_bridge.cpp): an argument the operator reads is held by
a reference to its Python object, a tensor made in C++ by a reference to its TensorImpl, and the output over the
kernel's memory is a TensorImpl made directly. Each reference is dropped once: no argument outlives its last user,
and none goes before it (a tensor saved for backward after the caller dropped it)."""
from __future__ import annotations

import gc
import sys
import threading
import weakref

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

import opbuilder  # noqa: E402

pytestmark = pytest.mark.build


@pytest.fixture
def ops(bridged_mul):
    return bridged_mul


def _fast(fn) -> int:
    return fn.bridged[0].fast_calls


TRANSPOSED = r"""
#include <cstring>
#include "opbuilder/extension.h"
using namespace opbuilder;
// x (m, n, C order) as a new (n, m) tensor with strides (1, n): x's transpose, not contiguous
TensorPtr Transposed(const TensorPtr &x) {
  auto copy = Tensor::empty(x->dtype(), x->shape());
  std::memcpy(copy->data_ptr(), x->data_ptr(), x->nbytes());
  const std::int64_t m = x->shape()[0], n = x->shape()[1];
  return std::make_shared<Tensor>(x->dtype(), ShapeVector{n, m}, ShapeVector{1, n}, copy->data_ptr(), copy->storage());
}
OB_MODULE(mod) { mod.def("transposed", &Transposed); }
"""


@pytest.fixture(scope="module")
def strided_ops(cache_dir):
    return opbuilder.load_inline("torch_bridge_strided_ops", TRANSPOSED)


# x * y, with y unpacked only after the module's `hook()` ran: Python code the function runs between the
# Op call's check of its arguments and its own unpacking of y
AFTER_PYTHON = r"""
#include "opbuilder/extension.h"
namespace nb = nanobind;
using namespace opbuilder;
OB_MODULE(mod) {
  mod.attr("hook") = nb::none();
  const nb::handle self = mod;  // the module lives for the process (sys.modules)
  mod.def("mul_after_python", [self](const TensorPtr &x, nb::object y) {
    nb::object hook = self.attr("hook");
    if (!hook.is_none()) hook();
    const TensorPtr yt = nb::cast<TensorPtr>(y);
    auto out = Tensor::empty(x->dtype(), x->shape());
    const double *a = x->data<double>(), *b = yt->data<double>();
    double *o = out->data<double>();
    for (std::int64_t i = 0; i < out->numel(); ++i) o[i] = a[i] * b[i];
    return out;
  });
}
"""


@pytest.fixture(scope="module")
def after_python_ops(cache_dir):
    return opbuilder.load_inline("torch_bridge_after_python_ops", AFTER_PYTHON)


def test_an_argument_unpacked_after_python_ran_is_read_as_it_is_then(after_python_ops, torch_bridge, monkeypatch):
    """The Op call checks its arguments when it begins; the function unpacks ``y`` only after Python code
    made it a negative view (``y.data = ...``). Its values must arrive negated, as torch reads them (on
    1e1eee8 the bridge trusted its earlier check: the op read the raw memory, without the sign)."""
    monkeypatch.setenv("OPBUILDER_TORCH_BRIDGE", "1")
    fn = opbuilder.to_torch(after_python_ops).mul_after_python
    x, y = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    for _ in range(3):
        fn(x, y)
    before = _fast(fn)

    def make_negative():
        y.data = torch.randn(3, dtype=torch.complex128).conj().imag

    monkeypatch.setattr(after_python_ops, "hook", make_negative)
    z = fn(x, y)
    assert _fast(fn) == before + 1
    assert y.is_neg()
    torch.testing.assert_close(z, x * y, rtol=0, atol=0)


def test_fast_calls_hold_no_argument_after_they_return(ops):
    x, y = torch.randn(3), torch.randn(3)
    counts = sys.getrefcount(x), sys.getrefcount(y)
    before = _fast(ops.mul)
    for _ in range(50):
        ops.mul(x, y)
    with torch.no_grad():
        ops.mul(x.requires_grad_(), y)
    assert _fast(ops.mul) == before + 51
    assert (sys.getrefcount(x), sys.getrefcount(y)) == counts
    wx, wy = weakref.ref(x), weakref.ref(y)
    del x, y
    gc.collect()
    assert wx() is None and wy() is None


def test_an_argument_the_caller_dropped_lives_while_its_node_needs_it(ops):
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = torch.tensor([4.0, 5.0, 6.0])
    wy = weakref.ref(y)
    before = _fast(ops.mul)
    z = ops.mul(x, y)  # the node saves y
    assert _fast(ops.mul) == before + 1
    del y
    gc.collect()
    assert wy() is not None  # the saved tensor holds it
    z.sum().backward()
    assert x.grad.tolist() == [4.0, 5.0, 6.0]
    del z
    gc.collect()
    assert wy() is None  # freed with the graph


def test_outputs_of_every_shape_are_torch_tensors_over_the_kernels_memory(ops):
    for shape in ((), (0,), (2, 3)):  # 0-d, empty, and a matrix
        x, y = torch.full(shape, 2.0), torch.full(shape, 3.0)
        for _ in range(2):  # the first call defines the signature; the second is the bridge's
            z = ops.mul(x, y)
        assert z.shape == shape and z.is_contiguous() and z.dtype == torch.float32
        assert z.untyped_storage().nbytes() == 4 * z.numel()
        torch.testing.assert_close(z, x * y)
    x = torch.arange(6.0).reshape(2, 3).t()  # a transposed view in
    for _ in range(2):
        z = ops.mul(x, x)
    torch.testing.assert_close(z, x * x)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.complex64, torch.bool))
def test_a_strided_output_keeps_its_strides_and_memory(strided_ops, torch_bridge, monkeypatch, dtype):
    monkeypatch.setenv("OPBUILDER_TORCH_BRIDGE", "1")
    fn = opbuilder.to_torch(strided_ops).transposed
    x = torch.arange(6).reshape(2, 3).to(dtype)
    fn(x.clone())
    before = _fast(fn)
    z = fn(x)
    assert _fast(fn) == before + 1
    assert z.shape == (3, 2) and z.stride() == (1, 3) and z.dtype == dtype and not z.is_contiguous()
    assert z.untyped_storage().nbytes() == 6 * x.element_size()
    assert torch.equal(z, x.t())
    if dtype == torch.bool:  # its memory is its own: torch may write it, and x stays as it was
        z.logical_not_()
        assert torch.equal(z, ~x.t())
    else:
        z.mul_(2)
        assert torch.equal(z, x.t() * 2)
    assert torch.equal(x, torch.arange(6).reshape(2, 3).to(dtype))


def test_threads_drop_what_they_hold(ops):
    x, y = torch.randn(4, requires_grad=True), torch.tensor([1.0, 2.0, 3.0, 4.0])  # sums exact in float32
    counts = sys.getrefcount(x), sys.getrefcount(y)
    errors = []

    def work():
        try:
            for _ in range(50):
                ops.mul(x, y).sum().backward()
        except BaseException as e:  # reported below
            errors.append(e)
    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    torch.testing.assert_close(x.grad, 150 * y)
    gc.collect()
    assert (sys.getrefcount(x), sys.getrefcount(y)) == counts

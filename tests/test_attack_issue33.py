"""Attack round on issue 33 (one semantics for every route): cases where one route gives other numbers
than torch's rule or than the runtime's eager call. Each test names the route and the reference.
Operators: tests/cpp/parity_ops.cpp (mul saves its inputs, scale_ is MarkDirty x *= 3, ident)."""
from __future__ import annotations

import re

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, jit

from op_util import CPP, load_op

pytestmark = pytest.mark.build


@pytest.fixture(scope="session")
def parity_ops(cache_dir):
    return load_op("parity_ops", [CPP / "parity_ops.cpp"])


def _f64(*a) -> Tensor:
    return Tensor(np.array(a, dtype=np.float64))


# ---- runtime.jit: a replayed detach() is no view of its input ------------------------------------
def test_a_replayed_detach_passes_no_gradient_after_its_input_is_written(parity_ops):
    """x.detach() under jit: the first call and eager give a plain leaf; a replay gave a view of x, so a
    write into x rebuilt the detached tensor's history from x's and the gradient flowed through it."""
    ops = parity_ops
    detach = jit(lambda x: x.detach())

    def loss(w, det):
        x = ops.mul(w, _f64(1.0, 1.0))  # a non-leaf
        d = det(x)  # no gradient may flow through d
        ops.scale_(x)  # a write into d's source
        return (ops.mul(d, _f64(5.0, 7.0))).sum()

    def grad_w(det):
        return rt.grad(lambda w: loss(w, det))(Tensor(np.array([1.0, 2.0]), requires_grad=True)).asnumpy()

    np.testing.assert_array_equal(grad_w(lambda x: x.detach()), [0.0, 0.0])
    for _ in range(3):  # the tracing call, then replays
        np.testing.assert_array_equal(grad_w(detach), [0.0, 0.0])


def test_a_replayed_detach_is_written_as_eagers_is(parity_ops):
    """Writing what a jitted `x.detach()` returned: eager (and the first call) write x; a replay refused
    it as "a view of a leaf that requires grad"."""
    detach = jit(lambda x: x.detach())
    for _ in range(3):
        x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
        parity_ops.scale_(detach(x))
        np.testing.assert_array_equal(x.asnumpy(), [3.0, 6.0])


# ---- torch routes ----------------------------------------------------------------------------------
torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")
import opbuilder  # noqa: E402


@pytest.mark.parametrize("view", ["neg bit (z.conj().imag)", "neg view (torch._neg_view)"])
def test_a_markdirty_write_into_a_neg_bit_view_is_refused_and_writes_nothing(parity_ops, torch_route, view):
    """torch's v.mul_(3) on a view with the negative or conjugate bit writes its base; to_torch's scale_ got
    a resolved copy and dropped the write silently (base and view unchanged, no error). The operator cannot
    reach such a view's memory (numpy has no negative bit), so the write is refused with a named error, on
    the first call of a signature and later ones, and nothing changes. (A conjugate view is refused alike.)"""
    ops = opbuilder.to_torch(parity_ops)

    def make():
        if view.startswith("neg bit"):
            z = torch.tensor([1 + 1j, 2 - 2j], dtype=torch.complex128)
            return z, z.conj().imag
        b = torch.tensor([1.0, -2.0], dtype=torch.float64)
        return b, torch._neg_view(b)

    for _ in range(2):  # the first call of a signature, then the route's later calls
        base, v = make()
        before = base.clone()
        with pytest.raises(RuntimeError, match=re.escape(
                "scale_ modifies argument 0 in place (MarkDirty), but it is a negative view (z.conj(), "
                "z.conj().imag, torch._neg_view), which an operator gets as a resolved copy: the write would not "
                "reach it. Write into a resolved tensor instead (x.resolve_neg(), x.resolve_conj() or x.clone()); "
                "the argument is unchanged") + "$"):
            ops.scale_(v)
        assert torch.equal(base, before)
    r, = [ops.scale_(make()[1].resolve_neg().resolve_conj())]  # the fix the message names works
    assert r.is_neg() is False


def test_a_second_backward_without_retain_graph_raises_on_the_registered_path(parity_ops, monkeypatch):
    """torch's own ops, the C++ bridge and runtime eager refuse a second backward through freed saved
    tensors; the registered path (OPBUILDER_TORCH_BRIDGE=0) ran it again."""
    monkeypatch.setenv("OPBUILDER_TORCH_BRIDGE", "0")
    ops = opbuilder.to_torch(parity_ops)
    x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    z = ops.mul(x, torch.tensor([3.0, 4.0], dtype=torch.float64)).sum()
    torch.autograd.grad(z, x)
    with pytest.raises(RuntimeError, match="a second time"):
        torch.autograd.grad(z, x)


def test_a_read_only_input_a_function_wrote_anyway_counts_the_write(parity_ops):
    """scale_ accepts views and so gets read-only memory itself; it writes without checking is_writable().
    The call is refused, but the memory did change: the write is counted, so a gradient that saved that
    memory refuses to read it (before: the refused call was invisible, and the gradient read the new
    values silently)."""
    a = np.arange(1.0, 5.0)
    a.flags.writeable = False
    t = rt.from_numpy(a)
    x = Tensor(np.ones(4), requires_grad=True)
    z = parity_ops.mul(x, t)
    before = t._version
    with pytest.raises(ValueError, match=r"is read-only memory .* its values have changed"):
        parity_ops.scale_(t)
    assert t._version == before + 1
    with pytest.raises(RuntimeError, match=r"saved for backward by ParityMul \(saved slot 1\) has been modified by an "
                                           r"in-place operation: it is at version 1, but was saved at version 0"):
        z.sum().backward()

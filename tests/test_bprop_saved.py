"""A user's bprop (``ops.Custom(bprop=)``, ``Cell.bprop``) reads its inputs and the forward's outputs at
backward time: they are what it saved (issue 33, classes 5 and 13). A write into one of them between the
forward and the backward is a named error (torch's rule for saved tensors), never a gradient from the new
values; inside ``saved_tensors_hooks`` they go through the pack hook at the forward and bprop reads what
unpack returns. Pure Python: nothing here compiles."""
from __future__ import annotations

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, nn, ops

from inplace_util import central


def _mul(x, y):
    return x * y


def _mul_bprop(x, y, out, dout):
    return dout * y, dout * x


class MulCell(nn.Cell):
    def construct(self, x, y):
        return x * y

    def bprop(self, x, y, out, dout):
        return dout * y, dout * x


class ExpCell(nn.Cell):
    """A bprop that reads ``out`` (exp's gradient is its output)."""

    def construct(self, x):
        return rt.ops.exp(x)

    def bprop(self, x, out, dout):
        return (dout * out,)


def _custom_mul():
    return ops.Custom(_mul, lambda a, b: a, lambda a, b: a, func_type="pyfunc", bprop=_mul_bprop)


MULS = {"ops.Custom": (_custom_mul, "Custom(_mul) bprop"), "Cell.bprop": (MulCell, "MulCell.bprop")}


def _pair():
    return Tensor(np.array([1.0, 2.0]), requires_grad=True), Tensor(np.array([3.0, 4.0]))


@pytest.mark.parametrize("kind", list(MULS))
def test_the_gradient_matches_central_differences(kind):
    make, _ = MULS[kind]
    op = make()
    x0, y0 = np.array([0.5, -1.5, 2.0]), np.array([3.0, 0.25, -2.0])
    x = Tensor(x0.copy(), requires_grad=True)
    (op(x, Tensor(y0)) * Tensor(x0)).sum().backward()  # d/dx sum(x*y*c) = y*c
    want = central(lambda a: float(np.sum(a * y0 * x0)), x0.copy())
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-7)


@pytest.mark.parametrize("kind", list(MULS))
@pytest.mark.parametrize("write", ["+=", "view", "assign"])
def test_an_input_written_after_the_forward_is_refused(kind, write):
    make, name = MULS[kind]
    x, y = _pair()
    z = make()(x, y)
    if write == "+=":
        y += 10
    elif write == "view":
        v = y[1:]
        v *= 10  # through a view of the input: its counter is the input's
    else:
        ops.assign(y, Tensor(np.array([7.0, 7.0])))
    with pytest.raises(RuntimeError) as e:
        z.sum().backward()
    assert str(e.value) == (f"one of the tensors needed for gradient computation has been modified by an in-place "
                            f"operation: input 1 of {name} is at version 1; expected version 0 (its bprop reads it)")
    assert x.grad is None


def test_an_output_written_after_the_forward_is_refused():
    x = Tensor(np.array([0.0, 1.0]), requires_grad=True)
    z = ExpCell()(x)
    with rt.no_grad():
        z *= 3  # the memory bprop's `out` reads
    with pytest.raises(RuntimeError) as e:
        z.sum().backward()
    assert str(e.value) == ("one of the tensors needed for gradient computation has been modified by an in-place "
                            "operation: output 0 of ExpCell.bprop is at version 1; expected version 0 "
                            "(its bprop reads it)")


def test_unwritten_inputs_and_outputs_pass_and_writes_before_the_forward_count_for_nothing():
    x, y = _pair()
    y += 1  # before the forward: its version then is the one saved
    z = MulCell()(x, y)
    z.sum().backward()
    assert x.grad.numpy().tolist() == [4.0, 5.0]


def _copying(packed):
    def pack(t):
        packed.append(t.numpy().tolist())
        return Tensor(t.numpy().copy())
    return rt.autograd.saved_tensors_hooks(pack, lambda p: p)


@pytest.mark.parametrize("kind", list(MULS))
def test_inside_saved_tensors_hooks_bprop_reads_what_unpack_returns(kind):
    make, _ = MULS[kind]
    x, y = _pair()
    packed = []
    with _copying(packed):
        z = make()(x, y)
    assert packed == [[1.0, 2.0], [3.0, 4.0], [3.0, 8.0]]  # the inputs, then the output
    y += 10  # no error: bprop reads the hook's copy, as torch's saved tensors under hooks
    z.sum().backward()
    assert x.grad.numpy().tolist() == [3.0, 4.0]


def test_hooks_give_bprop_out_through_unpack():
    x = Tensor(np.array([0.0, 1.0]), requires_grad=True)
    with rt.autograd.saved_tensors_hooks(lambda t: t, lambda p: Tensor(np.full(2, 5.0))):
        z = ExpCell()(x)
    z.sum().backward()
    assert x.grad.numpy().tolist() == [5.0, 5.0]
    with rt.autograd.saved_tensors_hooks(lambda t: t, lambda p: "not a tensor"):
        z = ExpCell()(x)
    with pytest.raises(TypeError) as e:
        z.sum().backward()
    assert str(e.value) == ("ExpCell.bprop: the saved_tensors_hooks unpack hook returned a str for input 0; "
                            "it must return a runtime.Tensor")


def test_a_second_order_gradient_reaches_an_unpacked_input():
    """create_graph=True: the unpacked y keeps y's history, so d(dz/dx)/dy = 1 as without hooks."""
    for hooks in (False, True):
        x = Tensor(np.array([2.0]), requires_grad=True)
        y = Tensor(np.array([3.0]), requires_grad=True)
        if hooks:
            with rt.autograd.saved_tensors_hooks(lambda t: Tensor(t.numpy().copy()), lambda p: p):
                z = MulCell()(x, y)
        else:
            z = MulCell()(x, y)
        (gx,) = rt.autograd.grad(z.sum(), (x,), create_graph=True)
        assert gx.numpy().tolist() == [3.0]
        (gy,) = rt.autograd.grad(gx.sum(), (y,))
        assert gy.numpy().tolist() == [1.0], hooks


def _twice(x):
    y = x * 2.0
    return y, y


def _and_head(x):
    y = x * 2.0
    return y, y[:2]


@pytest.mark.parametrize("pyfunc", [_twice, _and_head], ids=["same_array_twice", "array_and_its_view"])
@pytest.mark.parametrize("jit", [False, True])
def test_pyfunc_outputs_over_one_memory_count_writes_together(pyfunc, jit):
    """A pyfunc's outputs over one memory share a version counter (a C++ Function's ``{y, y}`` does): a
    write through the second is seen by another node that saved the first. Before, the gradient of
    ``(a * w).sum()`` read the written values ([0, 20, 40] for [0, 2, 4]), with no error."""
    op = ops.Custom(pyfunc, func_type="pyfunc")
    call = rt.jit(lambda t: op(t)) if jit else op
    for _ in range(2):  # with jit: the first call, then a replay
        x = Tensor(np.arange(3.0))
        w = Tensor(np.ones(3), requires_grad=True)
        a, b = call(x)
        assert np.shares_memory(a.asnumpy(), b.asnumpy())
        loss = (a * w).sum()  # saves a
        b *= 10.0  # writes a's memory too
        assert a._version == b._version == 1
        with pytest.raises(RuntimeError, match="modified by an in-place operation"):
            loss.backward()
    x = Tensor(np.arange(3.0))  # unwritten: the gradient is a's values
    w = Tensor(np.ones(3), requires_grad=True)
    a, _ = op(x)
    (a * w).sum().backward()
    np.testing.assert_allclose(w.grad.asnumpy(), central(lambda v: float(np.sum(v * np.arange(3.0) * 2.0)),
                                                         np.ones(3)), rtol=1e-7, atol=1e-9)


def test_pyfunc_outputs_over_other_memory_keep_their_own_counters():
    op = ops.Custom(lambda x: (x * 2.0, x * 3.0), func_type="pyfunc")
    a, b = op(Tensor(np.arange(3.0)))
    b *= 10.0
    assert (a._version, b._version) == (0, 1)


def test_pyfunc_views_of_one_array_that_do_not_overlap_share_its_counter():
    """``y[:2], y[2:], y``: the two halves share no byte, but both are views of y, as in torch (one counter
    per memory). Before, ``y[2:]`` kept a counter of its own and a write through y gave w.grad [40, 60]."""
    op = ops.Custom(lambda x: ((x * 2.0)[:2], (x * 2.0)[2:], x * 2.0), func_type="pyfunc")  # three arrays
    head, tail, whole = op(Tensor(np.arange(4.0)))
    whole *= 10.0
    assert (head._version, tail._version, whole._version) == (0, 0, 1)  # three memories: three counters

    def halves(x):
        y = x * 2.0
        return y[:2], y[2:], y

    head, tail, whole = ops.Custom(halves, func_type="pyfunc")(Tensor(np.arange(4.0)))
    w = Tensor(np.ones(2), requires_grad=True)
    loss = (tail * w).sum()  # saves tail
    whole *= 10.0
    assert head._version == tail._version == whole._version == 1
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        loss.backward()


def test_a_pyfunc_gets_inputs_it_does_not_declare_read_only():
    """Before, ``a += 1`` inside the pyfunc wrote the caller's tensor (or a broadcast's base) with no version
    counted: a node that had saved it took the new values for its gradient."""
    def bump(a):
        a += 1.0
        return a * 2.0

    x = Tensor(np.arange(3.0))
    with pytest.raises(ValueError, match="read-only"):
        ops.Custom(bump, func_type="pyfunc")(x.broadcast_to((2, 3)))
    with pytest.raises(ValueError, match="read-only"):
        ops.Custom(bump, func_type="pyfunc")(x)
    assert x.tolist() == [0.0, 1.0, 2.0] and x._version == 0

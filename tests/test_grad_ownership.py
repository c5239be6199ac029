"""Gradients handed to the user own their memory; saved arguments returned unchanged are
version-checked through both names; a None gradient is a zero gradient (issue 20: 2, 7, 10).

C++ operators: tests/cpp/grad_ownership_ops.cpp, built once per session.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import runtime as rt
from runtime import Parameter, Tensor, nn, ops
from runtime.autograd import Function

CPP = Path(__file__).resolve().parent / "cpp"


@pytest.fixture(scope="session")
def own_ops(cache_dir):
    from opbuilder import CustomOpBuilder
    return CustomOpBuilder("grad_ownership_ops", [str(CPP / "grad_ownership_ops.cpp")],
                           cflags=["-Wall", "-Wextra", "-Werror"]).load()


def f64(*values):
    return Tensor(np.array(values, dtype=np.float64))


def address(t) -> int:
    return t._data.__array_interface__["data"][0]


def assert_private(grads, *others):
    """No two of ``grads`` overlap in memory, nor any of them with ``others`` (arrays)."""
    arrays = [g._data for g in grads]
    for i, a in enumerate(arrays):
        for b in arrays[i + 1:] + [o for o in others]:
            assert not np.shares_memory(a, b)


# ---- an argument returned unchanged, saved, then written --------------------------------
class SquareAndSelf(Function):
    """(x * x, x); saves x."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return Tensor(x.asnumpy() ** 2), x

    @staticmethod
    def backward(ctx, g0, g1):
        x, = ctx.saved_tensors
        return 2 * x * g0 + g1


def _square_and_self(kind, request):
    return request.getfixturevalue("own_ops").square_and_self if kind == "cpp" else SquareAndSelf.apply


@pytest.mark.parametrize("kind", ["cpp", "py"])
@pytest.mark.parametrize("through", ["argument", "output"])
def test_a_saved_argument_returned_unchanged_and_written_is_a_version_error(request, kind, through):
    leaf = f64(1.0, 2.0, 3.0)
    leaf.requires_grad_(True)
    x = leaf * 1
    y, same = _square_and_self(kind, request)(x)
    assert same is not x and np.shares_memory(same._data, x._data)
    with rt.no_grad():
        (x if through == "argument" else same).__iadd__(10)
    with pytest.raises(RuntimeError, match=r"saved for backward by SquareAndSelf \(saved slot 0\) has been "
                                           r"modified by an in-place operation: it is at version 1, but was "
                                           r"saved at version 0"):
        (y.sum() + same.sum()).backward()


@pytest.mark.parametrize("kind", ["cpp", "py"])
def test_a_saved_argument_returned_unchanged_gives_the_right_gradient(request, kind):
    op = _square_and_self(kind, request)
    x = f64(1.0, -2.0, 0.5)
    assert rt.gradcheck(lambda a: op(a * 1), [x])
    leaf = f64(1.0, 2.0, 3.0)
    leaf.requires_grad_(True)
    y, same = op(leaf * 1)
    (y.sum() + (same * 3).sum()).backward()
    np.testing.assert_allclose(leaf.grad.asnumpy(), [5.0, 7.0, 9.0])


# ---- None for an input that needs a gradient: a zero gradient, for all three ------------
class NoneForW(Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(w)
        return Tensor(x.asnumpy() * w.asnumpy())

    @staticmethod
    def backward(ctx, g):
        w, = ctx.saved_tensors
        return g * w, None


def _none_for_second(kind, request):
    if kind == "cpp":
        own_ops = request.getfixturevalue("own_ops")
        return lambda a, b: own_ops.mul_modes(a, b, "null")
    if kind == "py":
        return NoneForW.apply
    return ops.Custom(lambda x, y: x * y, lambda a, b: a, lambda a, b: a, func_type="pyfunc",
                      bprop=lambda x, y, out, dout: (dout * y, None))


@pytest.mark.parametrize("kind", ["cpp", "py", "bprop"])
def test_none_for_an_input_that_needs_a_gradient_is_a_zero_gradient(request, kind):
    op = _none_for_second(kind, request)
    x, w = f64(1.0, 2.0), f64(3.0, 4.0)
    gx, gw = rt.grad(lambda a, b: op(a, b).sum(), (0, 1))(x, w)
    np.testing.assert_array_equal(gx.asnumpy(), [3.0, 4.0])
    np.testing.assert_array_equal(gw.asnumpy(), [0.0, 0.0])
    # another path to w still counts; backward() leaves .grad of w alone (as PyTorch)
    gx, gw = rt.grad(lambda a, b: (op(a, b) + b * 2).sum(), (0, 1))(x, w)
    np.testing.assert_array_equal(gw.asnumpy(), [2.0, 2.0])
    w.requires_grad_(True)
    op(x, w).sum().backward()
    assert w.grad is None


def test_a_wrong_count_of_gradients_is_still_an_error_naming_the_function():
    class TooMany(Function):
        @staticmethod
        def forward(ctx, x):
            return Tensor(x.asnumpy() * 2)

        @staticmethod
        def backward(ctx, g):
            return g * 2, g

    x = f64(1.0)
    x.requires_grad_(True)
    with pytest.raises(RuntimeError, match=r"backward of TooMany returned 2 gradients, but its forward took 1 "
                                           r"arguments"):
        TooMany.apply(x).sum().backward()

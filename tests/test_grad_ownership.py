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


# ---- within one pass: gradients that are views of each other ----------------------------
class TransposePlus(nn.Cell):
    def __init__(self):
        super().__init__()
        self.a = Parameter(Tensor(np.arange(6.0).reshape(2, 3)), name="a")
        self.b = Parameter(Tensor(np.ones((3, 2))), name="b")

    def construct(self, x):
        return ((self.a.T + self.b) * x).sum()


def test_value_and_grad_gradients_that_view_one_buffer_are_separate():
    net = TransposePlus()
    x = Tensor(np.full((3, 2), 2.0))
    _, (ga, gb) = rt.value_and_grad(net, grad_position=None, weights=net.trainable_params())(x)
    assert_private([ga, gb])
    ga *= 0.5
    gb *= 0.5
    np.testing.assert_array_equal(ga.asnumpy(), np.full((2, 3), 1.0))
    np.testing.assert_array_equal(gb.asnumpy(), np.full((3, 2), 1.0))


def test_backward_gradients_that_view_one_buffer_are_separate():
    a = Tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    b = Tensor(np.ones((3, 2)), requires_grad=True)
    (a.T + b).sum().backward()
    assert_private([a.grad, b.grad])


def test_a_gradient_that_views_the_callers_gradient_is_copied():
    a = Tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    seed = np.ones((3, 2))
    y = a.T * 1
    (ga,) = rt.autograd.grad(y.T, [a], grad_outputs=[Tensor(seed.T)])
    assert_private([ga], seed)


def test_memory_is_compared_exactly_not_by_owner():
    from runtime.autograd.ownership import claim
    buf = np.zeros(10)
    claimed = {}
    assert claim(claimed, buf[:5]) and claim(claimed, buf[5:])  # disjoint views of one buffer
    assert not claim(claimed, buf[4:6])  # overlaps both
    assert not claim(claimed, buf[::-1][:2])  # the last two elements, reversed
    assert claim(claimed, np.zeros(3)) and not claim(claimed, buf.reshape(2, 5).T)


# ---- Python Functions and bprops whose backward returns memory held elsewhere -----------
class _SavedMul(Function):
    """x * w, saving both; the classes below differ only in their backward."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return Tensor(x.asnumpy() * w.asnumpy())



class ReturnsSaved(_SavedMul):
    """x * w; gives w the saved x as its gradient (right for a seed of ones)."""

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w, x


class ReturnsFresh(_SavedMul):
    """x * w with the usual gradients; remembers where w's gradient was made."""

    last = 0

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gw = Tensor(g.asnumpy() * x.asnumpy()).reshape(x.shape)  # a view of a fresh array
        ReturnsFresh.last = address(gw)
        return g * w, gw


class ReturnsIncoming(Function):
    """x + w: both get the incoming gradient itself."""

    @staticmethod
    def forward(ctx, x, w):
        return Tensor(x.asnumpy() + w.asnumpy())

    @staticmethod
    def backward(ctx, g):
        return g, g


class ReturnsKept(_SavedMul):
    """x * w with the usual gradients; keeps w's gradient on ctx too."""

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        ReturnsKept.kept = g * x
        return g * w, ReturnsKept.kept


def test_a_function_returning_a_gradient_it_also_keeps_gives_a_copy():
    x, w = f64(1.0, 2.0, 3.0), f64(4.0, 5.0, 6.0)
    w.requires_grad_(True)
    ReturnsKept.apply(x, w).sum().backward()
    assert_private([w.grad], ReturnsKept.kept._data)
    np.testing.assert_array_equal(w.grad.asnumpy(), [1.0, 2.0, 3.0])


def test_a_function_returning_its_saved_input_as_a_gradient_gives_a_copy():
    x, w = f64(1.0, 2.0, 3.0), f64(4.0, 5.0, 6.0)
    w.requires_grad_(True)
    ReturnsSaved.apply(x, w).sum().backward()
    np.testing.assert_array_equal(w.grad.asnumpy(), [1.0, 2.0, 3.0])
    assert_private([w.grad], x._data)
    w.grad *= 0
    np.testing.assert_array_equal(x.asnumpy(), [1.0, 2.0, 3.0])


def test_a_function_returning_its_saved_input_gives_value_and_grad_a_copy():
    x, w = f64(1.0, 2.0, 3.0), f64(4.0, 5.0, 6.0)
    gx, gw = rt.grad(lambda a, b: ReturnsSaved.apply(a, b).sum(), (0, 1))(x, w)
    assert_private([gx, gw], x._data, w._data)
    np.testing.assert_array_equal(gw.asnumpy(), [1.0, 2.0, 3.0])


def test_a_function_returning_one_incoming_gradient_twice_gives_two_buffers():
    x, w = f64(1.0, 2.0), f64(3.0, 4.0)
    gx, gw = rt.grad(lambda a, b: ReturnsIncoming.apply(a, b).sum(), (0, 1))(x, w)
    assert_private([gx, gw])
    np.testing.assert_array_equal(gw.asnumpy(), [1.0, 1.0])


def test_a_fresh_gradient_of_a_function_is_handed_out_without_a_copy():
    x, w = f64(1.0, 2.0, 3.0), f64(4.0, 5.0, 6.0)
    w.requires_grad_(True)
    ReturnsFresh.apply(x, w).sum().backward()
    assert address(w.grad) == ReturnsFresh.last
    np.testing.assert_array_equal(w.grad.asnumpy(), [1.0, 2.0, 3.0])


def test_a_function_returning_its_saved_input_in_a_higher_order_pass_keeps_the_graph():
    x, w = f64(1.0, 2.0, 3.0), f64(4.0, 5.0, 6.0)
    x.requires_grad_(True)
    w.requires_grad_(True)
    gx, gw = rt.autograd.grad(ReturnsSaved.apply(x, w).sum(), [x, w], create_graph=True)
    assert_private([gx, gw], x._data, w._data)
    (ggx,) = rt.autograd.grad(gw.sum(), [x])  # gw is x: d(sum x)/dx is ones
    np.testing.assert_array_equal(ggx.asnumpy(), [1.0, 1.0, 1.0])


def test_a_bprop_returning_an_input_or_its_output_gives_a_copy():
    op = ops.Custom(lambda x, y: x * y, lambda a, b: a, lambda a, b: a, func_type="pyfunc",
                    bprop=lambda x, y, out, dout: (out, x))  # right where x, y, dout are ones
    x, y = f64(1.0, 1.0), f64(1.0, 1.0)
    gx, gy = rt.grad(lambda a, b: op(a, b).sum(), (0, 1))(x, y)
    assert_private([gx, gy], x._data, y._data)
    np.testing.assert_array_equal(gy.asnumpy(), [1.0, 1.0])


class CellReturnsInput(nn.Cell):
    def construct(self, x, y):
        return x * y

    def bprop(self, x, y, out, dout):
        return dout * y, x  # y's gradient is x: right for a seed of ones


def test_a_cell_bprop_returning_an_input_gives_a_copy():
    x, y = f64(2.0, 3.0), f64(4.0, 5.0)
    y.requires_grad_(True)
    CellReturnsInput()(x, y).sum().backward()
    assert_private([y.grad], x._data)
    y.grad *= 0
    np.testing.assert_array_equal(x.asnumpy(), [2.0, 3.0])


# ---- C++ Functions --------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["saved", "kept", "incoming", "incoming_view"])
def test_a_cpp_gradient_held_elsewhere_is_handed_out_as_a_copy(own_ops, mode):
    x, y = f64(1.0, 1.0, 1.0), f64(4.0, 5.0, 6.0)  # x of ones: every mode gives y the right gradient
    gx, gy = rt.grad(lambda a, b: own_ops.mul_modes(a, b, mode).sum(), (0, 1))(x, y)
    assert_private([gx, gy], x._data, y._data)
    np.testing.assert_array_equal(gy.asnumpy(), [1.0, 1.0, 1.0])
    y.requires_grad_(True)
    own_ops.mul_modes(x, y, mode).sum().backward()
    assert_private([y.grad], x._data)
    if mode == "kept":
        y.grad *= 0
        assert own_ops.kept_sum() == 3.0


def test_a_fresh_cpp_gradient_is_handed_out_without_a_copy(own_ops):
    x, y = f64(1.0, 2.0, 3.0), f64(4.0, 5.0, 6.0)
    y.requires_grad_(True)
    own_ops.mul_modes(x, y, "fresh").sum().backward()
    assert address(y.grad) == own_ops.last_ptr()
    np.testing.assert_array_equal(y.grad.asnumpy(), [1.0, 2.0, 3.0])


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


@pytest.mark.parametrize("kind", [pytest.param("cpp", marks=pytest.mark.build), "py"])
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


@pytest.mark.parametrize("kind", [pytest.param("cpp", marks=pytest.mark.build), "py"])
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


@pytest.mark.parametrize("kind", [pytest.param("cpp", marks=pytest.mark.build), "py", "bprop"])
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

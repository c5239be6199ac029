"""One object at two positions is two values to jit, as it is eagerly: an op returning the same tensor twice
(``return o, o`` in a Python Function, a Cell with bprop or a pyfunc with bprop, ``return {out, out}`` in a
C++ Function) gives each position its own gradient, under jit and GRAPH_MODE as without them."""
from __future__ import annotations

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, jit, mint, nn, ops
from runtime.autograd.gradcheck import gradcheck

from op_util import CPP, load_op
from jit_ops import Twice

RNG = np.random.default_rng(31)
CA, CB = RNG.standard_normal(5), RNG.standard_normal(5)  # the loss's weights on output 0 and output 1


@pytest.fixture(scope="module")
def counted(cache_dir):
    return load_op("jit_counted_ops", [CPP / "jit_counted_ops.cpp"], cflags=["-Wall", "-Wextra", "-Werror"])


class TwiceCell(nn.Cell):
    """k * x returned twice by a Cell whose bprop weighs the two output gradients by k and w."""

    def __init__(self, k, w):
        super().__init__()
        self.k, self.w = k, w

    def construct(self, x):
        o = x * self.k
        return o, o

    def bprop(self, x, out, dout):
        return (dout[0] * self.k + dout[1] * self.w,)


def twice_custom(k, w):
    def fwd(a):
        o = a * k
        return o, o

    def bprop(a, out, dout):
        return (dout[0] * k + dout[1] * w,)

    return ops.Custom(fwd, out_shape=lambda s: (s, s), out_dtype=lambda d: (d, d), func_type="pyfunc",
                      bprop=bprop)


def twice_ops(counted):
    """name -> op(x, k, w) returning (k x, k x) as one object at two positions."""
    cells = {}
    return {
        "function": lambda x, k, w: Twice.apply(x, k, w),
        "cell_bprop": lambda x, k, w: cells.setdefault((k, w), TwiceCell(k, w))(x),
        "pyfunc_bprop": lambda x, k, w: cells.setdefault(("c", k, w), twice_custom(k, w))(x),
        "cpp_function": lambda x, k, w: counted.twice(x, k, w),
    }


KINDS = ["function", "cell_bprop", "pyfunc_bprop", "cpp_function"]


def loss_of(op, k, w):
    def loss(x):
        a, b = op(x, k, w)
        return mint.sum(a * Tensor(CA) + b * Tensor(CB))
    return loss


@pytest.mark.parametrize("kind", KINDS)
def test_each_position_of_an_op_returning_one_tensor_twice_gets_its_own_gradient(counted, kind):
    op = twice_ops(counted)[kind]
    x = Tensor(RNG.standard_normal(5))
    want = 3.0 * CA + 5.0 * CB  # output 0's gradient weighed by k, output 1's by w
    loss = loss_of(op, 3.0, 5.0)
    np.testing.assert_allclose(rt.grad(loss)(x).asnumpy(), want, rtol=1e-12)
    j = jit(loss)
    for _ in range(2):  # the call that traces and a cached one
        np.testing.assert_allclose(rt.grad(j)(x).asnumpy(), want, rtol=1e-12)
    assert j.traces == 1


@pytest.mark.parametrize("kind", ["cell_bprop", "function", "cpp_function"])
def test_a_graph_mode_cell_around_an_op_returning_one_tensor_twice_matches_pynative(counted, kind):
    op = twice_ops(counted)[kind]

    class Net(nn.Cell):
        def construct(self, x):
            a, b = op(x, 3.0, 5.0)
            return mint.sum(a * Tensor(CA) + b * Tensor(CB))

    net, x = Net(), Tensor(RNG.standard_normal(5))
    step = rt.value_and_grad(net)
    want_v, want_g = step(x)
    rt.set_context(mode=rt.GRAPH_MODE)
    try:
        v, g = step(x)
        v2, g2 = step(x)
    finally:
        rt.set_context(mode=rt.PYNATIVE_MODE)
    for got_v, got_g in ((v, g), (v2, g2)):
        np.testing.assert_allclose(got_v.asnumpy(), want_v.asnumpy(), rtol=1e-12)
        np.testing.assert_allclose(got_g.asnumpy(), want_g.asnumpy(), rtol=1e-12)
    np.testing.assert_allclose(want_g.asnumpy(), 3.0 * CA + 5.0 * CB, rtol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_true_derivatives_of_an_op_returning_one_tensor_twice_match_central_differences(counted, kind):
    op = twice_ops(counted)[kind]
    j = jit(lambda x: op(x, 1.5, 1.5))  # both outputs handed out of the jitted call, each with its gradient
    gradcheck(j, [Tensor(RNG.standard_normal(5))])
    gradcheck(jit(loss_of(op, 1.5, 1.5)), [Tensor(RNG.standard_normal(5))])

"""``detach()`` inside jit and GRAPH_MODE (issue 33, class 11): the trace recorded the detached tensor as a
constant, so every later call reused the first call's values (``f(5)`` gave ``f(1)``'s result). It is a
node now: a replay detaches that call's tensor, and no gradient flows through it, as eagerly."""
from __future__ import annotations

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, nn

from inplace_util import central

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")  # a trace that stops would warn: it must not


def _mixed(x, w):
    """Both a detached and a differentiated use of x."""
    return (x.detach() * w + x * w * x).sum()


@pytest.mark.parametrize("level", ["O0", pytest.param("O1", marks=pytest.mark.build)])  # O1 compiles a kernel
def test_values_follow_each_call(level):
    f = rt.jit(lambda x, w: x.detach() * w, jit_level=level)
    w = Tensor(np.array([2.0, -1.0]))
    for v in (1.0, 5.0, 7.0):
        x = Tensor(np.array([v, v + 1]))
        assert f(x, w).numpy().tolist() == [2 * v, -(v + 1)]


@pytest.mark.parametrize("level", ["O0", pytest.param("O1", marks=pytest.mark.build)])  # O1 compiles a kernel
def test_no_gradient_flows_through_it_and_the_rest_matches_central_differences(level):
    grad = rt.grad(rt.jit(_mixed, jit_level=level), grad_position=(0, 1))
    w0 = np.array([2.0, 0.5])
    for x0 in (np.array([1.0, -2.0]), np.array([5.0, 3.0])):  # the trace's call, then replays
        gx, gw = grad(Tensor(x0.copy(), requires_grad=True), Tensor(w0.copy(), requires_grad=True))
        eager_gx, eager_gw = rt.grad(_mixed, grad_position=(0, 1))(Tensor(x0.copy(), requires_grad=True),
                                                                   Tensor(w0.copy(), requires_grad=True))
        np.testing.assert_array_equal(gx.numpy(), eager_gx.numpy())
        np.testing.assert_array_equal(gw.numpy(), eager_gw.numpy())
        # x's gradient without the detached use: d/dx sum(x * w * x) = 2 x w
        np.testing.assert_allclose(gx.numpy(), central(lambda a: float(np.sum(a * w0 * a)), x0.copy()), rtol=1e-7)
        np.testing.assert_allclose(gw.numpy(), central(lambda b: float(np.sum(x0 * b + x0 * b * x0)), w0.copy()),
                                   rtol=1e-7)


class DetachCell(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = rt.Parameter(Tensor(np.array([3.0])))

    def construct(self, x):
        return (x.detach() * self.w + x).sum()


def test_graph_mode_cell(graph_mode):
    cell = DetachCell()
    for v in (1.0, 4.0):
        x = Tensor(np.array([v]), requires_grad=True)
        loss, gx = rt.value_and_grad(cell, grad_position=0)(x)
        assert loss.item() == 4 * v
        assert gx.numpy().tolist() == [1.0]  # through `+ x` only


def test_the_detached_tensor_shares_the_input_version_under_jit():
    """A node that saved the detached tensor sees a later write of the input (one counter, as eagerly)."""
    def f(x):
        d = x.detach()
        return d * d

    jf = rt.jit(f)
    for v in (2.0, 3.0):
        x = Tensor(np.array([v]))
        assert jf(x).numpy().tolist() == [v * v]
        assert jf(x)._version == f(x)._version == 0

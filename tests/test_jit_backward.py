"""The backward graph of a jitted call: built once per signature from the forward graph's derivative
rules, run as one autograd node on the backend (or on ms_backend for a backend that cannot
differentiate), opaque nodes for ops whose backward is their own, and grad of grad."""
from __future__ import annotations

import numpy as np
import pytest

import runtime as rt
from runtime import Parameter, Tensor, jit, mint, nn
from runtime.autograd.gradcheck import gradcheck
from runtime.graph import register_backend
from runtime.ops.primitive import Primitive, defvjp

from jit_ops import Cube

RNG = np.random.default_rng(11)


def net(x, y):
    v = mint.reshape(x, (3, 2))                      # a view
    z = mint.sigmoid(v * y) + mint.tanh(y) / 3.0     # broadcasts
    return mint.sum(z * z, dim=1) - mint.mean(mint.exp(x))   # reductions


@pytest.mark.parametrize("level", ["O0", "O1"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.build
def test_gradients_run_the_backward_graph_built_once_and_match_eager(level, dtype):
    j = jit(net, jit_level=level)
    x = Tensor(RNG.standard_normal((2, 3)).astype(dtype))
    y = Tensor(RNG.standard_normal(2).astype(dtype))
    want = rt.grad(lambda a, b: mint.sum(net(a, b)), grad_position=(0, 1))(x, y)
    for _ in range(3):
        got = rt.grad(lambda a, b: mint.sum(j(a, b)), grad_position=(0, 1))(x, y)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype
            np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=1e-5 if dtype == np.float32 else 1e-12)
    assert j.traces == 1 and j.backward_traces == 1
    bg = j.backward_graph(x, y)
    assert j.backward_traces == 1 and "cos" not in str(bg)
    ops_ = {n.op for n in bg.nodes}
    assert "sum_to" in ops_ and bg.name == "net.backward", str(bg)
    if level == "O0":
        assert {"mul", "neg", "reshape"} <= ops_, str(bg)
    else:
        assert any(n.kind == "fused" for n in bg.nodes), str(bg)
    if dtype == np.float64:
        gradcheck(j, [x, y])
        gradcheck(j, [Tensor(RNG.standard_normal((3, 2)).T), y])  # a non-contiguous input


def test_a_differentiable_python_backend_receives_the_backward_graph():
    seen = []

    def recording(graph, config):
        seen.append(graph)
        return lambda inputs: graph.run(inputs)

    register_backend("recording_backward_test", recording)
    j = jit(lambda x, w: mint.sin(x) * w, backend="recording_backward_test")
    x, w = Tensor(RNG.standard_normal(4)), Tensor(RNG.standard_normal(4))
    gx = rt.grad(lambda a: mint.sum(j(a, w)))(x)
    np.testing.assert_allclose(gx.asnumpy(), np.cos(x.asnumpy()) * w.asnumpy(), rtol=1e-12)
    names = [g.name for g in seen]
    assert [n.rsplit(".", 2)[-2:] for n in names] == [["<locals>", "<lambda>"]] * 2 + [["<lambda>", "backward"]], names  # forward, forward with saves, backward
    assert [n.op for n in seen[2].nodes] == ["mul", "cos", "mul"], str(seen[2])  # x's only: w needs none
    gw = rt.grad(lambda b: mint.sum(j(x, b)))(w)  # another input requires grad: another backward graph
    np.testing.assert_allclose(gw.asnumpy(), np.sin(x.asnumpy()), rtol=1e-12)
    assert len(seen) == 5 and [n.op for n in seen[4].nodes] == ["mul"] and j.backward_traces == 2, str(seen[4])


def test_a_backend_that_cannot_differentiate_gets_ms_backend_for_the_backward():
    seen = []

    def numpy_only(graph, config):
        seen.append(graph.name)
        return lambda inputs: [Tensor(np.asarray(o._data)) for o in graph.run(inputs)]

    register_backend("no_grad_backward_test", numpy_only, differentiable=False)
    j = jit(lambda x: mint.exp(x) * x, backend="no_grad_backward_test")
    x = Tensor(RNG.standard_normal(3))
    g = rt.grad(lambda a: mint.sum(j(a)))(x)
    np.testing.assert_allclose(g.asnumpy(), np.exp(x.asnumpy()) * (1 + x.asnumpy()), rtol=1e-12)
    assert len(seen) == 1 and seen[0].endswith("<lambda>")
    assert [n.op for n in j.backward_graph(x).nodes] == ["mul", "mul", "mul", "add"] and len(seen) == 1


def test_ops_with_their_own_backward_are_one_opaque_node():
    j = jit(lambda x: mint.sin(Cube.apply(x)))
    x = Tensor(RNG.standard_normal(5))
    g = rt.grad(lambda a: mint.sum(j(a)))(x)
    np.testing.assert_allclose(g.asnumpy(), np.cos(x.asnumpy() ** 3) * 3 * x.asnumpy() ** 2, rtol=1e-12)
    bg = j.backward_graph(x)
    assert [(n.kind, n.op) for n in bg.nodes] == [("primitive", "cos"), ("primitive", "mul"),
                                                  ("backward", "Cube.backward")], str(bg)


def test_a_jitted_cell_gives_parameter_gradients_through_the_backward_graph():
    class Lin(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = Parameter(Tensor(RNG.standard_normal(3)), name="w")

        @jit
        def construct(self, x):
            return mint.sum(mint.tanh(x * self.w))

    c = Lin()
    x = Tensor(RNG.standard_normal((2, 3)))
    gx, (gw,) = rt.grad(c, grad_position=0, weights=[c.w])(x)
    t = np.tanh(x.asnumpy() * c.w.asnumpy())
    np.testing.assert_allclose(gw.asnumpy(), ((1 - t * t) * x.asnumpy()).sum(0), rtol=1e-12)
    np.testing.assert_allclose(gx.asnumpy(), (1 - t * t) * c.w.asnumpy(), rtol=1e-12)
    assert Lin.construct.backward_traces == 1


def test_second_order_gradients_work():
    j = jit(lambda x: mint.sin(x) * x)
    x = Tensor(np.linspace(-1, 1, 5))
    g2 = rt.grad(rt.grad(lambda t: mint.sum(j(t))))(x)
    xv = x.asnumpy()
    np.testing.assert_allclose(g2.asnumpy(), 2 * np.cos(xv) - xv * np.sin(xv), rtol=1e-10)


def test_backward_twice_without_retain_graph_is_a_clear_error():
    j = jit(lambda x: mint.sum(mint.exp(x)))
    x = Tensor(RNG.standard_normal(3)).requires_grad_()
    y = j(x)
    y.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), np.exp(x.asnumpy()), rtol=1e-12)
    with pytest.raises(RuntimeError, match=r"backward through jit\(\S+<lambda>\) a second time: its saved values were freed"):
        y.backward()


def test_a_rule_that_wraps_a_forward_value_outside_the_ops_is_refused():
    from runtime.ops.math import mul
    bad = Primitive("bad_square", np.square)
    defvjp(bad, lambda g, ans, x: mul(g, Tensor._from_array(ans._data)))
    j = jit(lambda x: bad(x))
    x = Tensor(RNG.standard_normal(3))
    with pytest.raises(RuntimeError, match=r"derivative rule of bad_square used a tensor wrapping a forward value"):
        rt.grad(lambda a: mint.sum(j(a)))(x)

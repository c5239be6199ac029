"""runtime.jit: trace capture, the Graph, the per-signature cache, ms_backend O0, Python backends,
gradients through jitted functions and Cells, and GRAPH_MODE parity."""
from __future__ import annotations

import numpy as np
import pytest

import runtime as rt
from runtime import Parameter, Tensor, jit, mint, nn, ops
from runtime.autograd.gradcheck import gradcheck
from runtime.graph import Graph, list_backends, register_backend

from jit_ops import Cube

from op_util import CUSTOM_SRC

RNG = np.random.default_rng(7)


def f64(*shape):
    return Tensor(RNG.standard_normal(shape))


def small_net(x, y):
    return mint.sin(x) * y + mint.sum(mint.exp(y), dim=0) - 2.0


def test_second_call_runs_the_cached_graph_without_tracing():
    calls = []

    def fn(x, y):
        calls.append(1)
        return small_net(x, y)

    j = jit(fn)
    x, y = f64(2, 3), f64(3)
    first = j(x, y)
    second = j(Tensor(x.asnumpy() + 1), y)
    assert len(calls) == 1 and j.traces == 1
    np.testing.assert_allclose(first.asnumpy(), small_net(x, y).asnumpy(), rtol=1e-12)
    np.testing.assert_allclose(second.asnumpy(), small_net(Tensor(x.asnumpy() + 1), y).asnumpy(), rtol=1e-12)
    j(f64(4, 3), y)  # a new shape: one more trace
    j(x.astype if False else Tensor(x.asnumpy().astype(np.float32)), y)  # a new dtype: one more
    assert j.traces == 3 and len(calls) == 3


def test_python_values_are_part_of_the_signature():
    j = jit(lambda x, k, flip: x * k if flip else x + k)
    x = f64(3)
    np.testing.assert_allclose(j(x, 2.0, True).asnumpy(), x.asnumpy() * 2)
    np.testing.assert_allclose(j(x, 2.0, False).asnumpy(), x.asnumpy() + 2)
    np.testing.assert_allclose(j(x, 3.0, True).asnumpy(), x.asnumpy() * 3)
    j(x, 3.0, True)
    assert j.traces == 3


def test_the_same_tensor_twice_is_a_different_signature_from_two_tensors():
    j = jit(lambda a, b: a * b)
    x, y = f64(3), f64(3)
    np.testing.assert_allclose(j(x, x).asnumpy(), x.asnumpy() ** 2)
    np.testing.assert_allclose(j(x, y).asnumpy(), x.asnumpy() * y.asnumpy())
    assert j.traces == 2


def test_graph_lists_nodes_with_ops_inputs_attrs_shapes_and_dtypes():
    j = jit(small_net)
    g = j.graph(f64(2, 3), f64(3))
    assert isinstance(g, Graph)
    assert [n.op for n in g.nodes] == ["sin", "mul", "exp", "sum", "add", "sub"]
    s = g.nodes[3]
    assert s.attrs == {"axis": (0,), "keepdims": False} and s.out_shapes == [()] and s.out_dtypes == [np.float64]
    text = str(g)
    assert "graph small_net(%in0: float64[2, 3], %in1: float64[3])" in text
    assert "%1 = mul(%0, %in1) -> float64[2, 3]" in text and "return %5" in text


def test_structured_results_and_keyword_arguments():
    j = jit(lambda x, *, scale: (x * scale, [mint.cos(x), 5], None))
    x = f64(2)
    a, (b, five), none = j(x, scale=2.0)
    np.testing.assert_allclose(a.asnumpy(), x.asnumpy() * 2)
    np.testing.assert_allclose(b.asnumpy(), np.cos(x.asnumpy()))
    assert five == 5 and none is None


def test_views_and_empty_tensors():
    j = jit(lambda x, y: mint.tanh(x) * y)
    base = RNG.standard_normal((4, 3))
    x = rt.from_numpy(base.T)  # a transposed view (Tensor() would copy it)
    y = rt.from_numpy(np.broadcast_to(RNG.standard_normal(4), (3, 4)))
    np.testing.assert_allclose(j(x, y).asnumpy(), np.tanh(base.T) * y.asnumpy(), rtol=1e-12)
    e = j(Tensor(np.zeros((0, 4))), Tensor(np.zeros((4,))))
    assert e.shape == (0, 4)


def test_grad_and_value_and_grad_of_a_jitted_function_match_eager_and_numerics():
    j = jit(small_net)
    x, y = f64(2, 3), f64(3)
    want = rt.grad(lambda a, b: mint.sum(small_net(a, b)), grad_position=(0, 1))(x, y)
    got = rt.grad(lambda a, b: mint.sum(j(a, b)), grad_position=(0, 1))(x, y)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=1e-12)
    v, gx = rt.value_and_grad(lambda a: mint.sum(j(a, y)))(x)
    np.testing.assert_allclose(v.asnumpy(), np.sum(small_net(x, y).asnumpy()))
    gradcheck(j, [x, y])
    gradcheck(j, [Tensor(RNG.standard_normal((3, 2))).T if False else Tensor(RNG.standard_normal((3, 2)).T), y])


@pytest.mark.build
def test_python_function_and_aot_custom_ops_inside_a_jitted_function_are_nodes_and_differentiate():
    add = ops.Custom(f"{CUSTOM_SRC / 'aot_add.cpp'}:CustomAdd", out_shape=lambda a, b: a, out_dtype=lambda a, b: a,
                     func_type="aot", bprop=lambda a, b, out, dout: (dout, dout))
    j = jit(lambda x, y: mint.sin(add(Cube.apply(x), y)))
    x, y = Tensor(RNG.standard_normal(5).astype(np.float32)), Tensor(RNG.standard_normal(5).astype(np.float32))
    g = j.graph(x, y)
    assert [(n.kind, n.op) for n in g.nodes] == [("function", "Cube"), ("custom", "Custom(CustomAdd)"),
                                                  ("primitive", "sin")]
    np.testing.assert_allclose(j(x, y).asnumpy(), np.sin(x.asnumpy() ** 3 + y.asnumpy()), rtol=1e-6)
    gx, gy = rt.grad(lambda a, b: mint.sum(j(a, b)), grad_position=(0, 1))(x, y)
    c = np.cos(x.asnumpy() ** 3 + y.asnumpy())
    np.testing.assert_allclose(gx.asnumpy(), c * 3 * x.asnumpy() ** 2, rtol=1e-5)
    np.testing.assert_allclose(gy.asnumpy(), c, rtol=1e-5)


def test_cpp_function_ops_are_traced_as_one_node_and_differentiate(my_ops):
    j = jit(lambda x, y: mint.exp(my_ops.mul(x, y)))
    x, y = f64(2, 3), f64(2, 3)
    g = j.graph(x, y)
    assert [n.kind for n in g.nodes] == ["cpp", "primitive"]
    np.testing.assert_allclose(j(x, y).asnumpy(), np.exp(x.asnumpy() * y.asnumpy()), rtol=1e-12)
    gradcheck(j, [x, y])



def test_the_replay_of_a_cpp_function_op_refuses_other_arguments_clearly(my_ops):
    # the node's target: the module function's whole call (issue 33: what it does besides Apply replays
    # too), bound by the same layer as my_ops.mul, so its bad inputs are refused as my_ops.mul's are
    g = jit(lambda x, y: my_ops.mul(x, y)).graph(f64(2), f64(2))
    replay = g.nodes[0].target
    np.testing.assert_array_equal(replay(Tensor(np.array([2.0, 3.0])), Tensor(np.array([4.0, 5.0]))).asnumpy(),
                                  [8.0, 15.0])
    for bad in [(f64(2),), (f64(2), "y")]:
        with pytest.raises(TypeError, match=r"^mul\(\): incompatible function arguments") as replayed:
            replay(*bad)
        with pytest.raises(TypeError) as called:
            my_ops.mul(*bad)
        assert str(replayed.value) == str(called.value)

class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = Parameter(Tensor(RNG.standard_normal((3, 4))), name="w")
        self.b = Parameter(Tensor(RNG.standard_normal(4)), name="b")

    def construct(self, x):
        return mint.sum(mint.tanh(mint.matmul(x, self.w) + self.b) * 2)


def test_graph_mode_matches_pynative_for_a_cell_with_parameters():
    net = Net()
    x = f64(2, 3)
    step = rt.value_and_grad(net, grad_position=0, weights=net.trainable_params())
    eager_v, (eager_gx, eager_gw) = step(x)
    rt.set_context(mode=rt.GRAPH_MODE)
    try:
        v, (gx, gw) = step(x)
        step(x)
        assert net._graph_jit.traces == 1
        net.w.set_data(net.w.asnumpy() * 0 + 1) if hasattr(net.w, "set_data") else None
    finally:
        rt.set_context(mode=rt.PYNATIVE_MODE)
    np.testing.assert_allclose(v.asnumpy(), eager_v.asnumpy(), rtol=1e-12)
    np.testing.assert_allclose(gx.asnumpy(), eager_gx.asnumpy(), rtol=1e-12)
    for a, b in zip(gw, eager_gw):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-12)


def test_a_jitted_cell_method_sees_parameter_updates():
    class Scale(nn.Cell):
        def __init__(self):
            super().__init__()
            self.p = Parameter(Tensor(np.float64(2.0)), name="p")

        @jit
        def construct(self, x):
            return x * self.p

    c = Scale()
    x = f64(3)
    np.testing.assert_allclose(c(x).asnumpy(), x.asnumpy() * 2)
    c.p._data[...] = 5.0
    np.testing.assert_allclose(c(x).asnumpy(), x.asnumpy() * 5)
    gw = rt.grad(c, grad_position=None, weights=[c.p])(x)
    np.testing.assert_allclose(gw[0].asnumpy(), x.asnumpy().sum())


def test_python_backends_get_the_graph_and_undifferentiable_ones_fall_back_for_gradients():
    seen = []

    def numpy_backend(graph, config):
        seen.append((graph, config))

        def run(inputs):
            return [Tensor(np.asarray(o._data)) for o in graph.run(inputs)]
        return run

    register_backend("numpy_test_backend", numpy_backend, differentiable=False)
    assert "numpy_test_backend" in list_backends() and "ms_backend" in list_backends()
    j = jit(small_net, backend="numpy_test_backend", flavour="plain")
    x, y = f64(2, 3), f64(3)
    np.testing.assert_allclose(j(x, y).asnumpy(), small_net(x, y).asnumpy())
    assert len(seen) == 1 and seen[0][1] == {"flavour": "plain", "jit_level": "O0"}
    gx = rt.grad(lambda a: mint.sum(j(a, y)))(x)
    np.testing.assert_allclose(gx.asnumpy(), rt.grad(lambda a: mint.sum(small_net(a, y)))(x).asnumpy())
    with pytest.raises(ValueError, match="'numpy_test_backend' is already registered"):
        register_backend("numpy_test_backend", numpy_backend)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match=r"unknown backend 'nope'; registered backends: ms_backend"):
        jit(small_net, backend="nope")
    with pytest.raises(ValueError, match=r"jit_level 'O3' is not one of O0, O1"):
        jit(small_net, jit_level="O3")
    with pytest.raises(ValueError, match=r"capture_mode 'ast' is not supported; supported: trace"):
        jit(small_net, capture_mode="ast")
    with pytest.raises(TypeError, match="expected a function or method, got int"):
        jit(3)
    with pytest.raises(TypeError, match="factory must be callable"):
        register_backend("x_backend", 3)
    with pytest.raises(TypeError, match="backend name must be a non-empty str"):
        register_backend("", lambda g, c: None)


def test_o0_runner_drops_each_intermediate_after_its_last_use_and_keeps_outputs():
    def fn(x):
        a = mint.sin(x)           # %0: used by %1 and %3
        b = a * 2.0               # %1: returned and used by %2
        c = mint.exp(b)           # %2: used by %3 only
        return b, c + a           # %3
    j = jit(fn)
    x = f64(4)
    b, d = j(x)
    run = j._cache[next(iter(j._cache))].run
    lines = run.source.splitlines()
    at = {ln.strip().split(" =")[0]: i for i, ln in enumerate(lines) if " = t" in ln}
    dels = {v: i for i, ln in enumerate(lines) if ln.strip().startswith("del ")
            for v in ln.strip()[4:].split(", ")}
    assert set(dels) == {"v0", "v2"}, run.source          # outputs v1 and v3 are never dropped
    assert dels["v0"] == at["v3"] + 1 and dels["v2"] == at["v3"] + 1, run.source
    xa = x.asnumpy()
    np.testing.assert_allclose(b.asnumpy(), np.sin(xa) * 2, rtol=1e-12)
    np.testing.assert_allclose(d.asnumpy(), np.exp(np.sin(xa) * 2) + np.sin(xa), rtol=1e-12)

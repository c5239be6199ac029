"""jit_level="O1": fused C++ kernels agree with eager on random elementwise/broadcast/reduction graphs
(float32, float64), their gradients agree with central differences, and a warm cache builds nothing."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import opbuilder
import runtime as rt
from runtime import Tensor, jit, mint
from runtime.autograd.gradcheck import gradcheck

from builder_util import child_env

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

UNARY = [mint.sin, mint.cos, mint.tanh, mint.exp, mint.sigmoid, mint.neg, mint.relu, mint.abs]
BINARY = [mint.add, mint.sub, mint.mul]
SHAPES = [(3, 4), (4,), (3, 1), (1, 4), ()]


def random_program(seed: int):
    """A random chain of elementwise and broadcasting ops over three inputs, ending in a reduction
    half of the time; returns (fn, input shapes)."""
    rng = np.random.default_rng(seed)
    shapes = [(3, 4)] + [SHAPES[i] for i in rng.integers(0, len(SHAPES), 2)]
    steps = [(int(rng.integers(0, 2)), int(rng.integers(0, 8)), int(rng.integers(0, 3)), int(rng.integers(0, 8)))
             for _ in range(6)]
    reduce = bool(rng.integers(0, 2))

    def fn(a, b, c):
        vals = [a, b, c]
        for binary, k, j, m in steps:
            x = vals[-1]
            y = vals[j % len(vals)]
            vals.append(BINARY[k % 3](x, y) if binary else UNARY[k](x) * 0.5 + y * 0.25)
            if m == 0:
                vals.append(mint.sqrt(mint.square(vals[-1]) + 1.0) / 2.0)
        out = vals[-1] + vals[3]
        return (out, mint.sum(out, dim=0)) if reduce else out

    return fn, shapes


def _inputs(shapes, dtype, seed):
    rng = np.random.default_rng(seed)
    return [Tensor(rng.uniform(-1.5, 1.5, s).astype(dtype)) for s in shapes]


def _flat(o):
    return [t.asnumpy() for t in (o if isinstance(o, tuple) else (o,))]


@pytest.mark.parametrize("dtype,rtol", [(np.float32, 2e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("seed", range(4))
def test_o0_and_o1_equal_eager_on_random_graphs(seed, dtype, rtol):
    fn, shapes = random_program(seed)
    xs = _inputs(shapes, dtype, seed)
    want = _flat(fn(*xs))
    o1 = jit(fn, jit_level="O1")
    for level in (jit(fn, jit_level="O0"), o1):
        for got, w in zip(_flat(level(*xs)), want):
            assert got.dtype == w.dtype
            np.testing.assert_allclose(got, w, rtol=rtol, atol=rtol)
    assert any(n.kind == "fused" for n in o1.graph(*xs).nodes)


@pytest.mark.parametrize("seed", range(4))
def test_o1_gradients_match_central_differences(seed):
    fn, shapes = random_program(seed)
    xs = _inputs(shapes, np.float64, seed + 100)
    gradcheck(jit(fn, jit_level="O1"), xs)


def test_a_fused_group_whose_output_needs_no_grad_differentiates_the_others():
    """A fused group run with recording on (``jitted.graph(...).run``): one output depends only on an input
    that needs no grad. The group's backward passed every output to autograd.grad, which refuses one that
    does not require grad (a RuntimeError where eager gives the gradient)."""
    def f(w, x):
        a = x * x + 1.0
        return a * 2.0 + 1.0, (a * w + 2.0) * 3.0

    w, x = Tensor(np.array([1.0, 2.0]), requires_grad=True), Tensor(np.array([3.0, 4.0]))
    j = jit(f, jit_level="O1")
    a, b = j.graph(w, x).run([w, x])
    (a.sum() + b.sum()).backward()
    np.testing.assert_allclose(w.grad.asnumpy(), 3.0 * (x.asnumpy() ** 2 + 1.0))


def test_o1_second_order_gradient():
    j = jit(lambda x: mint.sin(x) * x, jit_level="O1")
    x = Tensor(np.linspace(-1, 1, 5))
    g2 = rt.grad(rt.grad(lambda t: mint.sum(j(t))))(x)
    xv = x.asnumpy()
    np.testing.assert_allclose(g2.asnumpy(), 2 * np.cos(xv) - xv * np.sin(xv), rtol=1e-10)


def test_o1_views_empty_and_shared_outputs():
    j = jit(lambda x, y: (mint.exp(x * y), mint.exp(x * y) + 1), jit_level="O1")
    base = np.random.default_rng(3).standard_normal((4, 3))
    x, y = rt.from_numpy(base.T), rt.from_numpy(np.broadcast_to(np.arange(4.0), (3, 4)))  # views
    a, b = j(x, y)
    np.testing.assert_allclose(a.asnumpy(), np.exp(base.T * y.asnumpy()), rtol=1e-12)
    np.testing.assert_allclose(b.asnumpy(), a.asnumpy() + 1, rtol=1e-12)
    e, _ = j(Tensor(np.zeros((0, 4))), Tensor(np.zeros(4)))
    assert e.shape == (0, 4)
    graph = j.graph(x, y)
    fused = [n for n in graph.nodes if n.kind == "fused"]
    assert len(fused) == 1 and len(fused[0].out_shapes) == 2 and "fused[mul+exp" in str(graph)


def test_a_warm_cache_runs_no_compiler_in_a_new_process(cache_dir):
    script = textwrap.dedent("""
        import subprocess, sys
        import numpy as np
        import runtime as rt
        from runtime import Tensor, jit, mint
        spawned = []
        real = subprocess.Popen.__init__
        def spy(self, *a, **k):
            spawned.append(a[0] if a else k.get("args"))
            real(self, *a, **k)
        subprocess.Popen.__init__ = spy
        j = jit(lambda x: 0.5 * x * (1 + mint.tanh(0.79788456 * (x + 0.044715 * x * x * x))), jit_level="O1")
        x = Tensor(np.linspace(-2, 2, 7).astype(np.float32))
        print(float(mint.sum(j(x)).asnumpy()), len(spawned), spawned)
    """)
    env = child_env(OPBUILDER_CACHE_DIR=str(cache_dir))
    env["PYTHONPATH"] = f"{Path(opbuilder.__file__).parents[1]}:{env['PYTHONPATH']}"
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    cold, warm = (r.stdout.split() for r in runs)
    assert cold[0] == warm[0]
    assert int(warm[1]) == 0, f"the warm process started {warm[2:]}"
    assert "compiling ob_fused_" not in runs[1].stderr


def _reduce_net(op, dim, keepdim):
    def fn(x, y):
        t = mint.tanh(x) * y + 0.5
        return t * 2.0, op(mint.exp(t) - y, dim=dim, keepdim=keepdim)
    return fn


@pytest.mark.filterwarnings("ignore:Mean of empty slice")
@pytest.mark.parametrize("dtype,rtol", [(np.float32, 2e-6), (np.float64, 1e-12)])
@pytest.mark.parametrize("op,dim,keepdim", [(mint.sum, -1, False), (mint.mean, -1, True), (mint.sum, None, False),
                                            (mint.mean, (0, 1), True)])
def test_o1_fuses_a_trailing_sum_or_mean_over_the_last_or_all_axes(op, dim, keepdim, dtype, rtol):
    fn = _reduce_net(op, dim, keepdim)
    j = jit(fn, jit_level="O1")
    rng = np.random.default_rng(5)
    for shape in [(3, 37), (1, 5), (0, 4), (4, 0)]:
        x, y = Tensor(rng.uniform(-1, 1, shape).astype(dtype)), Tensor(rng.uniform(-1, 1, shape[-1:]).astype(dtype))
        with np.errstate(invalid="ignore", divide="ignore"):
            want, got = fn(x, y), j(x, y)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=rtol, atol=rtol)
    fused = [n for n in j.graph(x, y).nodes if n.kind == "fused"]
    assert [n.op for n in fused] == [f"fused[tanh+mul+add+mul+exp+sub+{op.__name__}]"]
    assert fused[0].out_shapes[-1] == want[1].shape and len(fused[0].out_shapes) == 2


def test_o1_reduction_gradients_match_central_differences():
    rng = np.random.default_rng(6)
    x, y = Tensor(rng.uniform(-1, 1, (3, 4))), Tensor(rng.uniform(-1, 1, 4))
    for op, dim in [(mint.sum, -1), (mint.mean, None)]:
        gradcheck(jit(_reduce_net(op, dim, False), jit_level="O1"), [x, y])


def test_o1_leaves_other_reductions_to_their_own_node():
    j = jit(lambda x: mint.sum(mint.sin(x) * 2.0, dim=0), jit_level="O1")
    x = Tensor(np.random.default_rng(7).standard_normal((3, 4)))
    assert [n.op for n in j.graph(x).nodes] == ["fused[sin+mul]", "sum"]
    np.testing.assert_allclose(j(x).asnumpy(), np.sum(np.sin(x.asnumpy()) * 2.0, axis=0), rtol=1e-12)


def test_an_unused_trailing_sum_does_not_join_the_fused_kernel():
    """The kernel writes a fused reduction to its last output; an unused one would write over another."""
    @jit(jit_level="O1")
    def f(x):
        y = x * 2.0 + 1.0
        mint.sum(y)  # computed, never used
        return y

    @jit(jit_level="O1")
    def g(x):
        y = x * 2.0 + 1.0
        mint.sum(y, -1)
        return y

    np.testing.assert_array_equal(f(Tensor(np.ones((2, 3), np.float32))).asnumpy(), np.full((2, 3), 3.0))
    np.testing.assert_array_equal(g(Tensor(np.ones((3, 4), np.float32))).asnumpy(), np.full((3, 4), 3.0))


def test_a_rank_past_the_kernels_loop_nest_runs_unfused():
    @jit(jit_level="O1")
    def f(x):
        return mint.exp(x * 2.0) + 1.0

    x = Tensor(np.full((1,) * 17 + (2,), 0.5))
    np.testing.assert_allclose(f(x).asnumpy(), np.exp(x.asnumpy() * 2.0) + 1.0, rtol=1e-15)
    assert not any(n.kind == "fused" for n in f.graph(x).nodes)

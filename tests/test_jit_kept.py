"""The backward of a jitted call uses what its forward produced: an op whose backward is its own (a C++
Function, an ops.Custom with a bprop, a Cell with bprop, a Python autograd.Function) runs its forward
once per call, as eagerly, and its backward gets the ctx, saved tensors and out of that forward run."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import runtime as rt
from runtime import Parameter, Tensor, jit, mint, nn, ops
from runtime.autograd.gradcheck import gradcheck
from runtime.graph import register_backend

from op_util import CPP, load_op
from jit_ops import CountedCube

RNG = np.random.default_rng(23)


@pytest.fixture(scope="module")
def counted(cache_dir):
    return load_op("jit_counted_ops", [CPP / "jit_counted_ops.cpp"], cflags=["-Wall", "-Wextra", "-Werror"])


def forwards_per_call(counter, step, calls=3):
    """How many forwards each of ``calls`` warm calls of ``step`` runs (the first call traces and builds)."""
    step()
    seen = []
    for _ in range(calls):
        before = counter()
        step()
        seen.append(counter() - before)
    return seen


class SmallNet(nn.Cell):
    def __init__(self, ops_module, n=6):
        super().__init__()
        self.ops = ops_module
        self.w = Parameter(Tensor(RNG.standard_normal(n)), name="w")

    def construct(self, x):
        h = self.ops.scaled_mul(mint.sin(x), self.w, 1.5)
        return mint.sum(self.ops.tanh(h) * x)


def eager_grads(net, x):
    return rt.value_and_grad(net, grad_position=0, weights=net.trainable_params())(x)


def test_a_cpp_function_runs_its_forward_once_per_jitted_value_and_grad(counted):
    net = SmallNet(counted)
    x = Tensor(RNG.standard_normal(6))
    want_v, (want_gx, (want_gw,)) = eager_grads(net, x)
    j = jit(net.construct)
    step = rt.value_and_grad(lambda t: j(t), grad_position=0, weights=net.trainable_params())
    assert forwards_per_call(counted.forwards, lambda: step(x)) == [2, 2, 2]  # scaled_mul and tanh, once each
    v, (gx, (gw,)) = step(x)
    np.testing.assert_allclose(v.asnumpy(), want_v.asnumpy(), rtol=1e-12)
    np.testing.assert_allclose(gx.asnumpy(), want_gx.asnumpy(), rtol=1e-12)
    np.testing.assert_allclose(gw.asnumpy(), want_gw.asnumpy(), rtol=1e-12)
    before = counted.forwards()
    with rt.no_grad():
        j(x)
    assert counted.forwards() - before == 2 and j.traces == 1 and j.backward_traces == 1


def test_an_ops_custom_pyfunc_runs_once_and_its_bprop_gets_the_forward_out():
    made, outs_seen = [], []

    def square(a):
        made.append(a * a)
        return made[-1]

    def bprop(a, out, dout):
        outs_seen.append(out.asnumpy())
        return (2 * a * dout,)

    sq = ops.Custom(square, out_shape=lambda s: s, out_dtype=lambda d: d, func_type="pyfunc", bprop=bprop)
    j = jit(lambda x, y: mint.sum(mint.cos(sq(x)) * y))
    x, y = Tensor(RNG.standard_normal(5)), Tensor(RNG.standard_normal(5))
    step = rt.value_and_grad(j, grad_position=(0, 1))
    assert forwards_per_call(lambda: len(made), lambda: step(x, y)) == [1, 1, 1]
    _, (gx, gy) = step(x, y)
    assert np.shares_memory(outs_seen[-1], made[-1])  # the out of that call's one forward
    xv = x.asnumpy()
    np.testing.assert_allclose(gx.asnumpy(), -np.sin(xv * xv) * y.asnumpy() * 2 * xv, rtol=1e-12)
    np.testing.assert_allclose(gy.asnumpy(), np.cos(xv * xv), rtol=1e-12)


def test_a_python_function_and_a_graph_mode_cell_with_bprop_run_their_forward_once():
    runs = []

    class Doubler(nn.Cell):
        def construct(self, x):
            runs.append(1)
            return x * 2

        def bprop(self, x, out, dout):
            return (dout * 2,)

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.d = Doubler()
            self.w = Parameter(Tensor(RNG.standard_normal(4)), name="w")

        def construct(self, x):
            return mint.sum(CountedCube.apply(self.d(x * self.w)))

    net, x = Net(), Tensor(RNG.standard_normal(4))
    want_v, (want_gx, (want_gw,)) = eager_grads(net, x)
    rt.set_context(mode=rt.GRAPH_MODE)
    try:
        step = rt.value_and_grad(net, grad_position=0, weights=net.trainable_params())
        assert forwards_per_call(lambda: len(runs) + CountedCube.forwards, lambda: step(x)) == [2, 2, 2]
        v, (gx, (gw,)) = step(x)
    finally:
        rt.set_context(mode=rt.PYNATIVE_MODE)
    np.testing.assert_allclose(v.asnumpy(), want_v.asnumpy(), rtol=1e-12)
    np.testing.assert_allclose(gx.asnumpy(), want_gx.asnumpy(), rtol=1e-12)
    np.testing.assert_allclose(gw.asnumpy(), want_gw.asnumpy(), rtol=1e-12)


@pytest.mark.parametrize("level", ["O0", "O1"])
@pytest.mark.build
def test_gradients_through_kept_nodes_match_central_differences_first_and_second_order(counted, level):
    w = Tensor(RNG.standard_normal((3, 4)))
    j = jit(lambda x, v: mint.exp(counted.tanh(counted.scaled_mul(x * 2 + 1, v, 0.5))) * v, jit_level=level)
    x = Tensor(RNG.standard_normal((3, 4)))
    gradcheck(j, [x, w])
    gradcheck(j, [Tensor(RNG.standard_normal((4, 3)).T), w])  # a non-contiguous input
    # second order: the backward is differentiated (the forward re-run op by op, recorded)
    sq = ops.Custom(lambda a: a * a, out_shape=lambda s: s, out_dtype=lambda d: d, func_type="pyfunc",
                    bprop=lambda a, out, dout: (2 * a * dout,))
    k = jit(lambda t: mint.sum(mint.sin(sq(t)) * CountedCube.apply(t)), jit_level=level)
    t = Tensor(np.linspace(-1, 1, 5))
    gradcheck(rt.grad(k), [t])
    tv = t.asnumpy()
    s, c = np.sin(tv * tv), np.cos(tv * tv)
    want = 14 * tv ** 3 * c - 4 * tv ** 5 * s + 6 * tv * s  # d2/dt2 of sin(t^2) t^3
    np.testing.assert_allclose(rt.grad(rt.grad(lambda a: k(a)))(t).asnumpy(), want, rtol=1e-10)


def test_retain_graph_reuses_the_kept_nodes_and_a_second_backward_without_it_is_a_clear_error(counted):
    j = jit(lambda x: mint.sum(counted.tanh(x)))
    x = Tensor(RNG.standard_normal(4)).requires_grad_()
    j(x)  # builds
    before = counted.forwards()
    y = j(x)
    y.backward(retain_graph=True)
    y.backward()
    assert counted.forwards() - before == 1
    np.testing.assert_allclose(x.grad.asnumpy(), 2 * (1 - np.tanh(x.asnumpy()) ** 2), rtol=1e-12)
    with pytest.raises(RuntimeError,
                       match=r"backward through jit\(\S+<lambda>\) a second time: its saved values were freed"):
        y.backward()


def _modified_parameter(fn, p, x):
    y = fn(x)
    with rt.no_grad():
        p += 1.0  # an optimizer's in-place step between forward and backward
    mint.sum(y).backward()


def test_a_parameter_written_in_place_after_the_forward_fails_the_backward_as_eagerly(counted):
    p = Parameter(Tensor(RNG.standard_normal(3)), name="p")
    x = Tensor(RNG.standard_normal(3)).requires_grad_()
    eager = lambda t: counted.scaled_mul(t, p, 2.0)  # noqa: E731
    msg = r"ScaledMul \(saved slot 1\) has been modified by an in-place operation"
    with pytest.raises(RuntimeError, match=msg):
        _modified_parameter(eager, p, x)
    with pytest.raises(RuntimeError, match=msg):
        _modified_parameter(jit(eager), p, x)


def test_an_output_written_in_place_after_the_call_fails_the_backward_as_eagerly(counted):
    x = Tensor(RNG.standard_normal(3)).requires_grad_()
    msg = r"Tanh \(saved slot 0\) has been modified by an in-place operation"
    for fn in (counted.tanh, jit(lambda t: counted.tanh(t))):
        y = fn(x)
        with rt.no_grad():
            y *= 2.0
        with pytest.raises(RuntimeError, match=msg):
            mint.sum(y).backward()


def test_a_value_saved_by_an_op_and_written_in_place_later_in_the_same_graph_fails_as_eagerly(counted):
    w = Tensor(RNG.standard_normal(3))

    def f(x):
        h = x * 1.0
        y = counted.scaled_mul(h, w, 2.0)  # saves h
        counted.scale_(h, 3.0)  # then writes it in place (MarkDirty)
        return mint.sum(y + h)

    x = Tensor(RNG.standard_normal(3)).requires_grad_()
    msg = r"ScaledMul \(saved slot 0\) has been modified by an in-place operation"
    with pytest.raises(RuntimeError, match=msg):
        f(x).backward()
    j = jit(f)
    j(x)  # builds
    with pytest.raises(RuntimeError, match=msg):
        j(x).backward()


def test_a_backend_that_runs_opaque_ops_where_no_context_is_kept_recomputes_them(counted):
    """A backend running the forward in another thread leaves no kept node: the opaque node's backward
    then runs the op again (the path a plugin that runs such an op itself takes), with the same result."""
    def elsewhere(graph, config):
        def run(inputs):
            box = []
            t = threading.Thread(target=lambda: box.append(graph.run(inputs)))
            t.start()
            t.join()
            return box[0]
        return run

    register_backend("kept_elsewhere_test", elsewhere)
    w = Tensor(RNG.standard_normal(4))
    j = jit(lambda x: mint.sum(counted.scaled_mul(x, w, 3.0)), backend="kept_elsewhere_test")
    x = Tensor(RNG.standard_normal(4))
    g = rt.grad(j)
    assert forwards_per_call(counted.forwards, lambda: g(x)) == [2, 2, 2]
    np.testing.assert_allclose(g(x).asnumpy(), 3.0 * w.asnumpy(), rtol=1e-12)


def test_calls_of_one_jitted_function_in_two_threads_keep_their_own_nodes():
    """Two calls' forwards overlap without nesting: thread 1's call starts and waits inside its first op
    until thread 2's call is inside that op too; thread 1 then finishes (forward and backward) while
    thread 2 waits, and thread 2 goes on. Contexts kept anywhere but per call and per thread would give
    thread 1's second op to thread 2's backward (a wrong gradient) or run it twice."""
    events = {k: threading.Event() for k in ("in1", "in2", "done1")}
    role = threading.local()

    def first(a):
        if getattr(role, "n", 0) == 1:
            events["in1"].set()
            assert events["in2"].wait(10)
        elif getattr(role, "n", 0) == 2:
            events["in2"].set()
            assert events["done1"].wait(10)
        return a * 2

    def second(a):
        role.forwards = getattr(role, "forwards", 0) + 1
        return a ** 3

    op1 = ops.Custom(first, out_shape=lambda s: s, out_dtype=lambda d: d, func_type="pyfunc",
                     bprop=lambda a, out, dout: (2 * dout,))
    op2 = ops.Custom(second, out_shape=lambda s: s, out_dtype=lambda d: d, func_type="pyfunc",
                     bprop=lambda a, out, dout: (3 * a * a * dout,))
    j = jit(lambda x: mint.sum(op2(op1(x)) * x))
    g = rt.grad(j)
    g(Tensor(np.ones(3)))  # builds

    def work(n, x):
        if n == 2:
            assert events["in1"].wait(10)
        role.n, role.forwards = n, 0
        try:
            return g(x).asnumpy(), role.forwards
        finally:
            role.n = 0
            if n == 1:
                events["done1"].set()

    xs = [Tensor(np.full(3, 1.0)), Tensor(np.full(3, 2.0))]
    from thread_util import run_in_threads
    res = run_in_threads([lambda: work(1, xs[0]), lambda: work(2, xs[1])])
    for r, x in zip(res, xs):
        assert not isinstance(r, BaseException), r
        xv = x.asnumpy()
        np.testing.assert_allclose(r[0], 8 * xv ** 3 + 3 * 4 * xv * xv * 2 * xv, rtol=1e-12)
        assert r[1] == 1


def test_a_call_and_the_nodes_it_kept_are_freed_with_its_outputs_without_the_cycle_collector():
    """An opaque op's output handed out as it came (so its version is the caller's) and also read by the
    backward graph must not tie the call's node, the kept node and the output into a cycle."""
    import gc
    import weakref
    w = Tensor(RNG.standard_normal(3))
    def f(x):
        c = CountedCube.apply(x * w)
        return c, mint.sin(c) * CountedCube.apply(x)

    j = jit(f)
    x = Tensor(RNG.standard_normal(3)).requires_grad_()
    j(x)  # builds
    gc.collect()
    gc.disable()
    try:
        a, b = j(x)
        call = a._node
        kept = [weakref.ref(k) for k, _ in call.kept.nodes.values()]
        assert len(kept) == 2 and b._node is call
        call = weakref.ref(call)
        del a, b
        assert call() is None and all(k() is None for k in kept)
        a, b = j(x)
        mint.sum(a + b).backward()  # after a backward too
        call = weakref.ref(a._node)
        del a, b
        assert call() is None
    finally:
        gc.enable()

"""The call that traces runs the function once (issue 33, item 1): the trace is an eager run that records,
and its result is that call's result, so every op, an in-place one included, writes once, as without jit.
Covered: a Python autograd.Function's mark_dirty, a C++ Function's MarkDirty, an aot ops.Custom with an
inplace input, a GRAPH_MODE buffer decayed by such ops, a trace that stops after an in-place op (the
built-in `*=` then), Python statements before a stop, and the forward counts of a differentiated call."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import runtime as rt
from runtime import Parameter, Tensor, jit, mint, nn, ops
from runtime.autograd import Function
from runtime.ops import CustomRegOp, DataType

from jit_ops import CountedCube
from op_util import CPP, CUSTOM_SRC, load_op

RNG = np.random.default_rng(33)


@pytest.fixture(scope="module")
def counted(cache_dir):
    return load_op("jit_counted_ops", [CPP / "jit_counted_ops.cpp"], cflags=["-Wall", "-Wextra", "-Werror"])


@pytest.fixture(scope="module")
def assign_add(cache_dir):
    """custom_src/aot_inplace.cpp's AssignAdd: x += y in place (declared inplace), returns the new x."""
    info = (CustomRegOp("assign_add").input(0, "x", inplace=True).input(1, "y").output(0, "out")
            .dtype_format(DataType.F32_Default, DataType.F32_Default, DataType.F32_Default)
            .dtype_format(DataType.F64_Default, DataType.F64_Default, DataType.F64_Default).get_op_info())
    op = ops.Custom(f"{CUSTOM_SRC / 'aot_inplace.cpp'}:AssignAdd", lambda x, y: x, lambda x, y: x, reg_info=info)
    op(Tensor(np.zeros(1)), Tensor(np.zeros(1)))  # built here, outside the tests' counts
    return op


class Halve(Function):
    """x *= 0.5 in place (mark_dirty), counting its forwards."""

    forwards = 0

    @staticmethod
    def forward(ctx, x):
        Halve.forwards += 1
        x._data *= 0.5
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 0.5


def calls_of(fn, x, n=3):
    """x's values after each of ``n`` calls ``fn(x)`` (x written in place by the op)."""
    seen = []
    for _ in range(n):
        fn(x)
        seen.append(x.asnumpy().copy())
    return seen


def test_a_python_function_marking_its_input_dirty_writes_once_per_call():
    f = jit(lambda t: Halve.apply(t) + 1.0)
    x = Tensor(np.array([8.0, -4.0]))
    before = Halve.forwards
    got = f(x)
    assert Halve.forwards - before == 1
    np.testing.assert_array_equal(x.asnumpy(), [4.0, -2.0])
    np.testing.assert_array_equal(got.asnumpy(), [5.0, -1.0])
    np.testing.assert_array_equal(np.array(calls_of(f, x, 2)), [[2.0, -1.0], [1.0, -0.5]])
    assert f.traces == 1 and Halve.forwards - before == 3


@pytest.mark.parametrize("level", ["O0", "O1"])
def test_a_cpp_function_with_mark_dirty_writes_once_on_the_call_that_traces(counted, level):
    f = jit(lambda t: counted.scale_(t, 3.0) * 1.0, jit_level=level)
    x = Tensor(np.array([1.0, 2.0]))
    before = counted.forwards()
    np.testing.assert_array_equal(np.array(calls_of(f, x)), [[3.0, 6.0], [9.0, 18.0], [27.0, 54.0]])
    assert counted.forwards() - before == 3 and f.traces == 1


def test_an_aot_custom_with_an_inplace_input_writes_once_on_the_call_that_traces(assign_add):
    f = jit(lambda a, b: assign_add(a, b) * 2.0)
    x, y = Tensor(np.zeros(3)), Tensor(np.array([1.0, 2.0, 3.0]))
    out = f(x, y)
    np.testing.assert_array_equal(x.asnumpy(), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(out.asnumpy(), [2.0, 4.0, 6.0])
    f(x, y)
    np.testing.assert_array_equal(x.asnumpy(), [2.0, 4.0, 6.0])
    assert f.traces == 1


def test_a_graph_mode_buffer_decayed_three_times_is_decayed_three_times(graph_mode, counted, assign_add):
    class Decay(nn.Cell):
        def __init__(self, how):
            super().__init__()
            self.how = how
            self.buf = Parameter(Tensor(np.ones(2)), name="buf", requires_grad=False)

        def construct(self, x):
            if self.how == "function":
                b = Halve.apply(self.buf)
            elif self.how == "cpp":
                b = counted.scale_(self.buf, 0.5)
            else:
                b = assign_add(self.buf, self.buf * -0.5)
            return x * b

    for how in ("function", "cpp", "aot"):
        net = Decay(how)
        outs = [net(Tensor(np.ones(2))).asnumpy()[0] for _ in range(3)]
        assert net.buf.asnumpy().tolist() == [0.125, 0.125], how
        assert outs == [0.5, 0.25, 0.125], how
        assert net._graph_jit.traces == 1


def test_a_trace_stopped_after_an_in_place_op_does_not_run_that_op_again():
    def f(t):
        Halve.apply(t)
        t *= 2.0  # a write outside an op: the trace stops here, after Halve wrote
        return t * 1.0

    j = jit(f)
    x = Tensor(np.array([1.0, 3.0]))
    before = Halve.forwards
    with pytest.warns(RuntimeWarning, match=r"not captured: at .*test_jit_single_run\.py:\d+, '\*=' writes"):
        out = j(x)
    np.testing.assert_array_equal(x.asnumpy(), [1.0, 3.0])  # halved once, doubled once
    np.testing.assert_array_equal(out.asnumpy(), [1.0, 3.0])
    j(x)
    np.testing.assert_array_equal(x.asnumpy(), [1.0, 3.0])
    assert Halve.forwards - before == 2


def test_a_built_in_in_place_write_runs_once():
    def f(t):
        t *= 2.0
        t += 1.0
        return t

    j = jit(f)
    x = Tensor(np.array([1.0, 2.0]))
    with pytest.warns(RuntimeWarning, match="writes a tensor in place"):
        j(x)
    np.testing.assert_array_equal(x.asnumpy(), [3.0, 5.0])
    j(x)
    np.testing.assert_array_equal(x.asnumpy(), [7.0, 11.0])


def test_python_statements_before_a_stop_run_once_as_in_pynative(graph_mode):
    class Counter(nn.Cell):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def construct(self, x):
            self.calls += 1  # before the stop below
            s = float(mint.sum(x))  # the trace stops here
            return x * s * self.calls

    c = Counter()
    with pytest.warns(RuntimeWarning, match="not captured"):
        out = c(Tensor(np.array([2.0])))
    assert c.calls == 1 and out.asnumpy().tolist() == [4.0]


def test_the_call_that_traces_a_differentiated_function_runs_each_forward_once(counted):
    w = Parameter(Tensor(RNG.standard_normal(4)), name="w")

    def f(x):
        return mint.sum(counted.tanh(CountedCube.apply(x * w)) * x)

    x = Tensor(RNG.standard_normal(4))
    want_v, (want_gx, want_gw) = rt.value_and_grad(f, grad_position=0, weights=[w])(x)
    step = rt.value_and_grad(jit(f), grad_position=0, weights=[w])
    for _ in range(3):  # the first call traces; each runs CountedCube's and tanh's forward once
        before = CountedCube.forwards + counted.forwards()
        v, (gx, gw) = step(x)
        assert CountedCube.forwards + counted.forwards() - before == 2
        np.testing.assert_allclose(v.asnumpy(), want_v.asnumpy(), rtol=1e-12)
        np.testing.assert_allclose(gx.asnumpy(), want_gx.asnumpy(), rtol=1e-12)
        np.testing.assert_allclose(gw[0].asnumpy(), want_gw[0].asnumpy(), rtol=1e-12)


def test_gradients_through_a_dirty_intermediate_match_eager_on_every_call():
    def f(x):
        return mint.sum(mint.sin(Halve.apply(x * 3.0)) * x)

    x = Tensor(np.array([0.3, -1.1, 2.0]))
    want = rt.grad(f)(x).asnumpy()
    g = rt.grad(jit(f))
    for _ in range(3):
        np.testing.assert_allclose(g(x).asnumpy(), want, rtol=1e-12)


def test_graph_still_traces_with_nothing_recorded_and_the_next_call_runs_the_graph():
    f = jit(lambda t: Halve.apply(t) * 2.0)
    x = Tensor(np.array([4.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f.graph(x)  # traced for inspection: a real run of the function, as documented
    np.testing.assert_array_equal(x.asnumpy(), [2.0])
    np.testing.assert_array_equal(f(x).asnumpy(), [2.0])
    np.testing.assert_array_equal(x.asnumpy(), [1.0])
    assert f.traces == 1


def _dirty_input_scenario(op, returned):
    """x -> b = x * 1 -> the jitted call writes b in place (and returns it, or only sin of it) -> a loss
    reading both the result and b: b's history is the write, as eagerly."""
    x = Tensor(np.array([1.0, -2.0, 3.0]))
    x.requires_grad = True
    b = x * 1.0
    r = op(b)
    loss = mint.sum(r * Tensor(np.array([1.0, 2.0, 3.0]))) + mint.sum(b * Tensor(np.array([0.5, -1.0, 2.0])))
    loss.backward()
    return b.asnumpy(), r.asnumpy(), x.grad.asnumpy()


@pytest.mark.parametrize("returned", [True, False])
@pytest.mark.parametrize("kind", ["cpp", "python"])
def test_gradients_through_an_input_the_call_writes_match_eager_on_every_call(counted, kind, returned):
    write = (lambda t: counted.scale_(t, 2.0)) if kind == "cpp" else Halve.apply
    f = write if returned else (lambda t: mint.sin(write(t)))
    want = _dirty_input_scenario(f, returned)
    j = jit(f)
    for _ in range(3):  # the call that traces, then replays
        for got, exp in zip(_dirty_input_scenario(j, returned), want):
            np.testing.assert_allclose(got, exp, rtol=1e-14)
    assert j.traces == 1


def test_a_call_after_a_stop_may_call_the_same_jitted_method_again():
    """The rest of a stopped call runs eagerly while its trace's cache entry is being made: a jitted
    method it calls again (recursion through another instance) runs, it does not wait on itself."""

    class Tree:
        def __init__(self, child=None):
            self.child = child

        @jit
        def f(self, x):
            y = x * 2.0
            if float(mint.sum(y)) > 0 and self.child is not None:  # stops the trace
                return self.child.f(y)
            return y

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert Tree(Tree(Tree())).f(Tensor(np.array([1.0]))).asnumpy().tolist() == [8.0]


def test_a_higher_order_gradient_never_re_runs_an_op_that_wrote_an_input():
    """create_graph would re-run a replayed call's forward, and an op that wrote an input in place would write
    it again and read the written values: a call of such a trace that records a gradient runs eagerly instead
    (issue 33), so grad of grad equals eager's on every call, and each call writes once."""

    def f(t, buf):
        return mint.sum(mint.sin(t) * Halve.apply(buf))

    def second(fn, buf):
        t = Tensor(np.array([0.3, 0.7]))
        return rt.grad(lambda a: mint.sum(rt.grad(lambda b: fn(b, buf))(a)))(t)

    want = second(f, Tensor(np.array([4.0, 8.0])))
    j = jit(f)
    buf = Tensor(np.array([4.0, 8.0]))
    np.testing.assert_allclose(second(j, buf).asnumpy(), want.asnumpy(), rtol=1e-14)
    buf = Tensor(np.array([4.0, 8.0]))
    with pytest.warns(RuntimeWarning, match=r"Halve wrote an input \(its argument 0\) in place; a call of this "
                                            r"signature that records a gradient runs eagerly"):
        np.testing.assert_allclose(second(j, buf).asnumpy(), want.asnumpy(), rtol=1e-14)
    np.testing.assert_array_equal(buf.asnumpy(), [2.0, 4.0])  # written once, by the forward


def test_a_rule_that_reads_a_value_is_a_named_error_not_an_escaping_stop():
    """A derivative rule that turns a value into a Python number cannot be a backward graph: a RuntimeError
    naming the op (the trace's stop does not escape as an internal BaseException, nor leave half a graph)."""
    from runtime.ops.math import mul
    from runtime.ops.primitive import Primitive, defvjp
    reads = Primitive("reads_square", np.square)
    defvjp(reads, lambda g, ans, x: mul(g, 2.0 * float(mint.sum(x))))
    j = jit(lambda x: reads(x))
    x = Tensor(np.array([1.0, 2.0]))
    np.testing.assert_array_equal(j(x).asnumpy(), [1.0, 4.0])
    with pytest.raises(RuntimeError, match=r"^jit: the derivative rule of reads_square cannot be built into a "
                                           r"backward graph: at .*test_jit_single_run\.py:\d+, float\(\) of a "
                                           r"tensor turns its value into a Python value"):
        rt.grad(lambda a: mint.sum(j(a)))(x)

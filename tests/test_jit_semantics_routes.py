"""runtime.jit and GRAPH_MODE give eager's values, gradients and writes on every call (issue 33).

1. A C++ module function (OB_MODULE's ``m.def``) is one node of the trace, its whole call: a replay runs
   what it does besides a Function's Apply (an epilogue writing the output, a prologue writing an input, a
   Function picked by a tensor's value, two Functions, arguments handed over in another order). A call of a
   signature a node cannot hold (a float result) stops the trace: that signature runs eagerly.
2. A MarkDirty op returning its input at two positions: the gradients of both positions reach the one node
   output that tensor is, on the tracing call and on replays.
3. A call that records a gradient through a trace that wrote an input or a captured tensor runs eagerly:
   eager's gradient (with a graph of its own too), one write per call, no refusal after a write.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import runtime as rt
from runtime import Parameter, Tensor, jit, nn

from numeric_util import central
from op_util import BINDINGS, CPP, load_op

pytestmark = pytest.mark.build  # every test builds tests/cpp/jit_bound_ops.cpp (the fixture below)


@pytest.fixture(scope="module", params=BINDINGS)
def bound(cache_dir, request):
    """tests/cpp/jit_bound_ops.cpp, with each binding layer."""
    return load_op(f"jit_bound_ops_{request.param}", [CPP / "jit_bound_ops.cpp"],
                   cflags=["-Wall", "-Wextra", "-Werror"], binding=request.param)


def f64(*values):
    return Tensor(np.array(values, dtype=np.float64))


def quiet(fn, *args):
    """``fn(*args)`` with the RuntimeWarnings jit gives for a signature it runs eagerly silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return fn(*args)


# ---- 1. a module function is recorded whole ---------------------------------------------------------------

def test_an_epilogue_after_apply_runs_on_every_replay(bound):
    j = jit(lambda x, y: bound.post(x, y))
    want = bound.post(f64(1.0, 2.0), f64(1.0, 2.0)).asnumpy().tolist()
    assert want == [10.0, 20.0]
    assert [j(f64(1.0, 2.0), f64(1.0, 2.0)).asnumpy().tolist() for _ in range(3)] == [want] * 3
    assert j.traces == 1
    assert [(n.kind, n.op) for n in j.graph(f64(1.0, 2.0), f64(1.0, 2.0)).nodes] == [("cpp", "post")]


def test_a_function_picked_by_a_tensors_value_is_picked_on_every_replay(bound):
    j = jit(lambda x, flag: bound.pick(x, flag))
    for flag, k in [(0.0, 3.0), (1.0, 2.0), (0.0, 3.0), (1.0, 2.0)]:
        assert j(f64(1.0, 2.0), f64(flag)).asnumpy().tolist() == [k, 2 * k]
        assert bound.pick(f64(1.0, 2.0), f64(flag)).asnumpy().tolist() == [k, 2 * k]
    assert j.traces == 1


def test_a_prologue_writing_the_input_writes_it_on_every_replay(bound):
    j = jit(lambda x, y: bound.pre(x, y))
    xs = [f64(-1.0, 2.0) for _ in range(3)]
    outs = [j(x, f64(0.0, 0.0)).asnumpy().tolist() for x in xs]
    assert outs == [[0.0, 2.0]] * 3
    assert [x.asnumpy().tolist() for x in xs] == [[0.0, 2.0]] * 3  # as eagerly: each call clamps its input


@pytest.mark.parametrize("name, fn", [("mul_twice", lambda x, y: x * y * y), ("mul_swapped", lambda x, y: 2 * y)])
def test_gradients_through_a_call_of_two_functions_or_swapped_arguments_are_eagers(bound, name, fn):
    """Not one node over the function's arguments: the gradient goes through what the call recorded."""
    op = getattr(bound, name)
    j = jit(lambda x, y: op(x * 1.0, y) * 1.0)
    x0, y0 = np.array([1.0, -2.0]), np.array([3.0, 0.5])
    want_x = central(lambda v: float(np.sum(fn(v, y0))), x0)
    want_y = central(lambda v: float(np.sum(fn(x0, v))), y0)
    for _ in range(3):  # the tracing call, then replays
        gx, gy = rt.grad(lambda a, b: (j(a, b)).sum(), grad_position=(0, 1))(Tensor(x0.copy()), Tensor(y0.copy()))
        np.testing.assert_allclose(gx.asnumpy(), want_x, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(gy.asnumpy(), want_y, rtol=1e-7, atol=1e-9)
    eager = rt.grad(lambda a, b: (op(a * 1.0, b) * 1.0).sum(), grad_position=(0, 1))(Tensor(x0), Tensor(y0))
    np.testing.assert_allclose(eager[0].asnumpy(), want_x, rtol=1e-7, atol=1e-9)


def test_a_list_in_and_out_replays_both_functions(bound):
    j = jit(lambda a, b, c: bound.products([a, b, c]))
    for k in (1.0, 2.0, 3.0):
        assert [o.asnumpy().tolist() for o in j(f64(k), f64(2.0), f64(3.0))] == [[2.0 * k], [6.0]]
    assert j.traces == 1


def test_a_function_pointer_with_a_number_argument_is_recorded(bound):
    j = jit(lambda x, k: bound.scale_k(x, k))
    assert j(f64(1.0), 1.0).asnumpy().tolist() == [2.0]
    assert j(f64(1.0), -1.0).asnumpy().tolist() == [3.0]  # another number: another signature
    assert j(f64(5.0), 1.0).asnumpy().tolist() == [10.0]


def test_a_const_tensor_result_is_recorded(bound):
    j = jit(lambda x: bound.scale_const(x))
    assert [j(f64(1.0, 2.0)).asnumpy().tolist() for _ in range(2)] == [[2.0, 4.0]] * 2
    assert j.traces == 1
    assert [(n.kind, n.op) for n in j.graph(f64(1.0, 2.0)).nodes] == [("cpp", "scale_const")]


def test_an_optional_number_argument_is_recorded(bound):
    j = jit(lambda x, k: bound.scale_opt(x, k))
    for k, want in [(None, 3.0), (1.5, 2.0), (None, 3.0)]:
        assert j(f64(1.0), k).asnumpy().tolist() == [want]
    assert j.traces == 2


def test_a_mutable_functions_state_is_one_on_every_route(bound):
    """The replay runs the very function object eager calls run: its state moves on once per call."""
    j = jit(lambda x: bound.count_scale(x))
    start = bound.count_scale(f64(1.0)).asnumpy()[0]
    got = [j(f64(1.0)).asnumpy()[0], j(f64(1.0)).asnumpy()[0], bound.count_scale(f64(1.0)).asnumpy()[0],
           j(f64(1.0)).asnumpy()[0]]
    assert got == [start + 1, start + 2, start + 3, start + 4]


def test_a_float_result_stops_the_trace_and_the_signature_runs_eagerly(bound):
    j = jit(lambda x: bound.total(x))
    with pytest.warns(RuntimeWarning, match=r"not captured: at .*test_jit_semantics_routes\.py:\d+, the C\+\+ "
                                            r"function total takes or returns a value a graph node cannot hold"):
        assert j(f64(1.0, 2.0)) == 3.0
    assert j(f64(3.0, 2.0)) == 5.0
    assert j.traces == 0


def test_graph_mode_runs_a_module_functions_epilogue_on_every_call(graph_mode, bound):
    class Net(nn.Cell):
        def construct(self, x, flag):
            return bound.post(bound.pick(x, flag), flag)

    net = Net()
    for flag, k in [(0.0, 30.0), (1.0, 20.0), (1.0, 20.0), (0.0, 30.0)]:
        assert net(f64(1.0, 2.0), f64(flag)).asnumpy().tolist() == [k, 2 * k]


@pytest.mark.parametrize("name, loss, fn", [
    ("sq", lambda o: o.sum(), lambda v: np.sum(v * v)),
    ("two", lambda o: (o[0] + 2.0 * o[1]).sum(), lambda v: np.sum(v * 3.0 + 2.0 * v * v)),
    ("pair", lambda o: (o[0] + 2.0 * o[1]).sum(), lambda v: np.sum(3.0 * v * v)),
])
def test_gradients_of_one_argument_used_twice_or_two_functions_are_eagers_on_replays(bound, name, loss, fn):
    """x * x has two edges to x; two Functions' outputs two nodes: neither is one node over the arguments."""
    op = getattr(bound, name)
    call = (lambda x: loss(op(x))) if name != "two" else (lambda x: loss(op(x, f64(3.0, 3.0))))
    j = jit(call)
    for v in ([1.0, 2.0], [2.0, -1.0], [3.0, 0.5]):
        want = central(lambda a: float(fn(a)), np.array(v))
        for f in (call, j):
            np.testing.assert_allclose(rt.grad(f)(f64(*v)).asnumpy(), want, rtol=1e-7)
    assert j.traces == 1


@pytest.mark.parametrize("name, loss, fn", [
    ("mul_twice", lambda op, x, y: op(x, x).sum(), lambda x, y: np.sum(x * x * x)),  # x at two positions
    ("ret_in", lambda op, x, y: (op(x, y)[1] * 3.0 + op(x, y)[0]).sum(), lambda x, y: np.sum(3.0 * x + x * y)),
    ("ret_in_only", lambda op, x, y: op(x, y).sum(), lambda x, y: np.sum(x)),
])
def test_gradients_of_an_argument_used_twice_or_handed_back_are_eagers_on_replays(bound, name, loss, fn):
    """A call whose recorded nodes are not one node over its arguments: the gradient through what it recorded,
    each argument counted once, an argument handed back as it is passing its gradient through."""
    op = getattr(bound, name)
    call = lambda x, y: loss(op, x, y)
    j = jit(call)
    y0 = np.array([2.0, -1.0])
    for v in ([1.0, 2.0], [2.0, -1.0], [3.0, 0.5]):
        want = central(lambda a: float(fn(a, y0)), np.array(v))
        for f in (call, j, j):
            np.testing.assert_allclose(rt.grad(f)(f64(*v), Tensor(y0.copy())).asnumpy(), want, rtol=1e-7)
        x = Tensor(np.array(v), requires_grad=True)
        j(x, Tensor(y0.copy())).backward()
        np.testing.assert_allclose(x.grad.asnumpy(), want, rtol=1e-7)
    assert j.traces == 1


def test_a_parameter_handed_back_by_two_calls_takes_both_gradients(bound):
    w = Parameter(np.array([1.0, 2.0]))
    x0 = np.array([3.0, 5.0])
    call = lambda x: (bound.ret_in(w, x)[1] * 3.0 + bound.ret_in(w, x)[0]).sum()
    j = jit(call)
    want = central(lambda v: float(np.sum(3.0 * v + v * x0)), w.asnumpy().copy())
    for f in (call, j, j, j):
        w.grad = None
        f(Tensor(x0.copy())).backward()
        np.testing.assert_allclose(w.grad.asnumpy(), want, rtol=1e-7)


@pytest.mark.parametrize("call", [
    lambda op, x, fl: op(x, fl), lambda op, x, fl: op(x * 1.0, fl) * 1.0, lambda op, x, fl: op(x, fl) + op(x, fl),
    lambda op, x, fl: op(x, fl * 1.0), lambda op, x, fl: op(x, fl[0:1]), lambda op, x, fl: op(x, fl.reshape((1,))),
    lambda op, x, fl: op(x, fl * 1.0) + op(x, fl + 0.0),
], ids=["alone", "between", "twice", "through_mul", "through_view", "through_reshape", "two_paths"])
def test_an_input_a_call_does_not_differentiate_keeps_no_grad_on_replays(bound, call):
    """pick's flag only picks the Function (its gradient is None): ``.grad`` stays None on every call, as
    eagerly; the backward graph's zeros for it are not handed on as a gradient."""
    j = jit(lambda x, fl: call(bound.pick, x, fl).sum())
    for f in (lambda x, fl: call(bound.pick, x, fl).sum(), j, j, j):
        x = Parameter(np.array([1.0, 2.0]), name="x")
        fl = Parameter(np.array([1.0]), name="fl")
        f(x, fl).backward()
        assert fl.grad is None
        want = central(lambda v: float(np.sum(call(lambda a, b: 2.0 * a, v, np.array([1.0])))), np.array([1.0, 2.0]))
        np.testing.assert_allclose(x.grad.asnumpy(), want, rtol=1e-7)
    assert j.traces == 1


def test_an_input_a_call_does_not_differentiate_takes_its_other_uses_gradient_on_replays(bound):
    """The flag also feeds a differentiable op: its gradient is that op's alone, on every call."""
    call = lambda x, fl: (bound.pick(x, fl * 1.0).sum() + (fl * 3.0).sum())
    j = jit(call)
    for f in (call, j, j, j):
        x = Parameter(np.array([1.0, 2.0]), name="x")
        fl = Parameter(np.array([1.0]), name="fl")
        f(x, fl).backward()
        assert fl.grad.asnumpy().tolist() == [3.0]
        assert x.grad.asnumpy().tolist() == [2.0, 2.0]


def test_overloads_of_one_name_are_recorded_whole(bound):
    """nanobind moves the overloads into a new function object on each def: the replay runs the newest."""
    j = jit(lambda x, k: bound.scale2(x, k))
    assert [j(f64(1.0), k).asnumpy().tolist() for k in (1.0, -1.0, 1.0)] == [[2.0], [3.0], [2.0]]
    jt = jit(lambda x, y: bound.scale2(x, y))
    assert [jt(f64(v), f64(2.0)).asnumpy().tolist() for v in (1.0, 2.0)] == [[2.0], [4.0]]
    assert (j.traces, jt.traces) == (2, 1)


def test_a_keyword_only_argument_stops_the_trace(bound):
    j = jit(lambda x, k: bound.scale_kw(x, k=k))
    with pytest.warns(RuntimeWarning, match=r"not captured: at .*test_jit_semantics_routes\.py:\d+, the C\+\+ "
                                            r"function scale_kw takes keyword-only arguments, which a replay "
                                            r"cannot pass; this signature runs eagerly"):
        assert j(f64(1.0), 1.0).asnumpy().tolist() == [2.0]
    assert [j(f64(v), 1.0).asnumpy().tolist() for v in (1.0, 2.0)] == [[2.0], [4.0]]
    assert j.traces == 0


def test_a_null_result_stops_the_trace(bound):
    j = jit(lambda x, k: bound.maybe_none(x, k))
    with pytest.warns(RuntimeWarning, match=r"the C\+\+ function maybe_none returned NoneType, where a graph "
                                            r"node holds tensors; this signature runs eagerly"):
        assert j(f64(2.0), -1.0) is None
    assert j(f64(2.0), -1.0) is None
    assert [j(f64(v), 1.0).asnumpy().tolist() for v in (2.0, 3.0)] == [[4.0], [9.0]]
    assert j.traces == 1


@pytest.mark.parametrize("where", ["helper", "submodule"])
def test_a_helper_taking_the_module_and_a_submodule_record_whole(bound, where):
    op = bound.post_helper if where == "helper" else bound.sub.post
    j = jit(lambda x, y: op(x, y))
    assert [j(f64(1.0, 2.0), f64(0.0, 0.0)).asnumpy().tolist() for _ in range(3)] == [[10.0, 20.0]] * 3
    assert [(n.kind, n.op) for n in j.graph(f64(1.0, 2.0), f64(0.0, 0.0)).nodes] == [
        ("cpp", "post_helper" if where == "helper" else "post")]


# ---- 2. a MarkDirty op returning its input at two positions -----------------------------------------------

@pytest.mark.parametrize("inside", [False, True], ids=["input", "intermediate"])
def test_a_dirty_input_returned_twice_takes_both_gradients(bound, inside):
    """(o1 + 10 o2).sum() of o1, o2 = x*2 (in place), both x: d/da = 2 (1 + 10) = 22, as eagerly."""
    op = (lambda b: bound.dirty_twice(b * 1.0)) if inside else bound.dirty_twice
    j = jit(op)

    def loss(call, a):
        o1, o2 = call(a * 1.0)
        return (o1 * 1.0 + o2 * 10.0).sum()

    want = central(lambda v: float(np.sum(2 * v + 10 * 2 * v)), np.array([1.0, 2.0]))
    assert np.allclose(want, 22.0)
    for call in (op, j, j, j):
        g = quiet(rt.grad(lambda a: loss(call, a)), f64(1.0, 2.0))
        np.testing.assert_allclose(g.asnumpy(), want, rtol=1e-7)
        a = Tensor(np.array([1.0, 2.0]), requires_grad=True)
        quiet(lambda: loss(call, a).backward())
        np.testing.assert_allclose(a.grad.asnumpy(), want, rtol=1e-7)


# ---- 3. a gradient through a trace that writes an input or a captured tensor ------------------------------

def test_a_gradient_through_a_captured_write_is_eagers_with_one_write_per_call(bound):
    y = Tensor(np.array([3.0, 4.0]))

    def f(x):
        bound.scale3_(y)  # a running statistic, updated in place
        return (x * x).sum()

    j = jit(f)
    want = central(lambda v: float(np.sum(v * v)), np.array([1.0, 2.0]))
    for k, call in enumerate([f, j, j, j]):
        x = Tensor(np.array([1.0, 2.0]), requires_grad=True)  # rt.grad of an input that requires grad: nested
        g = quiet(rt.grad(call), x)
        np.testing.assert_allclose(g.asnumpy(), want, rtol=1e-7)
        assert y.asnumpy().tolist() == [3.0 * 3 ** (k + 1), 4.0 * 3 ** (k + 1)]  # once per call
        g = quiet(rt.grad(call), Tensor(np.array([1.0, 2.0])))  # plain: the same
        np.testing.assert_allclose(g.asnumpy(), want, rtol=1e-7)
        y._data[...] = [3.0 * 3 ** (k + 1), 4.0 * 3 ** (k + 1)]


def test_a_gradient_through_a_write_of_the_calls_own_input_is_eagers_on_every_call(bound):
    j = jit(lambda b: bound.scale3_(b))
    want = central(lambda v: float(np.sum(3 * v * 10)), np.array([1.0, 2.0]))
    with pytest.warns(RuntimeWarning, match=r"scale3_ wrote an input \(its argument 0\) in place; a call of "
                                            r"this signature that records a gradient runs eagerly"):
        for _ in range(3):
            a = Tensor(np.array([1.0, 2.0]), requires_grad=True)
            g = rt.grad(lambda t: (j(t * 1.0) * 10.0).sum())(a)
            np.testing.assert_allclose(g.asnumpy(), want, rtol=1e-7)
            assert a.asnumpy().tolist() == [1.0, 2.0]  # (the write was to a * 1.0)


def test_grad_of_grad_through_a_captured_write_is_eagers(bound):
    y = Tensor(np.array([3.0, 4.0]))

    def f(x):
        bound.scale3_(y)
        return (x * x * x).sum()

    j = jit(f)
    for call in (f, j, j):
        g2 = quiet(rt.grad(lambda a: rt.grad(call)(a).sum()), f64(1.0, 2.0))
        np.testing.assert_allclose(g2.asnumpy(), [6.0, 12.0], rtol=1e-12)


def test_a_signature_whose_trace_writes_an_input_has_no_backward_graph(bound):
    j = jit(lambda b: bound.scale3_(b))
    with pytest.raises(RuntimeError, match=r"^jit\(.*<lambda>\): this signature has no backward graph: scale3_ "
                                           r"wrote an input \(its argument 0\) in place, and a gradient through "
                                           r"such a write is taken eagerly \(each call writes once, and a gradient "
                                           r"of the gradient needs the forward recorded op by op\); differentiate "
                                           r"the call itself$"):
        j.backward_graph(f64(1.0, 2.0))


def test_graph_mode_training_with_a_buffer_written_in_place_is_eagers(graph_mode, bound):
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = Parameter(Tensor(np.array([0.5, -1.0])), name="w")
            self.stat = Parameter(Tensor(np.ones(2)), name="stat", requires_grad=False)

        def construct(self, x):
            bound.scale3_(self.stat)
            return (self.w * x * x).sum()

    net = Net()
    for k in range(1, 4):
        x = Tensor(np.array([1.0, 2.0]), requires_grad=True)  # an input that requires grad: a nested gradient
        gx, (gw,) = quiet(rt.grad(net, grad_position=0, weights=[net.w]), x)
        np.testing.assert_allclose(gx.asnumpy(), [1.0, -4.0], rtol=1e-12)  # 2 w x
        np.testing.assert_allclose(gw.asnumpy(), [1.0, 4.0], rtol=1e-12)  # x * x
        assert net.stat.asnumpy().tolist() == [3.0 ** k] * 2

"""runtime.jit and GRAPH_MODE give eager's values, gradients and writes on every call (issue 33).

1. A C++ module function (OB_MODULE's ``m.def``) is one node of the trace, its whole call: a replay runs
   what it does besides a Function's Apply (an epilogue writing the output, a prologue writing an input, a
   Function picked by a tensor's value, two Functions, arguments handed over in another order). A call of a
   signature a node cannot hold (a float result) stops the trace: that signature runs eagerly.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, jit, nn

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

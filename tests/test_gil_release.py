"""A bound function that releases the GIL around its body (``call_guard<gil_scoped_release>``).

Apply reads and records Python state (grad mode, the graph, a jit trace), so it takes the GIL back for
its call; the function's own code runs without it. Before, any such call crashed (SIGSEGV), eagerly too.
"""
from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

import runtime as rt
from runtime import Parameter, Tensor, jit

from numeric_util import central
from op_util import BINDINGS, CPP, load_op

pytestmark = pytest.mark.build  # every test builds tests/cpp/gil_release_ops.cpp


@pytest.fixture(scope="module", params=BINDINGS)
def ops(cache_dir, request):
    return load_op(f"gil_release_ops_{request.param}", [CPP / "gil_release_ops.cpp"],
                   cflags=["-Wall", "-Wextra", "-Werror"], binding=request.param)


def test_a_call_without_the_gil_runs_and_records(ops):
    x0, y0 = np.array([1.0, -2.0]), np.array([3.0, 0.5])
    assert ops.twice(Tensor(x0)).asnumpy().tolist() == [2.0, -4.0]
    x = Parameter(x0.copy(), name="x")
    y = Parameter(y0.copy(), name="y")
    out = ops.mul_twice(x, y)
    assert out.asnumpy().tolist() == [6.0, -2.0]
    out.sum().backward()
    np.testing.assert_allclose(x.grad.asnumpy(), central(lambda v: float(np.sum(2 * v * y0)), x0), rtol=1e-7)
    np.testing.assert_allclose(y.grad.asnumpy(), central(lambda v: float(np.sum(2 * x0 * v)), y0), rtol=1e-7)


def test_calls_from_threads_without_the_gil_are_right(ops):
    got, errors = [], []

    def work():
        try:
            for _ in range(100):
                x = Tensor(np.ones(257), requires_grad=True)
                ops.twice(x).sum().backward()
                got.append((float(ops.twice(Tensor(np.ones(257))).asnumpy().sum()), float(x.grad.asnumpy().sum())))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert set(got) == {(514.0, 514.0)} and len(got) == 400


def test_a_jit_trace_and_replays_of_a_call_without_the_gil_are_eagers(ops):
    y0 = np.array([3.0, 0.5])
    call = lambda x: ops.mul_twice(x * 1.0, Tensor(y0.copy())).sum()
    j = jit(call)
    want = central(lambda v: float(np.sum(2 * v * y0)), np.array([1.0, -2.0]))
    for f in (call, j, j, j):
        x = Parameter(np.array([1.0, -2.0]), name="x")
        assert float(f(x).asnumpy()) == pytest.approx(float(np.sum(2 * np.array([1.0, -2.0]) * y0)))
        x = Parameter(np.array([1.0, -2.0]), name="x")
        f(x).backward()
        np.testing.assert_allclose(x.grad.asnumpy(), want, rtol=1e-7)
        np.testing.assert_allclose(rt.grad(f)(Tensor(np.array([1.0, -2.0]))).asnumpy(), want, rtol=1e-7)
    assert j.traces == 1


def test_a_trace_meeting_a_class_methods_apply_without_the_gil_stops_with_a_warning(ops):
    s = ops.Scaler()
    j = jit(lambda x: s.apply(x).sum())
    x = Parameter(np.array([1.0, -2.0]), name="x")
    with pytest.warns(RuntimeWarning, match="the C\\+\\+ Function Twice was applied by a function jit cannot record"):
        j(x).backward()
    assert x.grad.asnumpy().tolist() == [2.0, 2.0]
    x = Parameter(np.array([1.0, -2.0]), name="x")
    j(x).backward()  # that signature now runs eagerly, without a new warning
    assert x.grad.asnumpy().tolist() == [2.0, 2.0]


def test_calls_without_the_gil_while_another_thread_traces(ops):
    """The trace flag is the process's: a call on another thread sees it set while a trace runs."""
    done, calls, errors = [], [0], []

    def chain(x):
        for _ in range(300):
            x = x * 1.0
        return x

    def trace():
        for _ in range(3):
            jit(chain)(Tensor(np.ones(2)))  # a new jit: traced each time
        done.append(True)

    def call():
        try:
            while not done:
                assert ops.twice(Tensor(np.ones(2))).asnumpy().tolist() == [2.0, 2.0]
                calls[0] += 1
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=call), threading.Thread(target=trace)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and calls[0] > 0

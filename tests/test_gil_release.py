"""A bound function that releases the GIL around its body (``call_guard<gil_scoped_release>``).

Apply reads and records Python state (grad mode, the graph, a jit trace), so it takes the GIL back for
its call; the function's own code runs without it. Before, any such call crashed (SIGSEGV), eagerly too.
"""
from __future__ import annotations

import threading

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

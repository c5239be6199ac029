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


# ---- bodies, Forwards and Backwards that release the GIL themselves (detail/gil_wrap.h) ----

_X0, _Y0 = np.array([1.0, -2.0, 0.5]), np.array([3.0, 0.5, -1.5])
# each function: (its values, its loss's gradient with respect to each argument, by central differences)
_RELEASING = {
    "thrice": ((_X0,), lambda x: 3 * x),
    "released_twice": ((_X0,), lambda x: 2 * x),
    "c_api_mul_twice": ((_X0, _Y0), lambda x, y: 3 * x * y),
    "checked_twice": ((_X0,), lambda x: 2 * x),  # a GIL check, then Python
    "twice": ((_X0,), lambda x: 2 * x),  # call_guard: the FFI route calls the body, not the binding
    "mul_twice": ((_X0, _Y0), lambda x, y: 2 * x * y),
}


def _expected_grads(args, f):
    loss = lambda *a: float(np.sum(f(*a) ** 2))
    return [central(lambda v, i=i: loss(*args[:i], v, *args[i + 1:]), a) for i, a in enumerate(args)]


@pytest.mark.parametrize("name", sorted(_RELEASING))
def test_a_body_that_releases_the_gil_itself_runs_eagerly(ops, name):
    args, f = _RELEASING[name]
    params = [Parameter(a.copy(), name=f"a{i}") for i, a in enumerate(args)]
    out = getattr(ops, name)(*params)
    np.testing.assert_allclose(out.asnumpy(), f(*args), rtol=1e-15)
    (out * out).sum().backward()
    for p, want in zip(params, _expected_grads(args, f)):
        np.testing.assert_allclose(p.grad.asnumpy(), want, rtol=1e-7)


@pytest.mark.parametrize("name", sorted(_RELEASING))
def test_a_body_that_releases_the_gil_runs_on_the_xla_ffi_route(ops, name):
    """The FFI route runs the function on XLA's thread, which holds no GIL: there a release does nothing.
    Before, CPython aborted the process (Fatal Python error: PyEval_SaveThread)."""
    jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'opbuilder[jax]')")
    import jax.numpy as jnp
    import opbuilder

    args, f = _RELEASING[name]
    fn = getattr(opbuilder.to_jax(ops), name)
    x64 = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        jargs = [jnp.asarray(a) for a in args]
        assert fn.route(*jargs) == "xla_ffi"
        np.testing.assert_allclose(np.asarray(jax.jit(fn)(*jargs)), f(*args), rtol=1e-15)
        loss = lambda *a: (fn(*a) ** 2).sum()
        grads = jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))(*jargs)
        for g, want in zip(grads, _expected_grads(args, f)):
            np.testing.assert_allclose(np.asarray(g), want, rtol=1e-7)
    finally:
        jax.config.update("jax_enable_x64", x64)


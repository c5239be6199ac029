"""to_torch: a bound function that chains two Applies (tests/cpp/jit_bound_ops.cpp `mul_twice`,
Mul::Apply(Mul::Apply(x, y), y)) differentiates through both on every route and every call (issue 33).

On the C++ bridge the inner Apply's output is a torch tensor the outer Apply takes as its argument: its
node must be the outer node's input edge, as for a torch tensor handed in by the caller.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

import opbuilder  # noqa: E402
from numeric_util import central  # noqa: E402
from op_util import BINDINGS, CPP, load_op  # noqa: E402

pytestmark = pytest.mark.build  # every test builds tests/cpp/jit_bound_ops.cpp (the fixture below)

X = np.array([1.0, 2.0, -0.5])
Y = np.array([3.0, 4.0, 1.5])


@pytest.fixture(scope="module", params=BINDINGS)
def bound(cache_dir, request):
    """tests/cpp/jit_bound_ops.cpp, with each binding layer."""
    return load_op(f"jit_bound_ops_{request.param}", [CPP / "jit_bound_ops.cpp"],
                   cflags=["-Wall", "-Wextra", "-Werror"], binding=request.param)


def _fast(fn) -> int:
    op = fn.bridged[0]
    return 0 if op is None else op.fast_calls


def _loss(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.sum(x * y * y))


@pytest.mark.parametrize("needs", ["x", "y", "both"])
def test_two_chained_applies_differentiate_on_every_call(bound, torch_route, needs):
    ops = opbuilder.to_torch(bound)
    want_x = central(lambda v: _loss(v, Y), X)
    want_y = central(lambda v: _loss(X, v), Y)
    for call in range(1, 4):
        x = torch.tensor(X, requires_grad=needs in ("x", "both"))
        y = torch.tensor(Y, requires_grad=needs in ("y", "both"))
        out = ops.mul_twice(x, y)
        np.testing.assert_allclose(out.detach().numpy(), X * Y * Y, err_msg=f"call {call}")
        assert out.requires_grad, f"call {call}: the output has no history"
        wrt = [t for t in (x, y) if t.requires_grad]
        grads = torch.autograd.grad(out.sum(), wrt)
        want = {"x": [want_x], "y": [want_y], "both": [want_x, want_y]}[needs]
        for g, w in zip(grads, want):
            np.testing.assert_allclose(g.numpy(), w, rtol=1e-6, atol=1e-6, err_msg=f"call {call}")
    if torch_route == "bridge":  # calls 2 and 3 took the C++ bridge, where the inner gradient was lost
        assert _fast(ops.mul_twice) == 2


def test_two_chained_applies_under_no_grad_record_nothing(bound, torch_route):
    ops = opbuilder.to_torch(bound)
    for call in range(1, 4):
        x = torch.tensor(X, requires_grad=True)
        y = torch.tensor(Y, requires_grad=True)
        with torch.no_grad():
            out = ops.mul_twice(x, y)
        np.testing.assert_allclose(out.numpy(), X * Y * Y, err_msg=f"call {call}")
        assert not out.requires_grad and out.grad_fn is None, f"call {call}"


@pytest.fixture(scope="module")
def threaded(cache_dir):
    """tests/cpp/thread_apply_ops.cpp: an Apply on a std::thread the bound function starts."""
    return load_op("thread_apply_ops", [CPP / "thread_apply_ops.cpp"], cflags=["-Wall", "-Wextra", "-Werror"])


@pytest.mark.parametrize("needs_grad", [True, False])
def test_an_apply_on_a_thread_of_the_bound_function_records_on_every_call(threaded, torch_route, needs_grad):
    ops = opbuilder.to_torch(threaded)
    want = central(lambda v: float(np.sum(3.0 * v * v)), X)  # d/dx sum(triple(x) * x)
    for call in range(1, 4):
        x = torch.tensor(X, requires_grad=needs_grad)
        out = ops.triple_on_thread(x)
        np.testing.assert_allclose(out.detach().numpy(), 3.0 * X, err_msg=f"call {call}")
        assert out.requires_grad == needs_grad, f"call {call}"
        if needs_grad:  # the op's node and torch's own use of x both reach x.grad
            (g,) = torch.autograd.grad((out * x).sum(), [x])
            np.testing.assert_allclose(g.numpy(), want, rtol=1e-6, atol=1e-6, err_msg=f"call {call}")
    if torch_route == "bridge":
        assert _fast(ops.triple_on_thread) == 2

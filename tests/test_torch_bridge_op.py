"""Once to_torch's C++ bridge is loaded, a namespace's function is the bridge's Op itself
(src/torch_bridge.cpp): an eager call runs no Python before the operator (issue 38 goal 3), while
torch.compile, copy, op_handle and the function's attributes see what they saw before."""
from __future__ import annotations

import copy
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

import opbuilder  # noqa: E402
from opbuilder.bridges.interop_torch import op_handle  # noqa: E402

pytestmark = pytest.mark.build


@pytest.fixture(autouse=True)
def bridge_on(torch_bridge, monkeypatch):
    monkeypatch.setenv("OPBUILDER_TORCH_BRIDGE", "1")


def _python_calls(fn, *args):
    """The Python functions entered while ``fn(*args)`` runs (sys.setprofile's 'call' events)."""
    seen = []

    def profile(frame, event, arg):
        if event == "call":
            seen.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        out = fn(*args)
    finally:
        sys.setprofile(None)
    return out, seen


def test_a_warm_eager_call_runs_no_python_before_the_operator(my_ops):
    t = opbuilder.to_torch(my_ops)
    x, y = torch.randn(3, 4), torch.randn(4)
    for _ in range(2):  # the first call of the signature defines its operator on the Python path
        t.mul(x, y)
    before = t.mul.bridged[0].fast_calls
    out, seen = _python_calls(lambda: t.mul(x, y))
    assert seen == ["<lambda>"]  # the caller's own frame only: no Python wrapper around the C++ call
    assert t.mul.bridged[0].fast_calls == before + 1
    torch.testing.assert_close(out, x * y)


def test_a_namespace_made_after_the_bridge_loaded_holds_the_op_at_once(my_ops):
    t = opbuilder.to_torch(my_ops)
    assert type(t.mul).__name__ == "Op"
    assert t.mul.bridged[0] is t.mul


def test_the_op_keeps_the_functions_attributes(my_ops):
    t = opbuilder.to_torch(my_ops)
    assert t.mul.__name__ == "mul" and t.mul.__qualname__ == "mul"
    assert t.mul.__doc__ == my_ops.mul.__doc__
    x, y = torch.randn(3), torch.randn(3)
    handle = op_handle(t.mul, x, y)
    torch.testing.assert_close(handle(x, y)[0], x * y)


def test_copying_the_op_gives_the_op(my_ops):
    # as for the function it replaces: a deepcopy of a model holding it keeps working
    t = opbuilder.to_torch(my_ops)
    assert copy.copy(t.mul) is t.mul
    assert copy.deepcopy(t.mul) is t.mul
    model = torch.nn.Module()
    model.fn = t.mul
    assert copy.deepcopy(model).fn is t.mul


def test_a_function_held_from_before_the_bridge_loaded_still_works(my_ops, monkeypatch):
    # a namespace made while the bridge was building holds to_torch's Python function; its first call
    # once the bridge is loaded makes the Op, which takes the function's place in the namespace; the
    # function held still works
    from opbuilder.bridges import torch_bridge
    with monkeypatch.context() as m:
        m.setattr(torch_bridge, "loaded", lambda: None)  # as while it builds
        t = opbuilder.to_torch(my_ops)
    held = t.mul
    assert type(held).__name__ == "function"
    x, y = torch.randn(3), torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(held(x, y), x * y)
    assert type(t.mul).__name__ == "Op" and held.bridged[0] is t.mul
    assert t.mul.fast_calls >= 1
    torch.testing.assert_close(t.mul(x, y), x * y)


def test_torch_compile_traces_the_python_path_through_the_op(my_ops):
    t = opbuilder.to_torch(my_ops, shape_fn={"mul": lambda x, y: x})
    assert type(t.mul).__name__ == "Op"
    x, y = torch.randn(3), torch.randn(3)
    f = torch.compile(lambda a, b: t.mul(a, b) * 2, fullgraph=True, backend="eager")
    torch.testing.assert_close(f(x, y), x * y * 2)
    xr = x.clone().requires_grad_()
    f(xr, y).sum().backward()
    torch.testing.assert_close(xr.grad, y * 2)

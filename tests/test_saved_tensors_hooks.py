"""saved_tensors_hooks on every route (issue 33): what an operator saves for backward goes through the
pack hook when it is saved, and backward reads what the unpack hook returns, with no version check
(torch's rule): the runtime's own hooks (runtime.autograd.saved_tensors_hooks) for C++ and Python
Functions, and torch's on to_torch's Python path (tests/test_torch_bridge_semantics.py: the bridge).
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

import runtime as rt

pytestmark = pytest.mark.build


@pytest.fixture
def bridge_ops(inplace_view_ops):
    """tests/cpp/inplace_view_ops.cpp (conftest): in-place scales, a saving multiply, an exp saving its output."""
    return inplace_view_ops


def _copying_hooks(packed):
    def pack(t):
        packed.append(t.numpy().tolist())
        return rt.Tensor(t.numpy().copy())
    return rt.autograd.saved_tensors_hooks(pack, lambda p: p)


def test_a_cpp_function_saves_through_the_runtime_hooks(bridge_ops):
    x = rt.Tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = rt.Tensor(np.array([3.0, 4.0]))
    packed = []
    with _copying_hooks(packed):
        z = bridge_ops.mul_saved(x, y)
    assert packed == [[1.0, 2.0], [3.0, 4.0]]
    bridge_ops.scale_(y, 10.0)  # no version error: what backward reads is the hook's copy
    z.sum().backward()
    assert x.grad.numpy().tolist() == [3.0, 4.0]


def test_the_unpack_hook_gives_a_cpp_backward_what_it_reads(bridge_ops):
    x = rt.Tensor(np.array([0.0, 1.0]), requires_grad=True)
    with rt.autograd.saved_tensors_hooks(lambda t: t, lambda t: rt.Tensor(np.full(2, 5.0))):
        z = bridge_ops.exp_saves_output(x)  # saves its output
    z.sum().backward()
    assert x.grad.numpy().tolist() == [5.0, 5.0]
    with rt.autograd.saved_tensors_hooks(lambda t: t, lambda t: "not a tensor"):
        z = bridge_ops.exp_saves_output(x)
    with pytest.raises(TypeError, match=r"ExpSavesOutput: the saved_tensors_hooks unpack hook returned a str for "
                                        r"saved slot 0; it must return a runtime\.Tensor"):
        z.sum().backward()


def test_without_hooks_saved_tensors_are_version_checked(bridge_ops):
    x = rt.Tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = rt.Tensor(np.array([3.0, 4.0]))
    z = bridge_ops.mul_saved(x, y)
    bridge_ops.scale_(y, 10.0)  # an in-place write the runtime sees (MarkDirty bumps y's version)
    with pytest.raises(RuntimeError, match=r"saved for backward by MulSaved \(saved slot 1\) has been modified"):
        z.sum().backward()


class MulPy(rt.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y, g * x


def test_a_python_function_saves_through_the_runtime_hooks(bridge_ops):
    x = rt.Tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = rt.Tensor(np.array([3.0, 4.0]))
    packed = []
    with _copying_hooks(packed):
        z = MulPy.apply(x, y)
    assert packed == [[1.0, 2.0], [3.0, 4.0]]
    bridge_ops.scale_(y, 10.0)
    z.sum().backward()
    assert x.grad.numpy().tolist() == [3.0, 4.0]


def test_hooks_end_with_their_block(bridge_ops):
    hooks = rt.autograd.saved_tensors_hooks(lambda t: pytest.fail("packed outside the block"), lambda p: p)
    with hooks:
        pass
    x = rt.Tensor(np.array([1.0]), requires_grad=True)
    bridge_ops.mul_saved(x, x).sum().backward()
    assert x.grad.numpy().tolist() == [2.0]
    with pytest.raises(TypeError, match="saved_tensors_hooks takes two callables"):
        rt.autograd.saved_tensors_hooks(1, lambda p: p)


def test_hooks_are_per_thread_while_another_thread_has_some_open(bridge_ops):
    """Hooks open in one thread (the record paths then read the per-thread pair) pack nothing of another
    thread's ops, and that thread's own hooks still pack: a C++ Function, a Python Function, a built-in."""
    import threading
    from runtime.autograd import grad_mode
    opened, release = threading.Event(), threading.Event()

    def other():
        with rt.autograd.saved_tensors_hooks(lambda t: pytest.fail("packed another thread's op"), lambda p: p):
            opened.set()
            release.wait(30)
    worker = threading.Thread(target=other)
    worker.start()
    try:
        assert opened.wait(30)
        assert grad_mode.hooks_open[0] == 1 and grad_mode.hooks_flag.value == 1
        x = rt.Tensor(np.array([1.0, 2.0]), requires_grad=True)
        y = rt.Tensor(np.array([3.0, 4.0]))
        # the two Functions save both; the built-in mul saves only y, all x's gradient reads (as torch's)
        for f, saved in ((bridge_ops.mul_saved, [[1.0, 2.0], [3.0, 4.0]]), (MulPy.apply, [[1.0, 2.0], [3.0, 4.0]]),
                         (lambda a, b: a * b, [[3.0, 4.0]])):
            f(x, y).sum().backward()  # no pack: this thread has no hooks
            packed = []
            with _copying_hooks(packed):
                z = f(x, y)
            assert packed == saved
            z.sum().backward()
        assert x.grad.numpy().tolist() == [18.0, 24.0]  # 3 functions, 2 backward each: 6 * y
    finally:
        release.set()
        worker.join()
    assert grad_mode.hooks_open[0] == 0 and grad_mode.hooks_flag.value == 0


def test_the_open_count_falls_back_when_a_block_raises():
    from runtime.autograd import grad_mode
    with pytest.raises(KeyError):
        with rt.autograd.saved_tensors_hooks(lambda t: t, lambda p: p):
            with rt.autograd.saved_tensors_hooks(lambda t: t, lambda p: p):
                assert grad_mode.hooks_open[0] == 2
                raise KeyError("inside")
    assert grad_mode.hooks_open[0] == 0 and grad_mode.hooks_flag.value == 0
    from runtime.autograd.saved_hooks import current_saved_hooks
    assert current_saved_hooks() is None


@pytest.mark.parametrize("calls", [1, 2], ids=["first call", "later call"])
def test_to_torch_python_path_honours_torch_hooks(bridge_ops, monkeypatch, calls):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")
    import opbuilder
    monkeypatch.setenv("OPBUILDER_TORCH_BRIDGE", "0")  # every call on the Python path
    t = opbuilder.to_torch(bridge_ops)
    x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([3.0, 4.0], dtype=torch.float64)
    for _ in range(calls - 1):
        t.mul_saved(x.detach(), y)
    with torch.autograd.graph.saved_tensors_hooks(lambda v: v.clone(), lambda v: v):
        z = t.mul_saved(x, y)
    y.mul_(10)  # torch: no version error, the copy is read ([3, 4], not [30, 40])
    z.sum().backward()
    assert x.grad.tolist() == [3.0, 4.0]
    x.grad = None
    with torch.autograd.graph.saved_tensors_hooks(lambda v: v, lambda v: torch.full_like(v, 5.0)):
        z = t.exp_saves_output(x)
    z.sum().backward()
    assert x.grad.tolist() == [5.0, 5.0]


@pytest.mark.parametrize("where", ["around the call", "inside the function"])
@pytest.mark.parametrize("with_cpp_op", [False, True])
def test_runtime_jit_under_hooks_runs_eagerly(bridge_ops, with_cpp_op, where):
    """runtime.jit under saved_tensors_hooks: every call (its trace, its replays) gives eager's gradient,
    its saves through the hooks. A graph of built-in ops ran on the backend even on the call that traced,
    and a replay saved only C++ Functions' tensors through the hooks: an unpack hook that changes values
    was ignored, silently (an attack). jit runs such a call op by op, and traces it only without hooks;
    hooks opened inside the traced function stop its trace (the signature runs eagerly)."""
    inside = where == "inside the function"

    def hooks():
        return rt.autograd.saved_tensors_hooks(lambda t: t, lambda t: t * 2.0)

    def f(x):
        with hooks() if inside else contextlib.nullcontext():
            y = rt.mint.sin(x) * x
            return rt.mint.sum(bridge_ops.mul_saved(y, x) if with_cpp_op else y)
    jitted = rt.jit(f)
    a = np.array([0.5, -1.0, 2.0])

    def grad(fn):
        x = rt.Tensor(a.copy(), requires_grad=True)
        with contextlib.nullcontext() if inside else hooks():
            out = fn(x)
        out.backward()
        return x.grad.numpy()
    want = grad(f)
    for _ in range(3):
        np.testing.assert_allclose(grad(jitted), want, rtol=1e-12)
    if inside:
        return
    x = rt.Tensor(a.copy(), requires_grad=True)  # without hooks, the same function's own gradient
    jitted(x).backward()
    x2 = rt.Tensor(a.copy(), requires_grad=True)
    f(x2).backward()
    np.testing.assert_allclose(x.grad.numpy(), x2.grad.numpy(), rtol=1e-12)

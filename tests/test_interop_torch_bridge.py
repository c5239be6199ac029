"""to_torch's C++ bridge (src/torch_bridge.cpp): eager calls on plain CPU torch tensors
reach the operator without Python in between, and a C++ Function's node is a torch autograd node.

test_interop_torch.py runs its tests through both paths; these are what only the bridge does.
"""
from __future__ import annotations

import threading
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

import opbuilder  # noqa: E402

pytestmark = pytest.mark.build


@pytest.fixture(autouse=True)
def bridge_on(torch_bridge, monkeypatch):
    monkeypatch.setenv("OPBUILDER_TORCH_BRIDGE", "1")


def _fast(fn) -> int:
    """How many calls of a to_torch function the bridge's fast path took."""
    op = fn.bridged[0]
    return 0 if op is None else op.fast_calls


def _warm(fn, *args):
    """The first call of a signature defines its operator on the Python path; later ones are fast."""
    fn(*(a.detach() if isinstance(a, torch.Tensor) else a for a in args))


def numeric_grad(f, xs, eps=1e-6):
    """Central differences in float64 of sum(f(*xs) * w) for a fixed random w."""
    w = torch.from_numpy(np.random.default_rng(0).standard_normal(f(*xs).shape))
    grads = []
    for x in xs:
        g = torch.zeros_like(x)
        flat, gflat = x.view(-1), g.view(-1)
        for i in range(flat.numel()):
            old = flat[i].item()
            flat[i] = old + eps
            hi = (f(*xs) * w).sum().item()
            flat[i] = old - eps
            lo = (f(*xs) * w).sum().item()
            flat[i] = old
            gflat[i] = (hi - lo) / (2 * eps)
        grads.append(g)
    return w, grads


def test_eager_calls_take_the_fast_path_and_share_memory(my_ops):
    t = opbuilder.to_torch(my_ops)
    x, y = torch.randn(3, 4), torch.randn(4)
    _warm(t.mul, x, y)
    before = _fast(t.mul)
    z = t.mul(x, y)
    assert _fast(t.mul) == before + 1
    assert type(z) is torch.Tensor and z.dtype == torch.float32 and not z.requires_grad
    torch.testing.assert_close(z, x * y)
    import runtime as rt
    back = rt.from_dlpack(z)  # the memory the kernel wrote, seen from the runtime
    assert back.asnumpy().__array_interface__["data"][0] == z.data_ptr()


def test_inputs_reach_the_kernel_without_a_copy(autograd_ops):
    t = opbuilder.to_torch(autograd_ops)
    x, y = torch.ones(4, dtype=torch.float64), torch.full((4,), 2.0, dtype=torch.float64)
    _warm(t.add_, x.clone(), y)
    before = _fast(t.add_)
    out = t.add_(x, y)  # MarkDirty: the kernel writes x's own memory, and x is what comes back
    assert _fast(t.add_) == before + 1
    assert out is x and x.tolist() == [3.0] * 4 and x._version == 1


def test_gradients_match_central_differences_and_forward_runs_once(autograd_ops):
    t = opbuilder.to_torch(autograd_ops)
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    y = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    _warm(t.mul_saved, x, y)
    before = _fast(t.mul_saved)
    z = t.mul_saved(x, y)
    assert _fast(t.mul_saved) == before + 1
    assert z.grad_fn.name() == "MulSavedBackward"
    w, (nx, ny) = numeric_grad(lambda a, b: t.mul_saved(a, b).detach(), [x.detach().clone(), y.detach().clone()])
    gx, gy = torch.autograd.grad((z * w).sum(), (x, y))
    torch.testing.assert_close(gx, nx, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gy, ny, rtol=1e-6, atol=1e-6)
    assert torch.autograd.gradcheck(t.mul_saved, (x, y))
    assert _fast(t.mul_saved) > before + 1  # gradcheck's calls were fast ones too


def test_a_gradient_of_a_view_arrives_as_the_view(autograd_ops):
    t = opbuilder.to_torch(autograd_ops)
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    y = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    _warm(t.mul_saved, x, y)
    z = t.mul_saved(x.t(), y.t())  # strided inputs: Forward gets private contiguous copies
    g = torch.randn(4, 3, dtype=torch.float64)
    gx, gy = torch.autograd.grad(z, (x, y), g.t().contiguous().t())  # a strided incoming gradient
    torch.testing.assert_close(gx, (g * y.t()).t().detach())
    torch.testing.assert_close(gy, (g * x.t()).t().detach())


@pytest.mark.parametrize("op, slot, change", [
    ("mul_saved", 1, lambda x, y, out: y.add_(1)),  # a saved input
    ("exp_saves_output", 0, lambda x, y, out: out.mul_(2)),  # a saved output
])
def test_a_saved_tensor_changed_in_place_is_an_error(autograd_ops, op, slot, change):
    t = opbuilder.to_torch(autograd_ops)
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = torch.randn(3, dtype=torch.float64)
    args = (x, y) if op == "mul_saved" else (x,)
    fn = getattr(t, op)
    _warm(fn, *args)
    out = fn(*args)
    change(x, y, out)
    name = {"mul_saved": "MulSaved", "exp_saves_output": "ExpSavesOutput"}[op]
    with pytest.raises(RuntimeError, match=rf"^one of the tensors saved for backward by {name} \(saved slot {slot}\) "
                                           r"has been modified by an in-place operation: it is at version 1, but was "
                                           r"saved at version 0$"):
        out.sum().backward()


def test_a_second_backward_without_retain_graph_is_an_error(autograd_ops):
    t = opbuilder.to_torch(autograd_ops)
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    _warm(t.mul_saved, x, x)
    z = t.mul_saved(x, x).sum()
    z.backward(retain_graph=True)
    z.backward()  # retained once: a second backward is fine
    torch.testing.assert_close(x.grad, 4 * x.detach())
    with pytest.raises(RuntimeError, match=r"^Trying to backward through the graph a second time \(or directly access "
                                           r"saved tensors after they have already been freed\)\. "):  # torch's words
        z.backward()


def test_in_place_on_a_leaf_that_requires_grad_is_refused(autograd_ops):
    t = opbuilder.to_torch(autograd_ops)
    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    y = torch.ones(3, dtype=torch.float64)
    _warm(t.add_, x.detach().clone(), y)
    with pytest.raises(RuntimeError, match=r"^AddInplace: a leaf Variable that requires grad is being used in an "
                                           r"in-place operation\.$"):  # torch's rule and words
        t.add_(x, y)
    with pytest.raises(RuntimeError, match=r"^AddInplace: a view of a leaf Variable that requires grad is being "
                                           r"used in an in-place operation\.$"):
        t.add_(x[:2], y[:2])
    assert x.is_leaf and x.grad_fn is None
    a = x * 1  # not a leaf: the in-place op takes over its history
    out = t.add_(a, y)
    assert out is a and a.grad_fn.name() == "AddInplaceBackward"
    a.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(3, dtype=torch.float64))


def test_non_differentiable_outputs_need_no_grad(autograd_ops):
    t = opbuilder.to_torch(autograd_ops)
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    _warm(t.square_and_sign, x)
    sq, sign = t.square_and_sign(x)
    assert sq.requires_grad and not sign.requires_grad
    sq.sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach())


@pytest.mark.parametrize("mode, error, message", [
    ("bad_dtype", TypeError, r"^backward of Misbehave returned a gradient of dtype float32 for argument 0, whose "
                             r"dtype is float64$"),
    ("too_few", RuntimeError, r"^backward of Misbehave returned 1 gradients, but its forward took 3 arguments and "
                              r"argument 1 needs a gradient \(return one gradient, or None, per argument\)$"),
    ("too_many", RuntimeError, r"^backward of Misbehave returned 4 gradients, but its forward took 3 arguments "
                               r"\(expected one gradient, or None, per argument\)$"),
    ("non_tensor", RuntimeError, r"^backward of Misbehave returned a gradient for argument 2, which is not a "
                                 r"tensor$"),
    ("invalid_argument", ValueError, r"^Misbehave: bad value in Backward$"),
    ("out_of_range", IndexError, r"^Misbehave: index out of range in Backward$"),
])
def test_backward_errors_reach_the_caller_with_their_type(autograd_ops, mode, error, message):
    t = opbuilder.to_torch(autograd_ops)
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = torch.randn(3, dtype=torch.float64, requires_grad=True)
    _warm(t.misbehave, x, y, mode)
    z = t.misbehave(x, y, mode)
    with pytest.raises(error, match=message):
        z.sum().backward()


def test_backward_that_leaves_trailing_nulls_off_is_fine(autograd_ops):
    t = opbuilder.to_torch(autograd_ops)
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = torch.randn(3, dtype=torch.float64, requires_grad=True)
    for mode in ("omit_trailing", "extra_nulls"):
        _warm(t.misbehave, x, y, mode)
        gx, gy = torch.autograd.grad(t.misbehave(x, y, mode).sum(), (x, y))
        torch.testing.assert_close(gx, y.detach())
        torch.testing.assert_close(gy, x.detach())


def test_calls_the_fast_path_leaves_to_python(my_ops, autograd_ops):
    t = opbuilder.to_torch(my_ops)
    x = torch.randn(3)
    _warm(t.mul, x, x)
    before = _fast(t.mul)
    p = torch.nn.Parameter(torch.randn(3))  # a Parameter is a plain tensor to C++: fast
    torch.testing.assert_close(t.mul(p, x), (p * x).detach())
    xd = x.double()  # another dtype, the same signature ("tt"): fast too
    torch.testing.assert_close(t.mul(xd, xd), xd * xd)
    assert _fast(t.mul) == before + 2

    class Sub(torch.Tensor):
        pass
    torch.testing.assert_close(t.mul(x.as_subclass(Sub), x).as_subclass(torch.Tensor), x * x)  # a subclass
    neg = torch.randn(3)._neg_view()  # a lazy negation: torch resolves it on the Python path
    torch.testing.assert_close(t.mul(neg, x), neg.resolve_neg() * x)
    assert _fast(t.mul) == before + 2
    ta = opbuilder.to_torch(autograd_ops)
    for _ in range(2):  # a list argument: always the Python path
        torch.testing.assert_close(ta.sum_list(xd, [xd, xd]), 3 * xd)
    assert _fast(ta.sum_list) == 0


def test_threads_call_through_the_bridge_at_once(autograd_ops):
    t = opbuilder.to_torch(autograd_ops)
    x = torch.randn(64, dtype=torch.float64, requires_grad=True)
    _warm(t.mul_saved, x, x)
    errors, results = [], []

    def work():
        try:
            for _ in range(200):
                a = x.detach().clone().requires_grad_()
                (g,) = torch.autograd.grad(t.mul_saved(a, a).sum(), (a,))
                results.append(torch.equal(g, 2 * a.detach()))
        except Exception as e:  # reported below
            errors.append(e)
    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors and len(results) == 800 and all(results)


def test_empty_and_zero_dim_tensors(my_ops):
    t = opbuilder.to_torch(my_ops)
    for shape in ((0,), (), (2, 0, 3)):
        x = torch.randn(shape)
        _warm(t.mul, x, x)
        z = t.mul(x, x)
        assert z.shape == x.shape
        torch.testing.assert_close(z, x * x)


def test_bfloat16_and_complex_cross_as_they_are(dtype_ops):
    t = opbuilder.to_torch(dtype_ops)
    for dtype in (torch.bfloat16, torch.complex128):
        x = torch.tensor([1.5, -2.0, 3.25], dtype=dtype, requires_grad=True)
        y = torch.tensor([0.5, 4.0, -1.0], dtype=dtype, requires_grad=True)
        _warm(t.mul, x, y)
        before = _fast(t.mul)
        z = t.mul(x, y)
        assert _fast(t.mul) == before + 1 and z.dtype == dtype
        torch.testing.assert_close(z, (x * y).detach())
        gx, gy = torch.autograd.grad(z, (x, y), torch.ones_like(z))
        assert gx.dtype == dtype
        torch.testing.assert_close(gx, y.detach().conj())
        torch.testing.assert_close(gy, x.detach().conj())


def test_python_functions_stay_on_the_python_path(my_ops):
    # a Python function calls the operator from its own frame: it must get runtime tensors back, and
    # its caller torch tensors, as on the Python path
    ns = opbuilder.to_torch(types.SimpleNamespace(mul=lambda x, y: my_ops.mul(x, y)))
    x = torch.randn(3)
    for _ in range(3):
        z = ns.mul(x, x)
        assert type(z) is torch.Tensor
        torch.testing.assert_close(z, x * x)
    assert not hasattr(ns.mul, "bridged")


def test_an_incoming_gradient_handed_back_twice_is_not_shared_with_grads(autograd_ops):
    # AddInplace's Backward returns its incoming gradient for both arguments: torch must see that the
    # tensor is shared (AccumulateGrad copies it) instead of taking one memory as y.grad and as g
    t = opbuilder.to_torch(autograd_ops)
    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    y = torch.ones(3, dtype=torch.float64, requires_grad=True)
    _warm(t.add_, x.detach().clone(), y)
    g = torch.ones(3, dtype=torch.float64)
    for _ in range(2):
        t.add_(x * 1, y).backward(g)
    assert x.grad.tolist() == [2.0] * 3 and y.grad.tolist() == [2.0] * 3 and g.tolist() == [1.0] * 3
    assert len({x.grad.data_ptr(), y.grad.data_ptr(), g.data_ptr()}) == 3


def test_zero_tensors_take_the_python_path_or_become_zeros(autograd_ops):
    t = opbuilder.to_torch(autograd_ops)
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    _warm(t.mul_saved, x, x)
    zero = torch._efficientzerotensor(3, dtype=torch.float64)  # no memory: data_ptr() is 0
    with pytest.raises(RuntimeError, match="ZeroTensor"):
        t.mul_saved(zero, x)  # torch's own refusal, on the Python path
    t.mul_saved(x, x).backward(zero)  # a ZeroTensor gradient arrives as zeros
    assert x.grad.tolist() == [0.0] * 3


def test_a_runtime_tensor_the_op_kept_comes_back_as_a_torch_tensor(autograd_ops):
    import runtime as rt
    t = opbuilder.to_torch(autograd_ops)
    kept = rt.Tensor(np.arange(3.0))
    autograd_ops.hold([kept])  # the op keeps a tensor bound to a runtime.Tensor and hands it back later
    assert autograd_ops.last_held(kept) is kept
    x = torch.zeros(1)
    for _ in range(2):  # the first call of the signature, then the bridge
        z = t.last_held(x)
        assert type(z) is torch.Tensor and z.tolist() == [0.0, 1.0, 2.0]
    assert _fast(t.last_held) == 1


def test_saved_tensor_hooks_see_what_the_op_saves(autograd_ops):
    t = opbuilder.to_torch(autograd_ops)
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    _warm(t.mul_saved, x, x)
    before = _fast(t.mul_saved)
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda v: packed.append(v) or v, lambda v: v):
        z = t.mul_saved(x, x)  # what the op saves goes through the hooks, on the bridge too
    assert _fast(t.mul_saved) == before + 1
    z.sum().backward()
    assert len(packed) == 2 and torch.equal(x.grad, 2 * x.detach())

"""opbuilder.to_torch: operator modules as PyTorch operators (zero-copy, autograd, torch.library)."""
from __future__ import annotations

import gc
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

import opbuilder  # noqa: E402
from opbuilder import Spec  # noqa: E402

pytestmark = pytest.mark.build


def _broadcast(x, y):
    return Spec(np.broadcast_shapes(x.shape, y.shape), x.dtype)


@pytest.fixture(scope="module", params=["python", "bridge"], autouse=True)
def torch_path(request):
    """Every test twice: eager calls through the Python path, then through the C++ bridge."""
    if request.param == "bridge":
        request.getfixturevalue("torch_bridge")
    mp = pytest.MonkeyPatch()
    mp.setenv("OPBUILDER_TORCH_BRIDGE", "1" if request.param == "bridge" else "0")
    yield request.param
    mp.undo()


@pytest.fixture(scope="module")
def tmul(my_ops, torch_path):
    return opbuilder.to_torch(my_ops)


def _counting(fn):
    calls = []

    def f(*a):
        calls.append(a)
        return fn(*a)
    return types.SimpleNamespace(mul=f), calls


def test_forward_shares_memory_both_ways(tmul):
    x, y = torch.randn(3, 4), torch.randn(4)
    z = tmul.mul(x, y)
    assert isinstance(z, torch.Tensor) and z.dtype == torch.float32
    torch.testing.assert_close(z, x * y)
    # the output is the buffer the kernel wrote: writing through the runtime's view shows in torch
    import runtime as rt
    back = rt.from_dlpack(z)
    back.asnumpy()[0, 0] = 42.0
    assert z[0, 0].item() == 42.0
    assert back.asnumpy().__array_interface__["data"][0] == z.data_ptr()


def test_inputs_are_not_copied(my_ops):
    seen = []

    def spy(x, y):
        seen.append((x.asnumpy().__array_interface__["data"][0], y.asnumpy().__array_interface__["data"][0]))
        return my_ops.mul(x, y)
    ns = opbuilder.to_torch(types.SimpleNamespace(mul=spy))
    x, y = torch.randn(5), torch.randn(5)
    ns.mul(x, y)
    assert seen == [(x.data_ptr(), y.data_ptr())]


def test_views_pass_through(tmul):
    x = torch.randn(4, 3)
    torch.testing.assert_close(tmul.mul(x.t(), x.t()), x.t() * x.t())


def test_backward_matches_and_forward_runs_once(my_ops):
    ns, calls = _counting(my_ops.mul)
    t = opbuilder.to_torch(ns)
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    y = torch.randn(4, dtype=torch.float64, requires_grad=True)
    z = t.mul(x, y)
    (z * torch.arange(12.0, dtype=torch.float64).reshape(3, 4)).sum().backward()
    assert len(calls) == 1  # the backward used the kept runtime graph, no second forward
    w = torch.arange(12.0, dtype=torch.float64).reshape(3, 4)
    torch.testing.assert_close(x.grad, (w * y).detach())
    torch.testing.assert_close(y.grad, (w * x).sum(0).detach())


def test_gradcheck_float64(tmul):
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    y = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(tmul.mul, (x, y))  # eager calls: the direct autograd.Function
    op = getattr(torch.ops, tmul._namespace).mul_tt.default  # the registered operator's own autograd
    assert torch.autograd.gradcheck(lambda a, b: tuple(op(a, b)), (x, y))


def test_registered_autograd_runs_forward_once(my_ops):
    ns, calls = _counting(my_ops.mul)
    t = opbuilder.to_torch(ns)
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    y = torch.randn(4, dtype=torch.float64)
    t.mul(x.detach(), y)  # defines the operator
    calls.clear()
    (z,) = getattr(torch.ops, t._namespace).mul_tt.default(x, y)
    z.sum().backward()
    assert len(calls) == 1
    torch.testing.assert_close(x.grad, y)


def test_kept_graph_lives_with_the_output(tmul, torch_path):
    import weakref

    x = torch.randn(6, dtype=torch.float64, requires_grad=True)
    tmul.mul(x.detach(), x.detach())  # the signature's first call defines its operator
    z = tmul.mul(x, x)
    if torch_path == "python":  # an eager call: the runtime graph hangs off torch's node for it
        assert z.grad_fn.call.outputs
        kept = weakref.ref(z.grad_fn.call)
    else:  # the bridge: the C++ Function's node is torch's, and holds what Forward saved
        assert z.grad_fn.name() == "CustomMulBackward"
        a = x * 1
        z = tmul.mul(a, a)
        kept = weakref.ref(a)
        del a
        gc.collect()
        assert kept() is not None
    del z
    gc.collect()
    assert kept() is None
    op = getattr(torch.ops, tmul._namespace).mul_tt.default  # the registered operator: kept by torch's node
    z = op(x, x)[0]
    assert z.grad_fn.call.outputs
    kept = weakref.ref(z.grad_fn.call)
    del z
    gc.collect()
    assert kept() is None
    with torch.no_grad():  # nothing needs grad: nothing is kept
        z = tmul.mul(x, x)
    assert z.grad_fn is None


def test_non_tensor_args_and_multiple_outputs(autograd_ops):
    t = opbuilder.to_torch(autograd_ops)
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = torch.randn(3, dtype=torch.float64, requires_grad=True)
    out = t.mixed_args(0.5, x, [4, 3], y)  # float, tensor, list of ints, tensor
    torch.testing.assert_close(out, (2.0 * x + 3 * y).detach())
    assert torch.autograd.gradcheck(lambda a, b: t.mixed_args(0.5, a, [4, 3], b), (x, y))
    out = t.square_and_sign(x)  # several outputs come back as a tuple (torch's convention)
    assert type(out) is tuple
    sq, sign = out
    torch.testing.assert_close(sq, (x * x).detach())
    torch.testing.assert_close(sign, torch.sign(x).detach())
    sq.sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach())
    c = y.detach()
    s = t.sum_list(x, [c, c])  # a list of tensors
    torch.testing.assert_close(s, (x + 2 * c).detach())
    assert torch.autograd.gradcheck(lambda a: t.sum_list(a, [c, c]), (x,))
    with pytest.raises(RuntimeError, match=r"^SumList: argument 1 is a list of tensors and its element 0 requires "
                                           r"grad, but Function<T> gives gradients to TensorPtr arguments only"):
        t.sum_list(x, [y, y])


def test_a_failed_first_call_leaves_later_calls_single(my_ops):
    t = opbuilder.to_torch(my_ops)  # fresh: this signature's first calls are the failing ones
    for _ in range(2):  # the first defines the operator, the second takes the eager path
        with pytest.raises(ValueError, match="^mul: shapes cannot be broadcast together"):
            t.mul(torch.ones(3), torch.ones(4))
    for _ in range(3):  # the general path, then the direct one
        z = t.mul(torch.ones(3), torch.full((3,), 2.0))
        assert isinstance(z, torch.Tensor) and z.tolist() == [2.0, 2.0, 2.0]


def test_unsupported_dtype(tmul):
    x = torch.ones(2, dtype=torch.float8_e5m2)  # bfloat16 is taken now (test_interop_dtypes.py)
    with pytest.raises(TypeError, match=r"^mul: argument 0 has dtype torch\.float8_e5m2, which opbuilder's runtime "
                                        r"does not support \("):
        tmul.mul(x, x)


def test_non_cpu_tensor(tmul):
    x = torch.ones(2, device="meta")
    with pytest.raises(ValueError, match=r"^mul: argument 0 is a meta tensor; this operator runs on cpu tensors "
                                         r"\(move it with \.to\('cpu'\)\)$"):
        tmul.mul(x, x)


def test_unsupported_argument(tmul):
    with pytest.raises(TypeError, match=r"^mul: argument 1 is a dict; a torch operator takes tensors, None, ints, "
                                        r"floats, bools, strings and lists of tensors, ints or floats$"):
        tmul.mul(torch.ones(2), {})


def test_none_for_an_optional_tensor_and_an_empty_list(autograd_ops):
    """None for a std::optional<TensorPtr> argument (schema Tensor?) and an empty list (the function gets [])
    work on every call, as on the runtime, with torch's values and gradients; on 991a33e both were a
    TypeError on every call."""
    t = opbuilder.to_torch(autograd_ops)
    xa, ya, ba = np.random.default_rng(3).standard_normal((3, 4))
    for _ in range(3):
        x, y, b = (torch.tensor(a, requires_grad=True) for a in (xa, ya, ba))
        for got, want in ((t.mul_opt_bias(x, y, None), x * y), (t.mul_opt_bias(x, y, b), x * y + b),
                          (t.sum_list(x, []), x * 1)):
            np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12)
            w = torch.tensor(np.arange(4.0))
            for g, h in zip(torch.autograd.grad((got * w).sum(), [x, y, b], allow_unused=True),
                            torch.autograd.grad((want * w).sum(), [x, y, b], allow_unused=True)):
                assert (g is None) == (h is None)
                if g is not None:
                    np.testing.assert_allclose(g.numpy(), h.numpy(), rtol=1e-12)


def test_op_errors_reach_the_caller(tmul):
    x = torch.ones(2, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"mul: expected two float32 or two float64 tensors, got int32 and int32"):
        tmul.mul(x, x)


def test_bad_arguments_to_to_torch(my_ops):
    with pytest.raises(ValueError, match=r"^to_torch: shape_fn names 'nope', which the module does not define "
                                         r"\(it has mul\)$"):
        opbuilder.to_torch(my_ops, shape_fn={"nope": _broadcast})
    with pytest.raises(TypeError, match=r"^to_torch: shape_fn\['mul'\] is a int, not a callable$"):
        opbuilder.to_torch(my_ops, shape_fn={"mul": 3})
    with pytest.raises(ValueError, match=r"^to_torch: backend must be 'CPU' or 'GPU', got 'TPU'$"):
        opbuilder.to_torch(my_ops, backend="TPU")


def test_dispatch_modes_see_the_operator(tmul):
    # eager calls with nothing to record skip torch's dispatcher; a dispatch mode must still see the op
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    x, y = torch.randn(3), torch.randn(3)
    tmul.mul(x, y)  # the signature is known: the direct path is in use
    with Log() as log:
        out = tmul.mul(x, y)
    assert f"{tmul._namespace}.mul_tt.default" in log.ops
    torch.testing.assert_close(out, x * y)
    with torch.no_grad():
        z = tmul.mul(x.requires_grad_(), y)
    assert z.grad_fn is None and not z.requires_grad


def test_bad_shape_rule_then_a_good_call(my_ops):
    calls = []

    def rule(x, y):
        calls.append(1)
        if len(calls) == 1:
            return "nonsense"
        return _broadcast(x, y)
    t = opbuilder.to_torch(my_ops, shape_fn={"mul": rule})
    x = torch.randn(3)
    with pytest.raises(TypeError, match=r"^mul: the shape rule must return Spec\(shape, dtype\) or a list of them, "
                                        r"got 'nonsense'$"):
        t.mul(x, x)
    torch.testing.assert_close(t.mul(x, x), x * x)  # nothing was left half-defined


def test_a_dual_tensor_is_refused_not_dropped(tmul):
    import torch.autograd.forward_ad as fwad
    x = torch.randn(3)
    tmul.mul(x, x)  # the signature is known: the fast paths are in use
    with fwad.dual_level():
        d = fwad.make_dual(x, torch.ones(3))
        with pytest.raises(NotImplementedError, match=r"^mul: argument 1 is a dual tensor \(torch\.autograd\."
                                                      r"forward_ad\), but opbuilder operators have no forward-mode "
                                                      r"derivative; use reverse mode \(backward or torch\.autograd"
                                                      r"\.grad\)$"):
            tmul.mul(x, d)
        torch.testing.assert_close(tmul.mul(x, x), x * x)  # plain tensors inside the level are fine


def test_an_output_with_negative_strides_comes_back_as_its_values(autograd_ops):
    t = opbuilder.to_torch(autograd_ops)
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    for _ in range(2):  # the first call of the signature, then the eager path (the bridge, if it is on)
        assert t.reversed(x).tolist() == [4.0, 3.0, 2.0, 1.0]


def test_outputs_without_a_gradient_do_not_require_grad(autograd_ops):
    t = opbuilder.to_torch(autograd_ops)
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    for _ in range(2):  # the first call of the signature, then the eager path
        sq, sign = t.square_and_sign(x)  # MarkNonDifferentiable({sign})
        assert sq.requires_grad and not sign.requires_grad
        r = t.reversed(x)  # a plain C++ function records no gradient: torch must not invent a zero one
        assert not r.requires_grad
        with pytest.raises(RuntimeError, match="does not require grad"):
            torch.autograd.grad(r.sum(), x)

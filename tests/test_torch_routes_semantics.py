"""Every torch route of an op call decides a write as torch does (issue 33): to_torch's registered
(torch.library) path, its C++ bridge, torch.compile, and a runtime op called straight on torch tensors
(the DLPack route, no to_torch). Each case is compared with torch's own in-place op on the same inputs:
the same values and gradients, or a named refusal that leaves the data untouched.
Operators: tests/cpp/parity_ops.cpp (mul saves its inputs, scale_ is MarkDirty x *= 3, ident).
"""
from __future__ import annotations

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

import opbuilder  # noqa: E402
from op_util import CPP, load_op  # noqa: E402

pytestmark = pytest.mark.build


@pytest.fixture(scope="session")
def parity_ops(cache_dir):
    return load_op("parity_ops", [CPP / "parity_ops.cpp"])


def _f64(*a, **kw) -> torch.Tensor:
    return torch.tensor(a, dtype=torch.float64, **kw)


# ---- MarkDirty on a view of a non-leaf: torch's CopySlices, 0-d views included --------------------
VIEWS = {
    "select (0-d)": lambda b: b[2],
    "view to 0-d": lambda b: b[1:2].view(()),
    "select a row": lambda b: b.view(2, 2)[1],
    "as_strided": lambda b: b.as_strided((2,), (2,), 1),
    "unsqueeze": lambda b: b.unsqueeze(0),
    "squeeze": lambda b: b.view(1, 4).squeeze(0),
    "diagonal": lambda b: b.view(2, 2).diagonal(),
}


def _write_view_then_backward(view, write):
    a = _f64(1.0, 2.0, 3.0, 4.0, requires_grad=True)
    b = a * 1.0
    write(view(b))
    (b * b).sum().backward()
    return a.grad, b.detach()


@pytest.mark.parametrize("view", list(VIEWS))
def test_markdirty_on_a_view_of_a_non_leaf_gives_torchs_gradient(parity_ops, torch_route, view):
    """scale_ (MarkDirty) on a view of a non-leaf, then backward through the base: torch's v.mul_(3) gives
    a.grad = 2 * b * (3 where written). The registered path failed for a 0-d view (b[2]) at backward:
    "output with shape [] doesn't match the broadcast shape [1]" (its gradient came back 1-d)."""
    ops = opbuilder.to_torch(parity_ops)
    want = _write_view_then_backward(VIEWS[view], lambda v: v.mul_(3))
    for _ in range(2):  # a signature's first call, then the route's later calls
        got = _write_view_then_backward(VIEWS[view], ops.scale_)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("view", ["select (0-d)", "view to 0-d", "unsqueeze"])
def test_markdirty_on_a_view_under_compile_gives_torchs_gradient(parity_ops, monkeypatch, view):
    """The same under torch.compile (the op runs eagerly: it writes its argument)."""
    monkeypatch.setenv("OPBUILDER_TORCH_BRIDGE", "0")
    ops = opbuilder.to_torch(parity_ops)

    def run(write):
        def body(b):
            write(VIEWS[view](b))
            return (b * b).sum()
        a = _f64(1.0, 2.0, 3.0, 4.0, requires_grad=True)
        torch.compile(body, backend="eager")(a * 1.0).backward()
        return a.grad

    want = run(lambda v: v.mul_(3))
    ops.scale_(_f64(1.0))  # seen writing before it is compiled (else a named refusal: test_interop_torch)
    torch.testing.assert_close(run(ops.scale_), want, rtol=0, atol=0)


def test_markdirty_on_an_expanded_view_is_refused_as_torch_refuses(parity_ops, torch_route):
    """An expanded (stride-0) view is never written: torch's words, after the op's name; nothing changes."""
    ops = opbuilder.to_torch(parity_ops)
    b = _f64(1.0, 2.0, 3.0, 4.0, requires_grad=True) * 1.0
    with pytest.raises(RuntimeError, match=re.escape("unsupported operation: more than one element")):
        b[0:1].expand(3).mul_(3)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="^" + re.escape(
                "ParityScale modifies argument 0 in place (MarkDirty): unsupported operation: more than one "
                "element of the written-to tensor refers to a single memory location. Please clone() the tensor "
                "before performing the operation.") + "$"):
            ops.scale_(b[0:1].expand(3))
        assert b.tolist() == [1.0, 2.0, 3.0, 4.0]


# ---- a runtime op called straight on torch tensors (the DLPack route): torch's rules, before Forward --
def _grad_refusal(what: str) -> str:
    return "^" + re.escape(
        f"ParityScale modifies argument 0 in place (MarkDirty), but it is a torch tensor that {what}, and an "
        f"operator called on torch tensors directly records nothing in torch's autograd graph, so torch's "
        f"gradient would miss the write. Call it through opbuilder.to_torch(module), or under torch.no_grad(); "
        f"the argument is unchanged") + "$"


DIRECT_REFUSED = {  # name -> (what is written, the tensor that must not change, the refusal's "what")
    "a leaf that requires grad": lambda: (lambda x: (x, x))(_f64(1.0, 2.0, requires_grad=True)),
    "a non-leaf": lambda: (lambda b: (b, b))(_f64(1.0, 2.0, requires_grad=True) * 1.0),
    "a view of a non-leaf": lambda: (lambda b: (b[1:], b))(_f64(1.0, 2.0, requires_grad=True) * 1.0),
    "a parameter": lambda: (lambda p: (p, p))(torch.nn.Parameter(_f64(1.0, 2.0))),
}


@pytest.mark.parametrize("case", list(DIRECT_REFUSED))
def test_a_direct_write_into_a_torch_tensor_that_requires_grad_is_refused_before_it_writes(parity_ops, case):
    """torch refuses x.mul_(3) on a leaf that requires grad and records it for a non-leaf; a runtime op called
    straight on torch tensors records nothing in torch's graph, so it wrote the leaf and left a non-leaf's
    gradient wrong (a.grad [1, 1] where torch gives [3, 3]). Now it is refused, in the op's name, with the
    tensor and its version unchanged: on the type's first call and on later ones."""
    for _ in range(2):
        target, whole = DIRECT_REFUSED[case]()
        before, version = whole.detach().clone(), whole._version
        with pytest.raises(RuntimeError, match=_grad_refusal("requires grad")):
            parity_ops.scale_(target)
        assert torch.equal(whole.detach(), before) and whole._version == version


def test_a_direct_write_into_a_no_grad_view_of_a_leaf_is_refused(parity_ops):
    """A view made under no_grad of a leaf that requires grad: torch refuses its in-place update with grad
    mode on; so does the direct route (torch says such a view requires grad)."""
    x = _f64(1.0, 2.0, requires_grad=True)
    with torch.no_grad():
        v = x[1:]
    with pytest.raises(RuntimeError, match="A view was created in no_grad mode"):
        v.mul_(3)
    with pytest.raises(RuntimeError, match=_grad_refusal("requires grad")):
        parity_ops.scale_(v)
    assert x.tolist() == [1.0, 2.0]


def test_a_direct_write_under_no_grad_or_without_grad_is_done_and_counted(parity_ops):
    """Where torch allows the write (grad mode off, or a tensor that needs no grad), the direct route does it
    and torch's version counter sees it: a tensor torch saved is then refused at backward, as for mul_."""
    x = _f64(1.0, 2.0, requires_grad=True)
    with torch.no_grad():
        parity_ops.scale_(x)
    assert x.tolist() == [3.0, 6.0] and x._version == 1
    y = _f64(1.0, 2.0)
    w = _f64(1.0, 1.0, requires_grad=True)
    z = (w * y).sum()  # torch saves y
    parity_ops.scale_(y)
    assert y.tolist() == [3.0, 6.0] and y._version == 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()


def test_a_direct_read_of_a_torch_tensor_that_requires_grad_still_works(parity_ops):
    """Only writes are refused: ops that read (or return their argument) take such tensors as before."""
    x = _f64(1.0, 2.0, requires_grad=True)
    assert parity_ops.mul(x, _f64(3.0, 4.0)).asnumpy().tolist() == [3.0, 8.0]
    assert parity_ops.ident(x).asnumpy().tolist() == [1.0, 2.0]
    for _ in range(3):  # a read-only type stops asking (call_rules.h KeepsForeign); a write is still refused
        parity_ops.mul(x, x)
    with pytest.raises(RuntimeError, match=_grad_refusal("requires grad")):
        parity_ops.scale_(x)


# ---- inference tensors: no in-place update outside InferenceMode, on every route -------------------------
def _inference_refusal(who: str) -> str:
    return "^" + re.escape(
        f"{who} modifies argument 0 in place (MarkDirty), but it is an inference tensor (made under "
        f"torch.inference_mode()) and inference mode is off: torch allows no in-place update to an inference "
        f"tensor outside InferenceMode. Write into a clone (x.clone()), or call it under torch.inference_mode(); "
        f"the argument is unchanged") + "$"


def _inference(*a) -> torch.Tensor:
    with torch.inference_mode():
        return _f64(*a)


def test_a_markdirty_write_into_an_inference_tensor_is_refused_on_to_torch(parity_ops, torch_route):
    """torch's t.mul_(3) on an inference tensor outside inference_mode raises; to_torch's scale_ wrote it
    (registered path and bridge). Now refused before the tensor changes, on every call of the signature
    (the third call, the first after two refusals, took the direct path and wrote it); reads and writes
    inside inference_mode work as torch's do."""
    ops = opbuilder.to_torch(parity_ops)
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
        _inference(1.0, 2.0).mul_(3)
    for _ in range(5):
        t = _inference(1.0, 2.0)
        with pytest.raises(RuntimeError, match=_inference_refusal("scale_")):
            ops.scale_(t)
        assert t.tolist() == [1.0, 2.0]
    assert ops.mul(_inference(1.0, 2.0), _f64(3.0, 4.0)).tolist() == [3.0, 8.0]
    with torch.inference_mode():
        t = _f64(1.0, 2.0)
        ops.scale_(t)
    assert t.tolist() == [3.0, 6.0]


def test_an_inference_mode_call_between_does_not_open_the_direct_path(parity_ops, torch_route):
    """A call inside inference_mode counts no write (an inference tensor has no counter), and reset what an
    earlier call showed: the next call outside took the direct path and wrote the inference tensor."""
    ops = opbuilder.to_torch(parity_ops)
    ops.scale_(_f64(1.0, 2.0))  # an ordinary call: the signature is seen writing
    for _ in range(3):
        with torch.inference_mode():
            t = _f64(1.0, 2.0)
            ops.scale_(t)
        assert t.tolist() == [3.0, 6.0]
        with pytest.raises(RuntimeError, match=_inference_refusal("scale_")):
            ops.scale_(t)
        assert t.tolist() == [3.0, 6.0]


def test_a_direct_write_into_an_inference_tensor_is_refused(parity_ops):
    for _ in range(2):
        t = _inference(1.0, 2.0)
        with pytest.raises(RuntimeError, match=_inference_refusal("ParityScale")):
            parity_ops.scale_(t)
        assert t.tolist() == [1.0, 2.0]
    with torch.inference_mode():
        parity_ops.scale_(t)
    assert t.tolist() == [3.0, 6.0]


# ---- conjugate and negative views: one named refusal on every route --------------------------------------
def _resolved_refusal(who: str, kind: str) -> str:
    return "^" + re.escape(
        f"{who} modifies argument 0 in place (MarkDirty), but it is a {kind} view (z.conj(), z.conj().imag, "
        f"torch._neg_view), which an operator gets as a resolved copy: the write would not reach it. Write into a "
        f"resolved tensor instead (x.resolve_neg(), x.resolve_conj() or x.clone()); the argument is unchanged") + "$"


def test_a_direct_write_into_a_negative_view_is_refused_in_to_torchs_words(parity_ops):
    """to_torch refuses a MarkDirty write into a view with the negative bit (it reaches the op as a resolved
    copy); called straight, the op raised DLPack's BufferError for any use. Now the same refusal, and a read
    gets the view's values, as on to_torch."""
    z = torch.tensor([1 + 1j, 2 - 2j], dtype=torch.complex128)
    ops = opbuilder.to_torch(parity_ops)
    with pytest.raises(RuntimeError, match=_resolved_refusal("scale_", "negative")):
        ops.scale_(z.conj().imag)
    for _ in range(2):
        with pytest.raises(RuntimeError, match=_resolved_refusal("ParityScale", "negative")):
            parity_ops.scale_(z.conj().imag)
        assert z.tolist() == [1 + 1j, 2 - 2j]
    assert parity_ops.mul(z.conj().imag, _f64(1.0, 1.0)).asnumpy().tolist() == [-1.0, 2.0]


@pytest.fixture(scope="session")
def conj_write_ops(cache_dir):
    return load_op("conj_write_ops", [CPP / "conj_write_ops.cpp"], cflags=["-Wall", "-Wextra", "-Werror"])


@pytest.mark.parametrize("route", ["registered", "bridge", "direct"])
def test_a_write_into_a_conjugate_view_is_one_named_refusal_on_every_route(conj_write_ops, route, monkeypatch,
                                                                         request):
    """muli_ (MarkDirty, x *= 1j) on z.conj(): to_torch refused it in its words; called straight, the op
    raised DLPack's BufferError. One refusal now, z unchanged; a read gets the view's values."""
    if route == "direct":
        op, who = conj_write_ops.muli_, "MulI"
    else:
        if route == "bridge":
            request.getfixturevalue("torch_bridge")
        monkeypatch.setenv("OPBUILDER_TORCH_BRIDGE", "1" if route == "bridge" else "0")
        op, who = opbuilder.to_torch(conj_write_ops).muli_, "muli_"
    for _ in range(5):  # every call of the signature, as for inference tensors
        z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex128)
        with pytest.raises(RuntimeError, match=_resolved_refusal(who, "conjugate")):
            op(z.conj())
        assert z.tolist() == [1 + 2j, 3 - 1j] and not z.is_conj()
    z = torch.tensor([1 + 2j], dtype=torch.complex128)
    r = op(z.conj().resolve_conj())  # the fix the message names works: torch's value
    assert (r.tolist() if isinstance(r, torch.Tensor) else r.asnumpy().tolist()) == [(1 - 2j) * 1j]


# ---- one tensor passed twice to a MarkDirty op; an undeclared write on every call --------------------------
def test_markdirty_of_a_tensor_passed_twice_is_torchs_x_add_x(autograd_ops, torch_route):
    """add_(x, x) (MarkDirty of argument 0, which argument 1 is too) is torch's x.add_(x): x doubles, and the
    gradient through it is torch's. It was refused as "modified argument 1 in place without MarkDirty"
    after the write, with x's version and history left as before the write."""
    t = opbuilder.to_torch(autograd_ops)
    a = _f64(1.0, 2.0, 3.0, requires_grad=True)
    ref = a * 1
    ref.add_(ref)
    (ref * ref).sum().backward()
    want_value, want_grad = ref.detach().clone(), a.grad.clone()
    for call in range(4):  # the registered operator, the eager Function, then the bridge's calls
        a.grad = None
        x = a * 1
        v = x._version
        assert t.add_(x, x) is x
        assert x._version == v + 1, call
        (x * x).sum().backward()
        torch.testing.assert_close(x.detach(), want_value, rtol=0, atol=0)
        torch.testing.assert_close(a.grad, want_grad, rtol=0, atol=0)


def test_an_undeclared_write_bumps_the_version_on_every_call(autograd_ops, torch_route):
    """sneaky_scale writes its argument without MarkDirty: every call is the named error, the data has
    changed, and so does the version, so a tensor torch saved from it fails its check at backward. From
    the second call on, the version stayed (the eager Function had deferred the count to a mark_dirty
    that never came), and the backward gave a silently wrong gradient."""
    t = opbuilder.to_torch(autograd_ops)
    a = _f64(1.0, 2.0, 3.0, requires_grad=True)
    for call in range(4):
        x = a * 1
        saved = x.sin()  # torch saves x
        v = x._version
        with pytest.raises(RuntimeError, match=r"^SneakyScale::Forward modified argument 0 in place without "
                                               r"MarkDirty"):
            t.sneaky_scale(x, "all")
        assert x.tolist() == [2.0, 4.0, 6.0]
        assert x._version == v + 1, call
        with pytest.raises(RuntimeError, match=r"modified by an inplace operation"):
            saved.sum().backward()


@pytest.mark.parametrize("grad", [True, False])
def test_markdirty_bumps_the_version_once_from_the_first_call(parity_ops, torch_route, grad):
    """torch's x.mul_(3) bumps x's version once. A signature's first call (the registered operator) bumped
    it twice with grad (the runtime's count, then ctx.mark_dirty's); with no argument needing grad there is
    no mark_dirty, and the runtime's count alone still bumps it. Zero-size tensors included: such a call
    returned a new tensor, not x, with torch's "mark_dirty() received a tensor that was not an input"
    warning, and later calls left the version where it was."""
    import warnings
    ops = opbuilder.to_torch(parity_ops)
    for shape in [(4,), (0, 3), (2, 0)]:
        for call in range(4):
            a = torch.ones(shape, dtype=torch.float64, requires_grad=grad)
            x = a * 1 if grad else a
            v = x._version
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                r = ops.scale_(x)
            assert r is x, (shape, call)
            assert x._version == v + 1, (shape, call)
            assert torch.equal(x.detach(), torch.full(shape, 3.0, dtype=torch.float64))
            if grad:
                assert x.grad_fn is not None and "Mul" not in type(x.grad_fn).__name__, (shape, call)


@pytest.mark.parametrize("grad", [True, False])
def test_markdirty_of_an_argument_returned_twice_bumps_the_version_once(parity_ops, torch_route, grad):
    """scale_twice_ writes x once (MarkDirty) and returns it as both outputs: one write, one bump, and the
    outputs are x itself. The registered operator's first call bumped it twice (ctx.mark_dirty(x, x)); the
    bridge once."""
    ops = opbuilder.to_torch(parity_ops)
    for call in range(3):
        a = torch.ones(4, dtype=torch.float64, requires_grad=grad)
        x = a * 1 if grad else a
        v = x._version
        r0, r1 = ops.scale_twice_(x)
        assert r0 is x and r1 is x, call
        assert x._version == v + 1, call
        assert torch.equal(x.detach(), torch.full((4,), 3.0, dtype=torch.float64)), call
        if grad:
            (g,) = torch.autograd.grad(x.sum(), a)
            assert torch.equal(g, torch.full((4,), 3.0, dtype=torch.float64)), call


# ---- writes a call could not see or that a refusal kept out: torch's counters, on every call -------------
SAVED_CHANGED = r"modified by an inplace operation"


def test_a_forward_that_raises_after_writing_counts_the_write(autograd_ops, torch_route):
    """fail_after_write doubles x in place (MarkDirty), then raises. torch's own forward doing x.mul_(2)
    then raising leaves x written at version + 1, so a tensor torch saved from x fails its check. The
    write stayed, but the version did not move, and the backward gave a gradient of other values."""
    t = opbuilder.to_torch(autograd_ops)
    a = _f64(1.0, 2.0, 3.0, requires_grad=True)
    for call in range(4):
        for grad in (False, True):  # (a non-leaf that requires grad: the call records)
            x = _f64(2.0, 2.0, 2.0, requires_grad=grad) * 1
            saved = (a * x).sum()  # torch saves x
            v = x._version
            with pytest.raises(RuntimeError, match=r"failed after writing"):
                t.fail_after_write(x)
            assert x._version == v + 1, (call, grad)
            with pytest.raises(RuntimeError, match=SAVED_CHANGED):
                saved.backward()


def test_a_forward_that_raises_after_writing_counts_the_write_in_the_runtime(autograd_ops):
    from runtime import Tensor
    x = Tensor(np.full(3, 2.0))
    v = x._version
    with pytest.raises(RuntimeError, match="failed after writing"):
        autograd_ops.fail_after_write(x)
    assert x.asnumpy().tolist() == [4.0, 4.0, 4.0] and x._version == v + 1


@pytest.mark.parametrize("views", ["interleaved", "partial"])
def test_a_write_into_memory_a_dirty_argument_only_partly_shares_is_undeclared(autograd_ops, torch_route, views):
    """dirty_a_write_b marks a dirty and writes b without saying so. b sharing some of a's memory does not
    explain b's change (x[::2] and x[1::2] share no element; x[:3] and x[2:5] share one): the write is the
    named error on every call, as any undeclared write. (Spans that met were taken as the same memory,
    and the gradient silently ignored the write into b.)"""
    t = opbuilder.to_torch(autograd_ops)
    base = _f64(1.0, 2.0, 3.0, 4.0, 5.0, 6.0, requires_grad=True)
    for call in range(4):
        x = base * 1
        a, b = (x[::2], x[1::2]) if views == "interleaved" else (x[:3], x[2:5])
        with pytest.raises(RuntimeError, match=r"(DirtyAWriteB::Forward modified argument 1 in place without "
                                               r"MarkDirty|dirty_a_write_b\(\) wrote tensor argument 1 in place)"):
            t.dirty_a_write_b(a, b)


def test_a_refused_write_into_a_negative_view_bumps_nothing(parity_ops, torch_route):
    """scale_ on torch._neg_view(x) is refused by name and x is unchanged; its version stays too, so a
    tensor torch saved from x still passes its check. (It went up by one.)"""
    ops = opbuilder.to_torch(parity_ops)
    for call in range(4):
        a = _f64(1.0, 1.0, requires_grad=True)
        x = _f64(2.0, 3.0)
        saved = (a * x).sum()
        with pytest.raises(RuntimeError, match=r"^scale_ modifies argument 0 in place \(MarkDirty\), but it is a "
                                               r"negative view"):
            ops.scale_(torch._neg_view(x))
        assert x.tolist() == [2.0, 3.0] and x._version == 0, call
        saved.backward()
        assert a.grad.tolist() == [2.0, 3.0]


@pytest.mark.parametrize("first", ["inference_mode", "zero-size"])
def test_a_first_call_that_cannot_show_a_write_proves_nothing(autograd_ops, torch_route, first):
    """sneaky_scale writes its argument without MarkDirty. A signature's first call is checksummed, and a
    call that wrote nothing unseen lets later ones skip that. A first call on an inference tensor (no
    version counter) or on an empty one could not show the write, yet counted as proof: every later
    undeclared write went uncounted, and a tensor torch saved gave a gradient of other values."""
    t = opbuilder.to_torch(autograd_ops)
    if first == "inference_mode":
        with torch.inference_mode():
            w = _f64(1.0, 1.0, 1.0)
            t.sneaky_scale(w, "all")
        assert w.tolist() == [2.0, 2.0, 2.0]
    else:
        t.sneaky_scale(torch.ones(0, dtype=torch.float64), "all")
    a = _f64(1.0, 2.0, 3.0, requires_grad=True)
    for call in range(4):
        x = _f64(2.0, 2.0, 2.0)
        saved = (a * x).sum()
        v = x._version
        with torch.no_grad():
            t.sneaky_scale(x, "all")
        assert x._version == v + 1, call
        with pytest.raises(RuntimeError, match=SAVED_CHANGED):
            saved.backward()


def test_writes_under_a_dispatch_mode_reach_the_callers_counter(autograd_ops, parity_ops, torch_route):
    """Under a TorchDispatchMode (a profiler's or a debugger's; it sends calls to the registered operator)
    the operator's kernel runs below torch's ADInplaceOrView, where a detached alias has a counter of its
    own: a MarkDirty write, x passed twice, and an undeclared write left x's version as it was, and a
    tensor torch saved from x gave a gradient of other values. They count on x's own counter now."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    t, p = opbuilder.to_torch(autograd_ops), opbuilder.to_torch(parity_ops)
    calls = {"scale_": lambda x: p.scale_(x), "add_(x, x)": lambda x: t.add_(x, x),
             "sneaky_scale": lambda x: t.sneaky_scale(x, "all")}
    for name, call in calls.items():
        for n in range(3):
            a = _f64(1.0, 2.0, 3.0, requires_grad=True)
            x = _f64(2.0, 2.0, 2.0)
            saved = (a * x).sum()
            v = x._version
            with PassThrough():
                call(x)
            assert x._version == v + 1, (name, n)
            with pytest.raises(RuntimeError, match=SAVED_CHANGED):
                saved.backward()


def test_an_unmarked_write_before_an_error_counts_on_a_watched_call(autograd_ops, torch_route):
    """fail_unmarked doubles x without MarkDirty, then raises, in a call that records nothing. A
    signature's first call is checksummed: the write counts one on x's counter (the error stays the
    call's), and the signature's later calls are checksummed too. (Its write was left uncounted.)"""
    t = opbuilder.to_torch(autograd_ops)
    a = _f64(1.0, 2.0, 3.0, requires_grad=True)
    for call in range(4):
        x = _f64(1.0, 1.0, 1.0)
        saved = (a * x).sum()
        v = x._version
        with pytest.raises(RuntimeError, match="failed after writing unmarked"):
            t.fail_unmarked(x)
        assert x.tolist() == [2.0, 2.0, 2.0] and x._version == v + 1, call
        with pytest.raises(RuntimeError, match=SAVED_CHANGED):
            saved.backward()


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("other", ["mul", "scale_"])
def test_a_dispatch_mode_that_calls_an_op_keeps_the_calls_gradient(parity_ops, torch_route, when, other):
    """A TorchDispatchMode that calls another to_torch op before or after the one it was handed (a
    logger's probe): that call set the eager path's thread state for itself, and the MarkDirty op's node
    was lost (x kept its old history; w's gradient missed the write's factor, silently)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    p = opbuilder.to_torch(parity_ops)
    probe = {"mul": lambda: p.mul(_f64(1.0), _f64(2.0)), "scale_": lambda: p.scale_(_f64(5.0))}[other]

    class CallsFirst(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if when == "before":
                probe()
            out = func(*args, **(kwargs or {}))
            if when == "after":
                probe()
            return out

    ref_w = _f64(1.0, 2.0, 3.0, requires_grad=True)
    ref = ref_w * 1
    ref.mul_(3)
    ((ref * ref).sum() + ref_w.sum()).backward()
    for call in range(3):
        w = _f64(1.0, 2.0, 3.0, requires_grad=True)
        x = w * 1
        v = x._version
        with CallsFirst():
            p.scale_(x)
        assert x._version == v + 1, call
        ((x * x).sum() + w.sum()).backward()
        torch.testing.assert_close(w.grad, ref_w.grad, rtol=0, atol=0)


def test_vmap_over_an_empty_batch_of_an_op_refusing_zeros(parity_ops):
    """recip refuses a zero element. torch.vmap over no elements learns the outputs' shapes from one run on
    an element's stand-in: a run on zeros raised recip's error about values never passed (attack on
    07d2521); ones serve. An op refusing every stand-in raises the run on zeros' error, with a note."""
    ns = opbuilder.to_torch(parity_ops)
    got = torch.func.vmap(ns.recip)(torch.ones(0, 3, dtype=torch.float64))
    assert got.shape == torch.func.vmap(torch.reciprocal)(torch.ones(0, 3, dtype=torch.float64)).shape == (0, 3)
    with pytest.raises(ValueError, match="^recip: expected float64") as info:
        torch.func.vmap(ns.recip)(torch.ones(0, 3, dtype=torch.float32))  # float64 only: every run refused
    assert "torch.vmap over an empty batch ran recip on zeros, ones and halves" in "".join(info.value.__notes__)

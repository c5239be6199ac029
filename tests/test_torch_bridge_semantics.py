"""to_torch's C++ bridge decides an op call as torch does (issue 33): MarkDirty on a view rebases the
base's history, an expanded tensor is never written, saved tensors go through torch's
saved_tensors_hooks, a gradient of the gradient is one named error, never zeros, a saved in-place
result is version-checked, and an output over an argument is torch's custom-Function view.

Every call checked here takes the bridge's fast path (asserted); the Python path's behaviour is
tests/test_interop_torch.py's.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

import opbuilder  # noqa: E402
from op_util import CPP, load_op  # noqa: E402

pytestmark = pytest.mark.build

DOUBLE = (r"{}: double backward through an opbuilder operator is not supported: its Backward is "
          r"once-differentiable \(create_graph=True, then a gradient of the gradient\)")
OVERLAP = (r"{} modifies argument 0 in place \(MarkDirty\): unsupported operation: more than one element of the "
           r"written-to tensor refers to a single memory location\. Please clone\(\) the tensor before performing "
           r"the operation\.")


@pytest.fixture
def bridge_ops(inplace_view_ops):
    """tests/cpp/inplace_view_ops.cpp (conftest): in-place scales, a saving multiply, an exp saving its output."""
    return inplace_view_ops


@pytest.fixture
def ops(bridge_ops, torch_bridge, monkeypatch):
    monkeypatch.setenv("OPBUILDER_TORCH_BRIDGE", "1")
    return opbuilder.to_torch(bridge_ops)


def _fast(fn) -> int:
    op = fn.bridged[0]
    return 0 if op is None else op.fast_calls


def _warm(fn, *args) -> int:
    """Defines the call's signature on the Python path (its first call); the fast calls so far."""
    fn(*(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args))
    return _fast(fn)


VIEWS = {
    "slice": lambda b: b[1:],
    "step": lambda b: b[::2],
    "reshape": lambda b: b.reshape(2, 2),
    "row": lambda b: b.view(2, 2)[1],
    "transpose": lambda b: b.view(2, 2).t(),
}


def _central(f, a: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """d sum(f(a) * w) / da by central differences (float64)."""
    g = torch.zeros_like(a)
    for i in range(a.numel()):
        hi, lo = a.detach().clone(), a.detach().clone()
        hi.view(-1)[i] += eps
        lo.view(-1)[i] -= eps
        g.view(-1)[i] = ((f(hi) * w).sum() - (f(lo) * w).sum()) / (2 * eps)
    return g


@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("name", ["scale_", "scale_views_"])
def test_markdirty_on_a_view_rebases_the_base_history_as_torch_does(ops, name, view):
    fn, make = getattr(ops, name), VIEWS[view]
    a = torch.arange(1.0, 5.0, dtype=torch.float64, requires_grad=True)
    before = _warm(fn, make(a.detach().clone()), 3.0)

    def through_op(x):
        b = x * 1
        fn(make(b), 3.0)
        return b

    def through_torch(x):
        b = x * 1
        make(b).mul_(3.0)
        return b

    b = a * 1
    v = make(b)
    out = fn(v, 3.0)
    assert _fast(fn) == before + 1 and out is v
    torch.testing.assert_close(b, through_torch(a.detach()))
    w = torch.from_numpy(np.random.default_rng(0).standard_normal(4))
    (b * w).sum().backward()
    ref = a.detach().clone().requires_grad_(True)
    (through_torch(ref) * w).sum().backward()
    torch.testing.assert_close(a.grad, ref.grad)  # e.g. [1, 3, 3, 3] for the slice, not [1, 1, 1, 1]
    torch.testing.assert_close(a.grad, _central(through_op, a, w))
    # the view's own history is the op's too: a gradient through the view alone is scaled
    a.grad = ref.grad = None
    fn(make(a * 1), 3.0).sum().backward()
    vt = make(ref * 1)
    vt.mul_(3.0)
    vt.sum().backward()
    torch.testing.assert_close(a.grad, ref.grad)


def test_a_view_modified_in_place_must_be_the_only_output(ops):
    a = torch.ones(4, dtype=torch.float64, requires_grad=True)
    before = _warm(ops.scale_and_double_, a.detach()[1:], 3.0)
    with pytest.raises(RuntimeError, match=r"ScaleAndDouble: If your Function modifies inplace an input that is a "
                                           r"view of another Tensor, your Function cannot return more than one Tensor"):
        ops.scale_and_double_((a * 1)[1:], 3.0)
    assert _fast(ops.scale_and_double_) == before + 1
    b = a * 1  # not a view: two outputs are fine
    x, y = ops.scale_and_double_(b, 3.0)
    (x.sum() + y.sum()).backward()
    assert a.grad.tolist() == [9.0] * 4


@pytest.mark.parametrize("name, cls", [("scale_", "ScaleInplace"), ("scale_views_", "ScaleInplaceViews")])
@pytest.mark.parametrize("grad", [True, False])
def test_an_expanded_tensor_is_never_written(ops, name, cls, grad):
    fn = getattr(ops, name)
    a = torch.tensor([2.0], dtype=torch.float64, requires_grad=grad)
    before = _warm(fn, torch.ones(4, dtype=torch.float64)[::2], 3.0)  # a strided signature "tf"
    base = a * 1 if grad else a.clone()
    e = base.expand(4)
    version = base._version
    with pytest.raises(RuntimeError, match=OVERLAP.format(cls)):
        fn(e, 3.0)
    assert _fast(fn) == before + 1
    assert base.tolist() == [2.0] and base._version == version  # nothing written, nothing bumped
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        base.expand(4).mul_(3.0)  # torch's own rule, the same words


def test_saved_tensors_go_through_saved_tensors_hooks(ops):
    x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([3.0, 4.0], dtype=torch.float64)
    before = _warm(ops.mul_saved, x, y)
    packed = []

    def pack(t):
        packed.append(t.tolist())
        return t.clone()  # a copy: later writes to the saved tensor do not reach it

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        z = ops.mul_saved(x, y)
        xt = x.detach().clone().requires_grad_(True)
        zt = xt * y.clone()  # torch's own op under the same hooks
    assert _fast(ops.mul_saved) == before + 1
    assert packed[:2] == [[1.0, 2.0], [3.0, 4.0]]
    y.mul_(10)  # no version error: torch checks no version of a hooked tensor, and the copy is read
    z.sum().backward()
    zt.sum().backward()
    assert x.grad.tolist() == [3.0, 4.0] == xt.grad.tolist()


def test_the_unpack_hook_gives_backward_what_it_reads(ops):
    x = torch.tensor([0.0, 1.0], dtype=torch.float64, requires_grad=True)
    before = _warm(ops.exp_saves_output, x)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: torch.full_like(t, 5.0)):
        z = ops.exp_saves_output(x)  # saves its output
    assert _fast(ops.exp_saves_output) == before + 1
    z.sum().backward()
    assert x.grad.tolist() == [5.0, 5.0]  # Backward multiplied by what the unpack hook returned


def test_a_failing_pack_hook_fails_the_call(ops):
    x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    before = _warm(ops.mul_saved, x, x)

    def pack(t):
        raise ValueError("this pack hook refuses")

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with pytest.raises(ValueError, match="this pack hook refuses"):
            ops.mul_saved(x, x)
    assert _fast(ops.mul_saved) == before + 1


def test_without_hooks_saved_inputs_are_still_version_checked(ops):
    x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([3.0, 4.0], dtype=torch.float64)
    _warm(ops.mul_saved, x, y)
    z = ops.mul_saved(x, y)
    y.mul_(10)
    with pytest.raises(RuntimeError, match=r"one of the tensors saved for backward by MulSaved \(saved slot 1\) has "
                                           r"been modified by an in-place operation"):
        z.sum().backward()


@pytest.mark.parametrize("how", ["grad", "backward"])
def test_double_backward_is_one_named_error(ops, how):
    x = torch.tensor([0.5, 1.0], dtype=torch.float64, requires_grad=True)
    before = _warm(ops.exp_saves_output, x)
    z = ops.exp_saves_output(x)
    assert _fast(ops.exp_saves_output) == before + 1
    if how == "grad":
        g, = torch.autograd.grad(z.sum(), x, create_graph=True)
    else:
        z.sum().backward(create_graph=True)
        g = x.grad
    torch.testing.assert_close(g.detach(), x.detach().exp())  # the first gradient is right
    assert g.requires_grad  # and differentiating it is an error, never zeros or "does not require grad"
    with pytest.raises(RuntimeError, match=DOUBLE.format("exp_saves_output")):
        torch.autograd.grad(g.sum(), x)
    x.grad = None


def test_double_backward_through_one_argument_of_two(ops):
    x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([3.0, 4.0], dtype=torch.float64, requires_grad=True)
    _warm(ops.mul_saved, x, y)
    gx, gy = torch.autograd.grad(ops.mul_saved(x, y).sum(), (x, y), create_graph=True)
    assert gx.tolist() == [3.0, 4.0] and gy.tolist() == [1.0, 2.0]
    with pytest.raises(RuntimeError, match=DOUBLE.format("mul_saved")):
        torch.autograd.grad(gx.sum(), y)
    # without create_graph the gradients are plain tensors, as before
    gx, _ = torch.autograd.grad(ops.mul_saved(x, y).sum(), (x, y))
    assert not gx.requires_grad and gx.grad_fn is None


@pytest.mark.parametrize("name, cls", [("scale_", "ScaleInplace"), ("scale_views_", "ScaleInplaceViews")])
@pytest.mark.parametrize("view", [None, "slice", "step", "reshape"])
def test_a_refused_write_into_a_leaf_leaves_it_untouched(ops, name, cls, view):
    """torch's check_inplace, decided before Forward runs: the refusal is torch's, in its words, and
    what Forward wrote is undone (torch's mul_ writes nothing either)."""
    fn = getattr(ops, name)
    x = torch.arange(1.0, 5.0, dtype=torch.float64, requires_grad=True)
    before = _warm(fn, x, 3.0)
    what = "a leaf Variable" if view is None else "a view of a leaf Variable"
    with pytest.raises(RuntimeError, match=rf"^{cls}: {what} that requires grad is being used in an in-place "
                                           rf"operation\.$"):
        fn(x if view is None else VIEWS[view](x), 3.0)
    assert _fast(fn) == before + 1
    assert x.tolist() == [1.0, 2.0, 3.0, 4.0] and x._version == 0 and x.grad_fn is None
    with torch.no_grad():  # outside recording the write is allowed, as torch's
        fn(x if view is None else VIEWS[view](x), 3.0)
    assert x.tolist() != [1.0, 2.0, 3.0, 4.0]


def test_a_view_made_without_grad_is_refused_as_torch_refuses_it(ops):
    a = torch.ones(4, dtype=torch.float64, requires_grad=True)
    b = a * 1
    with torch.no_grad():
        v = b[1:]
    before = _warm(ops.scale_, v, 3.0)
    with pytest.raises(RuntimeError) as torch_says:
        v.mul_(3.0)
    with pytest.raises(RuntimeError) as op_says:
        ops.scale_(v, 3.0)
    assert _fast(ops.scale_) == before + 1
    assert str(op_says.value) == "ScaleInplace: " + str(torch_says.value)
    assert "was created in no_grad mode" in str(op_says.value) and b.tolist() == [1.0] * 4


# ---- a saved in-place result is version-checked; outputs over an argument are torch's views --------------------------

@pytest.fixture(scope="session")
def bridge_alias_ops(cache_dir):
    """tests/cpp/bridge_alias_ops.cpp: an in-place exp saving its result, ident, pair."""
    return load_op("bridge_alias_ops", [CPP / "bridge_alias_ops.cpp"], include_paths=[CPP],
                   cflags=["-Wall", "-Wextra", "-Werror"])


@pytest.fixture
def alias_ops(bridge_alias_ops, torch_bridge, monkeypatch):
    monkeypatch.setenv("OPBUILDER_TORCH_BRIDGE", "1")
    return opbuilder.to_torch(bridge_alias_ops)


SAVED_WRITTEN = (r"^one of the tensors saved for backward by ExpInplace \(saved slot 0\) has been modified by an "
                 r"in-place operation: it is at version {}, but was saved at version {}$")


@pytest.mark.parametrize("view", [None, "slice", "reshape"])
def test_the_saved_result_of_an_in_place_op_is_version_checked(alias_ops, view):
    """torch's exp_ saves its result: a write into it before backward is refused (bridge, issue 33)."""
    def run(exp_):
        x = torch.tensor([0.5, 1.0, 1.5, 2.0], dtype=torch.float64, requires_grad=True)
        b = x * 1
        return x, exp_(b if view is None else VIEWS[view](b))

    before = _warm(alias_ops.exp_, torch.zeros(4, dtype=torch.float64) if view is None
                   else VIEWS[view](torch.zeros(4, dtype=torch.float64)))
    x, r = run(alias_ops.exp_)
    assert _fast(alias_ops.exp_) == before + 1
    r.sum().backward()  # unwritten: torch's gradient through the base
    x_torch, r_torch = run(torch.Tensor.exp_)
    r_torch.sum().backward()
    torch.testing.assert_close(x.grad, x_torch.grad)
    x, r = run(alias_ops.exp_)
    r.add_(1)
    version = r._version
    with pytest.raises(RuntimeError, match=SAVED_WRITTEN.format(version, version - 1)):
        r.sum().backward()
    assert _fast(alias_ops.exp_) == before + 2


@pytest.mark.parametrize("view", [None, "slice"])
@pytest.mark.parametrize("write", ["result", "base"])
def test_a_saved_in_place_result_written_between_two_backwards_is_refused(alias_ops, write, view):
    """retain_graph: the second backward reads what was saved, so a write in between is refused, as torch's."""
    _warm(alias_ops.exp_, torch.zeros(2, dtype=torch.float64))
    x = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64, requires_grad=True)
    b = x * 1
    r = alias_ops.exp_(b if view is None else VIEWS[view](b))
    loss = r.sum()
    loss.backward(retain_graph=True)
    head = x.detach().exp() if view is None else torch.cat([torch.zeros(1, dtype=torch.float64), x.detach()[1:].exp()])
    torch.testing.assert_close(x.grad, head)
    with torch.no_grad():
        (b if write == "base" else r).add_(1)
    with pytest.raises(RuntimeError, match=SAVED_WRITTEN.format(r._version, r._version - 1)):
        loss.backward()


class _PairPy(torch.autograd.Function):
    """torch's own custom Function returning its argument twice: the reference for the words."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x), x.view_as(x)

    @staticmethod
    def backward(ctx, a, b):
        return a + b


class _IdentPy(torch.autograd.Function):
    """torch's own custom Function returning its argument."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        return g


def _torch_words(cls: type, name: str, act) -> str:
    """What torch says for `act` on the outputs of its custom Function `cls`, naming it `name`."""
    x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    b = x * 1
    with pytest.raises(RuntimeError) as says:
        act(b, cls.apply(b))
    return str(says.value).replace(cls.__name__, name)


def _same_refusal_on_the_bridge(op, py_function, name, act, phrase):
    """``act(b, op(b))`` on the bridge's fast path (b = x * 1, x a leaf) fails with exactly the words
    torch gives for its own custom Function ``py_function`` (which contain ``phrase``); returns (x, b)."""
    _warm(op, torch.zeros(2, dtype=torch.float64))
    want = _torch_words(py_function, name, act)
    assert phrase in want
    before = _fast(op)
    x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    b = x * 1
    outs = op(b)
    assert _fast(op) == before + 1
    with pytest.raises(RuntimeError) as op_says:
        act(b, outs)
    assert str(op_says.value) == want
    return x, b


@pytest.mark.parametrize("output", [0, 1])
def test_writing_one_of_two_outputs_over_the_argument_is_torchs_refusal(alias_ops, output):
    """torch marks each view a custom Function returns, among several outputs, MULTI_OUTPUT_NODE: a
    write into one is refused in its words, not as a view made in no_grad mode."""
    def act(b, outs):
        outs[output].mul_(3)

    x, b = _same_refusal_on_the_bridge(alias_ops.pair, _PairPy, "Pair", act, "returns multiple views")
    assert b.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("how", ["write_output", "write_base"])
def test_an_argument_returned_unchanged_is_torchs_custom_function_view(alias_ops, how):
    """torch marks an input a custom Function returns as-is IN_CUSTOM_FUNCTION: writing it, or using it
    after its base was written, is refused in torch's custom-Function words."""
    w = torch.tensor([1.0, 10.0], dtype=torch.float64)

    def act(b, r):
        if how == "write_output":
            r.mul_(5)
        else:
            b.mul_(5)
            (r * w).sum().backward()

    x, b = _same_refusal_on_the_bridge(alias_ops.ident, _IdentPy, "Ident", act, "custom Function")
    assert x.grad is None

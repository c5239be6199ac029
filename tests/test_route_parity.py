"""One semantics on every route: the same operators, with the same inputs, through runtime eager, runtime.jit
(its first, tracing call and a replay), torch's registered path (bridge off), the torch C++ bridge,
torch.compile, the JAX callback and XLA FFI give the same values, gradients and errors. The reference
is what torch's own ops do (tests/cpp/parity_ops.cpp: mul saves its inputs, scale_ is MarkDirty,
ident returns its input unchanged)."""
from __future__ import annotations

import types

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor

from op_util import CPP, load_op

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

import opbuilder  # noqa: E402

pytestmark = pytest.mark.build

RNG = np.random.default_rng(33)
X = RNG.standard_normal(4)
Y = RNG.standard_normal(4)
W = RNG.standard_normal(4)
W2 = RNG.standard_normal(4)
VIEWS = {  # a view of a 4-element base, in each framework (names say which)
    "slice": (lambda b: b[1:]),
    "step": (lambda b: b[::2]),
    "reshape": (lambda b: b.reshape(2, 2)),
}
LEAF_WRITE = r"leaf (Variable )?that requires grad"
STALE = r"modified by an in-?place operation"
# torch's refusal for a custom Function's view output (created inside it, or one of several views it returns)
VIEW_WRITTEN = (r"is a view and its base or another view of its base has been modified inplace\. This view "
                r"(was created inside a custom Function|is the output of a function that returns multiple views)")


@pytest.fixture(scope="session")
def parity_ops(cache_dir):
    return load_op("parity_ops", [CPP / "parity_ops.cpp"])


# ---- the reference: torch's own ops -------------------------------------------------------------
class _TorchNative:
    """The same three ops written with torch's own ops: what every route must match."""
    mul = staticmethod(lambda x, y: x * y)
    scale_ = staticmethod(lambda x: x.mul_(3.0))
    ident = staticmethod(lambda x: x.view_as(x))
    dup = staticmethod(lambda x: (lambda y: (y, y))(x * 2.0))
    head = staticmethod(lambda x: x[:2])
    y_and_head = staticmethod(lambda x: (lambda y: (y, y[:2]))(x * 2.0))
    scale_head_ = staticmethod(lambda x: (lambda r: (r, r[:2]))(x.mul_(3.0)))
    tail_and_y = staticmethod(lambda x: (lambda y: (y[2:], y))(x * 2.0))
    reversed = staticmethod(lambda x: x.flip(0))


# ---- the scenarios, written once against a framework adapter ------------------------------------
class _TorchSide:
    def __init__(self, ops):
        self.ops = ops

    def leaf(self, a, grad=True):
        return torch.tensor(a, dtype=torch.float64, requires_grad=grad)

    def const(self, a):
        return torch.tensor(a, dtype=torch.float64)

    def grads(self, loss, leaves):
        return [g.numpy() for g in torch.autograd.grad(loss, leaves)]

    def value(self, t):
        return t.detach().numpy().copy()

    def mul_inplace(self, t, k):
        t.mul_(k)

    def no_grad(self):
        return torch.no_grad()


class _RuntimeSide:
    def __init__(self, ops):
        self.ops = ops

    def leaf(self, a, grad=True):
        return Tensor(np.array(a, dtype=np.float64), requires_grad=grad) if grad else Tensor(np.array(a))

    def const(self, a):
        return Tensor(np.array(a, dtype=np.float64))

    def grads(self, loss, leaves):
        loss.backward()
        return [leaf.grad.asnumpy() for leaf in leaves]

    def value(self, t):
        return t.asnumpy().copy()

    def mul_inplace(self, t, k):
        t *= k

    def no_grad(self):
        return rt.no_grad()


def s_mul(side):
    x, y = side.leaf(X), side.leaf(Y)
    out = side.ops.mul(x, y)
    return side.value(out), side.grads((out * side.const(W)).sum(), [x, y])


def s_scale_nonleaf(side):
    x = side.leaf(X)
    b = x * 1
    r = side.ops.scale_(b)
    loss = (r * side.const(W)).sum() + (b * side.const(W2)).sum()
    return side.value(b), side.grads(loss, [x])


def _s_scale_view(view):
    def s(side):
        x = side.leaf(X)
        b = x * 1
        side.ops.scale_(view(b))
        return side.value(b), side.grads((b * side.const(W)).sum(), [x])
    s.__name__ = "s_scale_view"
    return s


def s_ident_after_mul(side):
    x, y = side.leaf(X), side.leaf(Y)
    z = side.ops.mul(x, y)
    u = side.ops.ident(z)
    return side.value(u), side.grads((u * side.const(W)).sum() + (z * side.const(W2)).sum(), [x, y])


def s_ident_chain(side):
    """An op returning its input unchanged after another op: each keeps its own graph."""
    x = side.leaf(X)
    z = side.ops.mul(x, side.const(Y))
    u = side.ops.ident(side.ops.ident(z))
    return side.value(u), side.grads((u * side.const(W)).sum(), [x])


def s_leaf_write_refused(side):
    x = side.leaf(X)
    before = side.value(x)
    with pytest.raises(RuntimeError, match=LEAF_WRITE):
        side.ops.scale_(x)
    return side.value(x) - before, []


def s_saved_input_changed(side):
    x, y = side.leaf(X), side.leaf(Y, grad=False)
    z = side.ops.mul(x, y)
    side.mul_inplace(y, 10.0)
    with pytest.raises(RuntimeError, match=STALE):
        side.grads((z * side.const(W)).sum(), [x])
    return None, []


def s_dup(side):
    """One new tensor returned as two outputs: its gradient is whole, from either (torch: one object)."""
    x = side.leaf(X)
    a, b = side.ops.dup(x)
    return side.value(a), side.grads((a * side.const(W)).sum() + (b * side.const(W2)).sum(), [x])


def s_dup_written(side):
    """A write through one of the two outputs is a write of the other: a saved one is stale at backward."""
    x = side.leaf(X)
    a, b = side.ops.dup(x)
    loss = (b * b).sum()
    with side.no_grad():  # (the runtime writes no recorded output with grad on)
        side.mul_inplace(a, 10.0)
    with pytest.raises(RuntimeError, match=STALE):
        side.grads(loss, [x])
    return side.value(b), []


def s_head(side):
    """An output Forward builds over its argument's memory is a view of it: values and gradients."""
    x = side.leaf(X)
    v = side.ops.head(x * 1)
    return side.value(v), side.grads((v * side.const(W[:2])).sum(), [x])


def _view_written(side, call):
    """``call(side, x)`` gives (the base, its view); the view saved, then the base written: the write is seen
    at backward (torch's words for its own Function's view output on the torch routes, or for x[:2])."""
    x = side.leaf(X)
    base, view = call(side, x)
    loss = (view * view).sum()
    with side.no_grad():
        side.mul_inplace(base, 10.0)
    with pytest.raises(RuntimeError, match=STALE + "|" + VIEW_WRITTEN):
        side.grads(loss, [x])
    return side.value(view), []


def s_head_written(side):
    """A write into the argument after the call is seen by what saved the view (torch: x[:2] shares x's counter)."""
    return _view_written(side, lambda side, x: (lambda h: (h, side.ops.head(h)))(x * 1))


def s_y_and_head_written(side):
    """An output Forward builds over its other output ({y, y[:2]}) is a view of it: a write into y is seen."""
    return _view_written(side, lambda side, x: side.ops.y_and_head(x))


def s_tail_and_y_written(side):
    """An output that is a view of a LATER output ({y[2:], y}): the later one is its base."""
    return _view_written(side, lambda side, x: side.ops.tail_and_y(x)[::-1])


def s_reversed(side):
    """A view with a negative stride: its values and gradient (torch has no such view: a copy there)."""
    x = side.leaf(X)
    r = side.ops.reversed(x * 1)
    return side.value(r), side.grads((r * side.const(W)).sum(), [x])


def s_scale_head(side):
    """MarkDirty and a view of the written argument as a second output: torch's gradient, the write done once."""
    x = side.leaf(X)
    b = x * 1
    r, v = side.ops.scale_head_(b)
    return side.value(b), side.grads((r * side.const(W)).sum() + (v * side.const(W2[:2])).sum(), [x])


SCENARIOS = {"mul": s_mul, "dup": s_dup, "dup_written": s_dup_written, "head": s_head, "head_written": s_head_written,
             "y_and_head_written": s_y_and_head_written, "scale_head": s_scale_head,
             "tail_and_y_written": s_tail_and_y_written, "reversed": s_reversed, "scale_nonleaf": s_scale_nonleaf, "ident_after_mul": s_ident_after_mul,
             "ident_chain": s_ident_chain, "leaf_write_refused": s_leaf_write_refused,
             "saved_input_changed": s_saved_input_changed,
             **{f"scale_view_{k}": _s_scale_view(v) for k, v in VIEWS.items()}}


def _expected(name):
    return SCENARIOS[name](_TorchSide(_TorchNative))


def _same(got, want):
    gv, gg = got
    wv, wg = want
    if wv is None:
        assert gv is None
    else:
        np.testing.assert_allclose(gv, wv, rtol=1e-12, atol=1e-12)
    assert len(gg) == len(wg)
    for a, b in zip(gg, wg):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


# ---- runtime routes -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_runtime_eager(parity_ops, name):
    _same(SCENARIOS[name](_RuntimeSide(parity_ops)), _expected(name))


@pytest.mark.parametrize("name", ["mul", "scale_nonleaf", "ident_after_mul", "ident_chain", "dup", "dup_written",
                                  "head", "head_written", "y_and_head_written", "scale_head", "tail_and_y_written",
                                  "reversed"] + [f"scale_view_{k}" for k in VIEWS])
def test_runtime_jit_first_call_and_replay(parity_ops, name):
    """The op calls under runtime.jit: the first call (which traces) and a replay each run every op once."""
    side = _RuntimeSide(parity_ops)
    scenario = SCENARIOS[name]
    want = _expected(name)
    jitted = types.SimpleNamespace(**{n: rt.jit(getattr(parity_ops, n)) for n in ("mul", "scale_", "ident", "dup",
                                                                                  "head", "y_and_head", "scale_head_",
                                                                                  "tail_and_y", "reversed")})
    side.ops = jitted
    for _ in range(2):  # trace, then replay
        _same(scenario(side), want)


# ---- torch routes -------------------------------------------------------------------------------
@pytest.fixture(params=["registered", "bridge"])
def torch_route(request, monkeypatch, parity_ops):
    if request.param == "bridge":
        request.getfixturevalue("torch_bridge")
    monkeypatch.setenv("OPBUILDER_TORCH_BRIDGE", "1" if request.param == "bridge" else "0")
    return request.param


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_torch_eager_routes(parity_ops, torch_route, name):
    """Both eager torch routes; a second run of the scenario takes the bridge where it is on."""
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(2):
        _same(SCENARIOS[name](_TorchSide(ops)), _expected(name))


@pytest.mark.parametrize("grad", [True, False])
def test_one_tensor_returned_twice_is_one_object(parity_ops, torch_route, grad):
    """As torch's own Function returns it, on both torch routes (recording a node, or not). The runtime's
    recording call returns two objects, each output its own gradient slot as on JAX, over one version
    counter. (A recording call returned two objects over one memory, each with its own counter: a write
    through one left a saved other stale, and the gradient silently wrong: s_dup_written.)"""
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(2):
        a, b = ops.dup(torch.tensor(X, requires_grad=grad))
        assert a is b
        a, b = parity_ops.dup(Tensor(np.array(X), requires_grad=grad))
        assert a._vc is b._vc and a._vc is not rt.versions.UNWRITTEN if grad else a is b


@pytest.mark.parametrize("first", ["negative view", "inference"])
def test_a_view_output_after_a_first_call_that_copied_is_a_view_on_the_bridge(parity_ops, torch_route, first):
    """head's first call got a resolved copy (a negative view, an inference tensor), so its output was new
    memory and the signature went to the C++ bridge; later calls' outputs over the caller's memory came
    back as tensors of their own there: a write into the argument left a saved output stale, no error."""
    ops = opbuilder.to_torch(parity_ops)
    if first == "inference":
        with torch.inference_mode():
            arg = torch.tensor(X)
    else:
        arg = torch.tensor(X)._neg_view()
    ops.head(arg)
    for _ in range(3):
        x = torch.tensor(X, requires_grad=True)
        h = x * 1
        v = ops.head(h)
        assert v._is_view() and v._base is h and v.data_ptr() == h.data_ptr()
        loss = (v * v).sum()
        with torch.no_grad():
            h.mul_(10.0)
        assert v._version == h._version
        with pytest.raises(RuntimeError, match=VIEW_WRITTEN):
            loss.backward()


def test_a_view_from_a_call_that_records_nothing_is_written_with_grad_as_torchs(parity_ops, torch_route):
    """x[:2] of a tensor that needs no gradient, written in place by one that does: torch's own view allows
    it. The first call did; on the bridge, later calls' views were made under no_grad and refused."""
    ops = opbuilder.to_torch(parity_ops)
    for call in range(3):
        x = torch.tensor(X)
        w = torch.tensor(W[:2], requires_grad=True)
        v = ops.head(x)
        v.mul_(w)
        (g,) = torch.autograd.grad((v * torch.tensor(W2[:2])).sum(), w)
        np.testing.assert_allclose(x.detach().numpy()[:2], X[:2] * W[:2], rtol=1e-15, err_msg=str(call))
        np.testing.assert_allclose(g.numpy(), X[:2] * W2[:2], rtol=1e-15, err_msg=str(call))


def test_torch_func_takes_an_op_returning_one_tensor_twice_every_time(parity_ops):
    """Its first torch.func.grad was right; every later one was refused as "returns its argument"."""
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        g = torch.func.grad(lambda x: sum(o.sum() for o in ops.dup(x)))(torch.tensor(X))
        np.testing.assert_allclose(g.numpy(), np.full(4, 4.0), rtol=1e-15)


TORCH_SECOND_TIME = (r"^Trying to backward through the graph a second time \(or directly access saved tensors after "
                     r"they have already been freed\)\. Saved intermediate values of the graph are freed when you call "
                     r"\.backward\(\) or autograd\.grad\(\)\. Specify retain_graph=True if you need to backward through "
                     r"the graph a second time or if you need to access saved tensors after calling backward\.$")


def test_torch_second_backward_without_retain_graph(parity_ops, torch_route):
    """torch's rule on every call of a signature (the registered operator, then the eager Function, then
    the bridge): a second backward through a graph without retain_graph raises torch's error, and the
    gradient is the first backward's alone. (The second and later calls accepted it and added the
    gradient twice.)"""
    ops = opbuilder.to_torch(parity_ops)
    for call in range(4):
        a = torch.tensor(X, requires_grad=True)
        out = ops.mul(a, torch.tensor(Y)).sum()
        out.backward()
        with pytest.raises(RuntimeError, match=TORCH_SECOND_TIME):
            out.backward()
        np.testing.assert_allclose(a.grad.numpy(), Y, rtol=1e-15, err_msg=f"call {call}")
        b = torch.tensor(X, requires_grad=True)
        kept = ops.mul(b, torch.tensor(Y)).sum()
        kept.backward(retain_graph=True)
        kept.backward()
        np.testing.assert_allclose(b.grad.numpy(), 2 * Y, rtol=1e-15, err_msg=f"call {call}, retained")


@pytest.mark.parametrize("name", ["mul", "scale_nonleaf", "ident_after_mul", "ident_chain", "dup", "dup_written",
                                  "head", "head_written", "y_and_head_written", "scale_head", "tail_and_y_written",
                                  "reversed", "saved_input_changed"])
def test_torch_compile(parity_ops, name):
    """Compiled after one eager call of each op: an op that writes or returns its argument is then
    run outside the graph (torch's custom ops may not alias their inputs), the rest in it."""
    ops = opbuilder.to_torch(parity_ops)
    ops.mul(torch.ones(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64))
    ops.scale_(torch.ones(4, dtype=torch.float64))
    ops.ident(torch.ones(4, dtype=torch.float64))
    ops.dup(torch.ones(4, dtype=torch.float64))
    ops.head(torch.ones(4, dtype=torch.float64))
    ops.y_and_head(torch.ones(4, dtype=torch.float64))
    ops.scale_head_(torch.ones(4, dtype=torch.float64))
    ops.tail_and_y(torch.ones(4, dtype=torch.float64))
    ops.reversed(torch.ones(4, dtype=torch.float64))
    compiled = types.SimpleNamespace(**{n: torch.compile(getattr(ops, n), backend="aot_eager")
                                        for n in ("mul", "scale_", "ident", "dup", "head", "y_and_head",
                                                  "scale_head_", "tail_and_y", "reversed")})
    _same(SCENARIOS[name](_TorchSide(compiled)), _expected(name))


@pytest.mark.parametrize("case", ["x.t()", "x.t().sin()", "y.t()"])
def test_torch_compile_inductor_with_a_transposed_argument(parity_ops, case):
    """inductor checks each output's strides against the fake kernel's. The backward operator's fake gave
    an argument's gradient the argument's strides (empty_like: a transposed argument's transposed), its
    kernel returned contiguous memory, and every backward with a transposed argument failed with an
    AssertionError. Values and gradients now match torch's own multiply. (Caches off: a graph compiled
    before would come back from inductor's cache with the old fake's strides.)"""
    import torch._inductor.config as inductor_config
    ops = opbuilder.to_torch(parity_ops)
    rng = np.random.default_rng(38)

    def f(mul):
        return {"x.t()": lambda x, y: mul(x.t(), y.t().contiguous()),
                "x.t().sin()": lambda x, y: mul(x.t().sin(), y.t().contiguous()),
                "y.t()": lambda x, y: mul(x.sin().t().contiguous(), y.t())}[case]

    x0, y0 = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    want = []
    for mul in (lambda a, b: a * b, None):
        x, y = torch.tensor(x0, requires_grad=True), torch.tensor(y0, requires_grad=True)
        if mul is None:
            with inductor_config.patch(force_disable_caches=True):
                out = torch.compile(f(ops.mul), backend="inductor")(x, y)
                (out * torch.tensor(np.arange(12.0).reshape(3, 4))).sum().backward()
        else:
            out = f(mul)(x, y)
            (out * torch.tensor(np.arange(12.0).reshape(3, 4))).sum().backward()
        got = (out.detach().numpy(), x.grad.numpy(), y.grad.numpy())
        if mul is not None:
            want = got
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-14)


def test_torch_compile_of_an_in_place_op_never_seen_eagerly_is_a_named_error(parity_ops):
    """Compiled on its very first call, a MarkDirty op's gradient cannot be right: the documented
    refusal, never a silently wrong gradient."""
    ops = opbuilder.to_torch(parity_ops)
    f = torch.compile(ops.scale_, backend="aot_eager")
    x = torch.tensor(X, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"scale_ writes its argument in place \(MarkDirty\), which a compiled "
                                           r"graph cannot express, and its first call was compiled"):
        f(x * 1).sum().backward()


def test_torch_compile_of_an_op_returning_one_tensor_twice_first_is_a_named_error(parity_ops):
    """The attack's case: a graph traced before any eager call took the two outputs for two tensors, and a
    write through one was not seen through the other (eager: one object). Now the documented refusal, then
    the op runs outside the graph, as eagerly."""
    ops = opbuilder.to_torch(parity_ops, shape_fn={"dup": lambda x: [opbuilder.Spec(x.shape, x.dtype)] * 2})

    def f(x):
        a, b = ops.dup(x)
        a.add_(1)
        return b * 1
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match=r"^dup returns one tensor as two of its outputs, which a compiled graph "
                                           r"cannot express .*its first call was compiled: torch.compile now leaves "
                                           r"it out of the graph"):
        torch.compile(f, backend="aot_eager")(torch.tensor(X))
    torch._dynamo.reset()
    np.testing.assert_allclose(torch.compile(f, backend="aot_eager")(torch.tensor(X)).numpy(), 2 * X + 1)
    np.testing.assert_allclose(f(torch.tensor(X)).numpy(), 2 * X + 1)


def test_torch_compile_of_a_view_returning_op_first_names_the_view(parity_ops):
    """Its error said "returns its argument unchanged" for an op that returns a view of it."""
    ops = opbuilder.to_torch(parity_ops, shape_fn={"head": lambda x: opbuilder.Spec((2,), x.dtype)})
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match=r"^head returns a view of its argument, which a compiled graph cannot "
                                           r"express"):
        torch.compile(lambda x: ops.head(x) * 1, backend="aot_eager")(torch.tensor(X))
    torch._dynamo.reset()


def test_torch_compile_keeps_an_in_place_call_whose_result_is_unused(parity_ops):
    """A first compiled call whose result is unused is not dropped as dead code (its write would be lost
    silently, in that call and every later run of the graph): it runs and is refused by name; the next
    call leaves the graph and writes as eager does."""
    ops = opbuilder.to_torch(parity_ops)

    def f(x):
        ops.scale_(x)
        return x.sum()
    g = torch.compile(f, backend="aot_eager")
    x = torch.tensor(X)
    with pytest.raises(RuntimeError, match=r"^scale_ writes its argument in place \(MarkDirty\), which a "
                                           r"compiled graph cannot express, and its first call was compiled"):
        g(x)
    torch.testing.assert_close(x, torch.tensor(X * 3))  # the refused call had written, as the error says
    torch.testing.assert_close(g(x), torch.tensor(X * 9).sum())
    torch.testing.assert_close(x, torch.tensor(X * 9))


class _TorchAddSq(torch.autograd.Function):
    """parity_ops' add_sq_ as torch's own Function: x += y * y in place (mark_dirty), y saved."""

    @staticmethod
    def forward(ctx, x, y):
        sq = y * y
        ctx.mark_dirty(x)
        ctx.save_for_backward(y)
        return x.add_(sq)

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g, 2.0 * g * y


def _add_sq_one_tensor_twice(side, add_sq, written_after):
    """add_sq_(h, h): the saved argument is the written one. torch saves the tensor as the write left it
    (one object: the Function's output), so the gradient reads the new values, with no error; a write
    into it after the call is refused at backward."""
    x = side.leaf(X)
    h = x * 1
    out = add_sq(h, h)
    loss = (out * side.const(W)).sum()
    if not written_after:
        return side.value(out), side.grads(loss, [x])
    with side.no_grad():
        side.mul_inplace(h, 10.0)
    with pytest.raises(RuntimeError, match=STALE):
        side.grads(loss, [x])
    return side.value(out), []


@pytest.mark.parametrize("written_after", [False, True])
def test_in_place_op_given_one_tensor_twice_runtime_routes(parity_ops, written_after):
    """Eagerly and under runtime.jit (its tracing call, then a replay): torch's Function's values and
    gradient, or its refusal of a later write."""
    want = _add_sq_one_tensor_twice(_TorchSide(None), _TorchAddSq.apply, written_after)
    side = _RuntimeSide(parity_ops)
    _same(_add_sq_one_tensor_twice(side, parity_ops.add_sq_, written_after), want)
    jitted = rt.jit(parity_ops.add_sq_)
    for _ in range(2):
        _same(_add_sq_one_tensor_twice(side, jitted, written_after), want)


@pytest.mark.parametrize("written_after", [False, True])
def test_in_place_op_given_one_tensor_twice_torch_routes(parity_ops, torch_route, written_after):
    """Every call of the signature (the registered operator, the eager Function, the bridge where on):
    torch's Function's values and gradient. The Python path gave each position a runtime tensor of its
    own, so the saved one was not the written one, and it raised a version error where torch raises none."""
    want = _add_sq_one_tensor_twice(_TorchSide(None), _TorchAddSq.apply, written_after)
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        _same(_add_sq_one_tensor_twice(_TorchSide(ops), ops.add_sq_, written_after), want)


def test_a_returned_argument_written_after_it_is_gone_fails_the_saved_argument_check(parity_ops):
    """mul_ret_x saves x and returns it as it came; given as a numpy array, x has no runtime.Tensor of its
    own, so the returned alias's counter is the only record of a write into it. af45905 dropped that
    counter once the alias was gone: the write (an optimizer-like step under no_grad) went unseen and the
    gradient of w read the new x ([11, 12, 13] where x was [1, 2, 3]), silently."""
    import gc
    for op, name in ((parity_ops.mul_ret_x, "ParityMulRetX"), (parity_ops.mul_ret_head, "ParityMulRetHead")):
        x = np.array([1.0, 2.0, 3.0])  # mul_ret_head returns x[:2], a view Forward built: until fa82e3f
        w = Tensor(np.array([0.5, -1.0, 2.0]), requires_grad=True)  # unseen, kept or dropped
        y, xo = op(x, w)
        with rt.no_grad():
            xo += 10.0
        del xo
        gc.collect()
        with pytest.raises(RuntimeError, match=rf"^one of the tensors saved for backward by {name} \(saved "
                                               r"slot 0\) has been modified by an in-place operation"):
            rt.autograd.grad([y], [w], [Tensor(np.ones(3))])


def _add_sq_two_views(side, add_sq):
    """add_sq_(v1, v2) with v1, v2 two view objects of the same strided elements of a non-leaf."""
    x = side.leaf(np.concatenate([X, Y]))
    h = x * 1
    v1, v2 = h[::2], h[::2]
    out = add_sq(v1, v2)
    return side.value(out), side.grads((out * side.const(W)).sum(), [x])


def test_in_place_op_given_two_views_of_the_same_elements(parity_ops):
    """Two view objects of one strided memory, both requiring grad: the write through the first is what the
    second reads and saves, as in torch. d1c1740 gave each its own private copy (to split two leaves'
    gradients), so the saved copy held the old values: a gradient of those, silently (runtime eager, jit).
    Such positions get Tensors of their own over one copy's memory."""
    _add_sq_dense_runs(parity_ops, _add_sq_two_views, _add_sq_two_views(_TorchSide(None), _TorchAddSq.apply))


def _add_sq_dense_runs(parity_ops, case, want):
    """``case`` with add_sq_dense_ on runtime eager and runtime.jit (trace, replay) against ``want``."""
    side = _RuntimeSide(parity_ops)
    _same(case(side, parity_ops.add_sq_dense_), want)
    jitted = rt.jit(parity_ops.add_sq_dense_)
    for _ in range(2):
        _same(case(side, jitted), want)


_ALIAS_PAIRS = {  # two arguments over the same elements: the op writes the first, a later read goes through the second
    "two strided views": lambda h: (h[::2], h[::2]),
    "base and a view of it": lambda h: (h, h[:]),
    "a view and its base": lambda h: (h[:], h),
}
_WRITERS = {  # name: (how to_torch's op is called with (written, other), torch's own op)
    "add_sq_dense_": (lambda ops: ops.add_sq_dense_, _TorchAddSq.apply),  # returns the written one, saves the other
    "scale_second_void": (lambda ops: lambda a, b: ops.scale_second_void(b, a), lambda a, b: a.mul_(3.0)),
}


def _written_read_through_the_other(call, pair):
    x = torch.tensor(np.concatenate([X, Y]), requires_grad=True)
    h = x * 1
    first, second = _ALIAS_PAIRS[pair](h)
    call(first, second)
    loss = (second * torch.tensor(np.concatenate([W, W2])[: second.numel()])).sum()
    return second.detach().numpy().copy(), torch.autograd.grad(loss, [x])[0].numpy(), h._version


@pytest.mark.parametrize("writer", sorted(_WRITERS))
@pytest.mark.parametrize("pair", sorted(_ALIAS_PAIRS))
def test_a_write_through_one_argument_is_in_the_history_of_another_over_it(parity_ops, torch_route, pair, writer):
    """op(a, b), a and b over the same elements, a written, then a loss through b: b's gradient goes
    through the write, as torch's (it rebuilds b's grad_fn from the base's new history). The bridge took
    b's edge after the write had moved the version, which rebuilt b's grad_fn from the history before the
    write and marked it current: the write's share was dropped, silently (1x W where torch gives 3x). The
    Python path refuses an op that saved b (its version check), as it does for a later Function reading
    b (test below), where it cannot give b the write's history. One write counts once (torch's reference
    writes with add_, then mark_dirty: two)."""
    ours, theirs = _WRITERS[writer]
    want = _written_read_through_the_other(theirs, pair)
    ops = opbuilder.to_torch(parity_ops)

    def check(got):
        np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-12)
        assert got[2] == 1
    _python_path_refuses_saving_the_other(torch_route, writer == "add_sq_dense_",
                                          lambda: _written_read_through_the_other(ours(ops), pair), check)


def _python_path_refuses_saving_the_other(torch_route, refused, run, check):
    """``run()`` three times: the bridge's calls (2+) give torch's results; the Python path (every call with
    the bridge off, the first with it on) refuses at backward when ``refused`` (a Function saved the other
    tensor over the written memory: the runtime's version check sees it saved before torch counted the
    write; routes.md, Left), else gives them too."""
    for call in range(3):
        if refused and (call == 0 or torch_route == "registered"):
            with pytest.raises(RuntimeError, match=STALE):
                run()
        else:
            check(run())


def _over_one_memory(fn, pairs, pair):
    """fn(a, b), (a, b) = pairs[pair](h) for h = x * 1: the result's values, x's gradient of a weighted sum."""
    x = torch.tensor(np.concatenate([X, Y]), requires_grad=True)
    h = x * 1
    first, second = pairs[pair](h)
    out = fn(first, second)
    loss = (out * torch.tensor(np.concatenate([W, W2])[: out.numel()])).sum()
    return out.detach().numpy().copy(), torch.autograd.grad(loss, [x])[0].numpy()


@pytest.mark.parametrize("pair", sorted(_ALIAS_PAIRS))
def test_a_write_by_one_function_is_in_what_a_later_one_reads_over_the_same_elements(parity_ops, torch_route,
                                                                                      pair):
    """scale_then_mul(a, b) (Mul(Scale(a), b)), a and b over the same elements: on the bridge Mul reads b
    as the write left it, and b's gradient goes through the write, as torch's. The Python path has one
    runtime leaf per torch tensor, so b there has no history through the write: it must refuse at
    backward (its version check), never give a gradient. 09bb863 made that check pass: 2x where torch
    gives 6x, silently; 71bd8c2 merged such tensors, which merged distinct histories (two leaves over one
    memory: one gradient for both)."""
    want = _over_one_memory(lambda a, b: a.mul_(3.0) * b, _ALIAS_PAIRS, pair)
    ops = opbuilder.to_torch(parity_ops)

    def check(got):
        np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-12)
    _python_path_refuses_saving_the_other(torch_route, True,
                                          lambda: _over_one_memory(ops.scale_then_mul, _ALIAS_PAIRS, pair), check)


_OVER_PAIRS = {  # a written first argument, a second one over (some of) its memory
    "the same elements": lambda h: (h[::2], h[::2]),
    "a head and its base": lambda h: (h[:4], h),
    "a base and its head": lambda h: (h, h[:4]),
}


@pytest.mark.parametrize("pair", sorted(_OVER_PAIRS))
def test_an_argument_returned_as_it_came_after_a_write_over_its_memory(parity_ops, torch_route, pair):
    """scale_then_other(a, b): Scale writes a, the function returns b as it came, b over a's memory. The
    Python path made the returned view inside its torch Function, which torch refuses to use once its base
    is written ("Output 0 of _Eager is a view and its base ... has been modified inplace"), where torch's
    own `TScale.apply(a); return b` and the bridge give the gradient. It is made after the call now, in the
    caller's grad mode, as the bridge's."""
    want = _over_one_memory(lambda a, b: (a.mul_(3.0), b)[1], _OVER_PAIRS, pair)
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        got = _over_one_memory(ops.scale_then_other, _OVER_PAIRS, pair)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-12)


def test_an_argument_returned_as_it_came_written_under_no_grad(parity_ops, torch_route):
    """just_x(x) (the function returns its argument), the result written under no_grad, then used: torch's
    `return x` takes it (the write is not differentiated). The Python path refused it (a view made inside
    its torch Function, written), the bridge took it."""
    ops = opbuilder.to_torch(parity_ops)
    for fn in [lambda x: x] + [ops.just_x] * 3:
        x0 = torch.tensor(X, requires_grad=True)
        x = x0 * 1
        r = fn(x)
        with torch.no_grad():
            r.mul_(2.0)
        (g,) = torch.autograd.grad((r * torch.tensor(W)).sum(), x0)
        np.testing.assert_allclose(g.numpy(), W, rtol=1e-12)
        assert x._version == 1


@pytest.mark.parametrize("second", ["detach().requires_grad_()", "a leaf over the same array"])
def test_two_leaves_over_one_memory_keep_a_gradient_each_torch_routes(parity_ops, torch_route, second):
    """mul(p, q), q a second leaf over p's memory: each gets its own gradient (q and p), as torch's p * q.
    71bd8c2 made one runtime tensor of two torch tensors over the same elements, whatever their histories:
    p got 2x, q none, silently with .backward() (an attack on it)."""
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        arr = X.copy()
        p = torch.from_numpy(arr).requires_grad_()
        q = p.detach().requires_grad_() if second.startswith("detach") else torch.from_numpy(arr).requires_grad_()
        gp, gq = torch.autograd.grad((ops.mul(p, q) * torch.tensor(W)).sum(), [p, q])
        np.testing.assert_allclose(gp.numpy(), X * W, rtol=1e-12)
        np.testing.assert_allclose(gq.numpy(), X * W, rtol=1e-12)


def _add_into_a_view(add_into, view):
    w, v = torch.tensor(np.concatenate([X, Y]), requires_grad=True), torch.tensor(Y, requires_grad=True)
    h = w * 1
    x = VIEWS8[view](h)
    out = add_into(v * 1, x)
    assert out is x
    loss = (h * torch.tensor(np.concatenate([W, W2]))).sum() + (out * torch.tensor(W2)).sum()
    return (h.detach().numpy().copy(), *(g.numpy() for g in torch.autograd.grad(loss, [w, v])), h._version)


VIEWS8 = {"slice": lambda h: h[2:6], "step": lambda h: h[::2]}  # 4-element views of an 8-element base


@pytest.mark.parametrize("view", sorted(VIEWS8))
def test_a_view_written_at_its_second_argument_and_returned(parity_ops, torch_route, view):
    """add_into_(y, x), x a view, written in place and returned: torch's CopySlices takes the node's first
    input for the view's gradient and its first edge for the base's, but x is the second. Both to_torch
    routes gave y's gradient to the view and none to y, silently (w: 2x W2 where torch's x.add_(y) gives
    1x; y: None). The bridge puts a written view's edge first; the Python path gives it its history
    through _Rebase (the view first). torch's own Function gets it wrong the same way: the reference is
    torch's in-place op."""
    want = _add_into_a_view(lambda y, x: x.add_(y), view)
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        got = _add_into_a_view(ops.add_into_, view)
        for a, b in zip(got[:3], want[:3]):
            np.testing.assert_allclose(a, b, rtol=1e-12)
        assert got[3] == want[3] == 1

def test_two_leaves_over_one_read_only_buffer_keep_a_gradient_each(parity_ops):
    """mul_dense (no kAcceptsViews) given two leaves over one read-only array gets a private copy of each.
    2f55c59 (and b0a0c90 for two positions) gave the same elements one copy, bound to the first leaf: the
    second leaf got both gradients, the first none, silently. Copies are shared only by one caller's tensor,
    or by tensors that do not require grad."""
    buf = np.array([1.0, 2.0, 3.0])
    buf.flags.writeable = False
    a, b = rt.from_numpy(buf).requires_grad_(True), rt.from_numpy(buf).requires_grad_(True)
    ga, gb = rt.autograd.grad([parity_ops.mul_dense(a, b)], [a, b], [Tensor(np.ones(3))])
    np.testing.assert_allclose(ga.asnumpy(), buf)
    np.testing.assert_allclose(gb.asnumpy(), buf)


def _torch_mean_sq_positives(xa):
    x = torch.tensor(xa, requires_grad=True)
    v = (x[x > 0] ** 2).mean()
    v.backward()
    return v.item(), x.grad.numpy()


def test_jit_replay_of_an_op_whose_output_shape_depends_on_its_values(parity_ops):
    """positives(x) keeps x's positive elements: traced with one, a replay with three returned three, and the
    graph (its mean, its backward) was built for one: the gradient 3x where torch gives 2x / 3 (or a C++
    Backward given a gradient of the traced shape read past it), silently, on 7afd772. Each replay now
    checks an opaque op's shapes: the signature runs eagerly from then on, this call too."""
    jf = rt.jit(lambda x: rt.ops.mean(parity_ops.positives(x) ** 2))
    for xa in ([1.0, -2.0, -3.0], [1.0, -2.0, -3.0], [1.0, 2.0, 3.0], [-1.0, 2.0, -3.0], [4.0, 2.0, 3.0]):
        want_v, want_g = _torch_mean_sq_positives(np.array(xa))
        if xa == [1.0, 2.0, 3.0]:
            with pytest.warns(RuntimeWarning, match=r"positives returned shapes \[\(3,\)\] where its trace "
                                                    r"returned \[\(1,\)\]: its output shapes depend on its "
                                                    r"values, which a traced graph cannot follow; this "
                                                    r"signature runs eagerly from now on, .*; this call runs "
                                                    r"again eagerly, so its ops up to positives run twice"):
                v, g = rt.value_and_grad(jf)(Tensor(np.array(xa)))
        else:
            v, g = rt.value_and_grad(jf)(Tensor(np.array(xa)))
        np.testing.assert_allclose(float(v.asnumpy()), want_v, rtol=1e-12)
        np.testing.assert_allclose(g.asnumpy(), want_g, rtol=1e-12)
    plain = rt.jit(lambda x: parity_ops.positives(x) * 2)  # no gradient recorded: the same check
    np.testing.assert_allclose(plain(Tensor(np.array([1.0, -2.0]))).asnumpy(), [2.0])
    with pytest.warns(RuntimeWarning, match="runs eagerly from now on"):
        np.testing.assert_allclose(plain(Tensor(np.array([1.0, 2.0]))).asnumpy(), [2.0, 4.0])


def test_jit_replay_of_a_writing_trace_whose_op_changes_shape_is_refused_once(parity_ops):
    """A trace that writes its input in place cannot run the call again eagerly (the write would be done
    twice): the replay whose shapes changed is a named error, its ops up to that op having run once; the
    next call runs eagerly."""
    def f(x):
        parity_ops.scale_(x)
        return parity_ops.positives(x)

    jf = rt.jit(f)
    x = Tensor(np.array([1.0, -2.0]))
    np.testing.assert_allclose(jf(x).asnumpy(), [3.0])
    x = Tensor(np.array([1.0, 2.0]))
    with pytest.raises(RuntimeError, match=r"^jit\(.*\): positives returned shapes \[\(2,\)\] where its trace "
                                           r"returned \[\(1,\)\]: .*; its trace writes in place \(scale_ wrote "
                                           r"an input \(its argument 0\) in place\), so this call, whose ops up "
                                           r"to positives ran once, is not run again: this signature runs eagerly "
                                           r"from its next call$"):
        jf(x)
    np.testing.assert_allclose(x.asnumpy(), [3.0, 6.0])  # scale_ ran once
    x = Tensor(np.array([1.0, 2.0]))
    np.testing.assert_allclose(jf(x).asnumpy(), [3.0, 6.0])


def test_to_jax_without_a_shape_rule_takes_an_op_that_refuses_zeros(parity_ops):
    """recip refuses a zero element. Without a shape rule to_jax learns its output shapes from one run on
    zeros, which raised: on c22806d every call, on valid values too, raised recip's own error, with nothing
    saying it came from that run. A run on zeros that raises is tried again on positive stand-ins."""
    jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'opbuilder[jax]')")
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        xa = np.array([1.0, 2.0, 4.0])
        x = jax.numpy.asarray(xa)
        for ffi in (True, False):
            j = opbuilder.to_jax(parity_ops, ffi=ffi)
            np.testing.assert_allclose(np.asarray(j.recip(x)), 1.0 / xa, rtol=1e-12)
            np.testing.assert_allclose(np.asarray(jax.jit(j.recip)(x)), 1.0 / xa, rtol=1e-12)
            g = jax.jit(jax.grad(lambda a: j.recip(a).sum()))(x)
            np.testing.assert_allclose(np.asarray(g), -1.0 / xa ** 2, rtol=1e-12)
            # a zero of the caller's: recip's error (through XLA's runtime error on a custom call)
            with pytest.raises((ValueError, jax.errors.JaxRuntimeError), match="recip: a zero element"):
                j.recip(jax.numpy.asarray(np.array([1.0, 0.0])))
            # refused on every stand-in (float32: recip takes float64): its error, noting those runs made it
            with pytest.raises(ValueError, match=r"^recip: expected float64") as info:
                j.recip(jax.numpy.asarray(np.array([1.0, 2.0], np.float32)))
            assert info.value.__notes__[:1] == [  # (JAX adds a note of its own after it)
                "to_jax ran recip on zeros and on other stand-in values of its input shapes to learn its output "
                "shapes (it has no shape rule), and each run raised; this is the run on zeros' error. If the "
                "values you pass are valid for it, a shape_fn for 'recip' saves these runs"]
    finally:
        jax.config.update("jax_enable_x64", old)


def _no_grad_double(h):
    with rt.no_grad():
        h *= 2


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("exp", ["builtin", "cpp", "python"])
@pytest.mark.parametrize("write", ["cpp_mark_dirty", "no_grad"])
def test_a_saved_output_written_after_its_tensor_is_gone_fails_its_version_check(parity_ops, exp, write, jit):
    """exp saves its output; the loss writes it in place (a MarkDirty op, or *= under no_grad) and drops it
    (a local): torch refuses the backward ("modified by an inplace operation"). On 7afd772 the runtime
    checked the output's version through a weak reference only, so once the tensor object was gone the
    backward read the written values: 4 exp(x) where the write was x 2, silently, for every kind of node;
    through runtime.jit (its call's node watches the outputs it hands out) until 60da065."""
    from test_autograd_py_function import Exp  # exp(x) as a Python Function that saves its output

    fn = {"builtin": rt.ops.exp, "cpp": parity_ops.exp_saved, "python": Exp.apply}[exp]
    if jit:
        fn = rt.jit(fn)
    wr = {"cpp_mark_dirty": parity_ops.scale_, "no_grad": _no_grad_double}[write]

    def loss(x):
        h = fn(x)
        wr(h)
        return rt.ops.sum(h)

    def torch_loss(x):
        h = torch.exp(x)
        with torch.no_grad():
            h.mul_(2)
        return h.sum()

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch_loss(torch.tensor(X, requires_grad=True)).backward()
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        rt.grad(loss)(Tensor(X))
    x = Tensor(X, requires_grad=True)  # the same with the output alive at backward (refused before too)
    h = fn(x)
    wr(h)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        rt.ops.sum(h).backward()


def _add_sq_strided_view_twice(side, add_sq):
    """add_sq_(v, v) with v a strided view (every other element of a non-leaf): an op without kAcceptsViews
    gets a private contiguous copy of v; one copy for both positions, so what it saves is what it wrote."""
    x = side.leaf(np.concatenate([X, Y]))
    v = (x * 1)[::2]
    out = add_sq(v, v)
    return side.value(out), side.grads((out * side.const(W)).sum(), [x])


def test_in_place_op_given_one_strided_view_twice(parity_ops, torch_route):
    """Runtime eager, runtime.jit and both torch routes give torch's Function's value and gradient. On
    4949359 each position got its own private copy: the saved one held the old values, and every route
    gave the gradient of those, silently."""
    want = _add_sq_strided_view_twice(_TorchSide(None), _TorchAddSq.apply)
    _add_sq_dense_runs(parity_ops, _add_sq_strided_view_twice, want)
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        _same(_add_sq_strided_view_twice(_TorchSide(ops), ops.add_sq_dense_), want)


def _bump_add_strided_view_in_a_list(side, bump_add, lists):
    """bump_add_(v, [v]) and bump_add_(v, [w, v, v]) with v, w strided views of a buffer: x += 1, then x += y
    for each listed y. An op without kAcceptsViews gets private copies; the same elements positional and
    listed are one copy, so each y read after the first write sees it (torch's order: one memory)."""
    buf = side.leaf(np.arange(12.0), grad=False)
    v, w = buf[::2], buf[1::2]
    got = []
    for ys in lists(v, w):
        out = bump_add(v, ys)
        got.append(side.value(out))
    return got + [side.value(buf)]


def _torch_bump_add(x, ys):
    x.add_(1.0)
    for y in ys:
        x.add_(y)
    return x


def test_in_place_op_given_one_strided_view_positional_and_in_a_list(parity_ops, torch_route):
    """Runtime eager, runtime.jit and both torch routes give torch's values. On 1ff5453 the list's element
    was a second private copy holding the old values: bump_add_(v, [v]) gave 2v + 1 where torch gives
    2v + 2, silently."""
    def lists(v, w):
        return [[v], [w, v, v]]

    want = (None, _bump_add_strided_view_in_a_list(_TorchSide(None), _torch_bump_add, lists))
    _bump_add_runs(parity_ops, lists, want)


def test_in_place_op_given_one_strided_column_two_ways(parity_ops, torch_route):
    """v[:, None] and v.reshape(6, 1) are the same elements in the same order; only the stride of their
    size-1 dimension differs (numpy: 0 against 16 bytes). On 58793ef they got two private copies, and
    bump_add_(v[:, None], [v.reshape(6, 1)]) gave 2v + 1 where torch gives 2v + 2, silently."""
    def lists(v, w):
        return [[v.reshape(6, 1)]]

    def column(add):
        return lambda v, ys: add(v[:, None], ys)

    want = (None, _bump_add_strided_view_in_a_list(_TorchSide(None), column(_torch_bump_add), lists))
    _bump_add_runs(parity_ops, lists, want, column)


def _bump_add_runs(parity_ops, lists, want, wrap=lambda add: add):
    """bump_add_dense_ (through ``wrap``) on runtime eager, runtime.jit (trace, replay) and to_torch (three
    calls) against ``want``."""
    side = _RuntimeSide(parity_ops)
    _same((None, _bump_add_strided_view_in_a_list(side, wrap(parity_ops.bump_add_dense_), lists)), want)
    jitted = wrap(rt.jit(parity_ops.bump_add_dense_))
    for _ in range(2):
        _same((None, _bump_add_strided_view_in_a_list(side, jitted, lists)), want)
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        _same((None, _bump_add_strided_view_in_a_list(_TorchSide(ops), wrap(ops.bump_add_dense_), lists)), want)


def test_argument_returned_as_it_came_keeps_its_history_torch_routes(parity_ops, torch_route):
    """A module function returning its argument itself (no Function around it) gives the caller's tensor
    itself on every call, as torch's `return x`: its history (the gradient through it), its version counter
    (a write through it is torch's write into the argument). On 1ff5453 the bridge (calls 2+) gave a new
    tensor over the memory:
    the gradient through it was dropped silently (x0.grad 2x W where torch gives 2x W + V), and a write
    through it went unseen by a tensor torch saved from the argument."""
    ops = opbuilder.to_torch(parity_ops)
    w, v = torch.tensor(W), torch.tensor(X[::-1].copy())
    for _ in range(3):
        x0 = torch.tensor(X, requires_grad=True)
        x = x0 * 1
        y, xr = ops.sq_and_x(x)
        assert xr is x  # as torch's `return x`
        (g,) = torch.autograd.grad((y * w).sum() + (xr * v).sum(), x0, retain_graph=True)
        np.testing.assert_allclose(g.numpy(), 2 * X * W + X[::-1], rtol=1e-12)
        (g,) = torch.autograd.grad((ops.just_x(x) * w).sum(), x0)
        np.testing.assert_allclose(g.numpy(), W, rtol=1e-12)
    for _ in range(3):  # a write through the returned tensor is a write into the argument: torch refuses
        x = torch.tensor(X)  # the gradient of a product that saved it
        wg = torch.tensor(W, requires_grad=True)
        z = x * wg
        with torch.no_grad():
            ops.just_x(x).mul_(10.0)
        assert x._version == 1
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            z.sum().backward()



@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_an_argument_returned_under_no_grad_is_the_argument(parity_ops, torch_route, mode):
    """just_x(x) under no_grad or inference_mode gives x itself, as torch's `return x`: its history, so a
    loss through it reaches x0. Both routes gave a view made in that mode, which has none: x0.grad stayed
    None, silently (an attack on 63af991)."""
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        x0 = torch.tensor(X, requires_grad=True)
        x = x0 * 1
        with getattr(torch, mode)():
            r = ops.just_x(x)
        assert r is x
        (r * torch.tensor(W)).sum().backward()
        np.testing.assert_allclose(x0.grad.numpy(), W, rtol=1e-12)


def test_an_argument_returned_under_a_dispatch_mode_is_the_argument(parity_ops, torch_route):
    """Under a TorchDispatchMode, a call recording no torch node returned the view the registered op's kernel
    made below autograd: x's memory with a counter of its own, so a write through it went unseen by a
    product that saved x (a wrong gradient where torch raises). It is x itself now, and x_twice gives one
    object twice."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Forwarding(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        x = torch.tensor(X)
        w = torch.ones(4, dtype=torch.float64, requires_grad=True)
        z = x * w
        with Forwarding():
            r = ops.just_x(x)
            a, b = ops.x_twice(x)
        assert r is x and a is x and b is x
        r.mul_(10.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            z.sum().backward()


@pytest.mark.parametrize("kind", ["inference", "conjugate"])
def test_an_argument_given_as_a_copy_is_returned_itself(parity_ops, torch_route, kind):
    """An inference tensor outside inference mode and a conjugate view reach the op as private copies; the
    function returning the argument gave a new tensor over that copy, which a write changed unseen (torch's
    `return x` refuses the inference tensor's write, and writes through the conjugate view)."""
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        x = _copied_argument(kind)
        assert ops.just_x(x) is x


def _copied_argument(kind):
    """A tensor an op gets as a private copy: an inference tensor outside inference mode, a conjugate view."""
    if kind == "inference":
        with torch.inference_mode():
            return torch.tensor(X)
    return torch.tensor(X + 1j * Y).conj()


def _head_of(fn, grad_mode):
    """fn(x) under ``grad_mode``, then a loss through it and a write through it after a product saved x:
    what torch's x[:2] gives (its base, counter, grad requirement, gradient, the product's version error)."""
    x0 = torch.tensor(X, requires_grad=True)
    x = x0 * 1
    with getattr(torch, grad_mode)():
        r = fn(x)
    got = [r._base is x, r._version == x._version, r.requires_grad]
    try:  # (under no_grad torch's view requires grad, with no history to x0: its "not used" error)
        got.append(torch.autograd.grad((r * torch.tensor(W[:2])).sum(), x0)[0].numpy().tolist())
    except RuntimeError as e:
        got.append(str(e))
    p = x * x
    with torch.no_grad():
        r.mul_(10.0)
    got.append(x._version)
    try:
        p.sum().backward()
    except RuntimeError as e:
        got.append("modified by an inplace operation" in str(e))
    return got


@pytest.mark.parametrize("grad_mode", ["enable_grad", "no_grad"])
def test_a_tensor_the_function_built_over_its_argument_is_a_view_of_it(parity_ops, torch_route, grad_mode):
    """head_alias(x) returns a Tensor it built on x->storage() (no Function): torch's view of x, as its x[:2]
    (its counter, its base, its history). Both routes gave a tensor with a counter and history of its own:
    a write through it went unseen by a product that saved x (a wrong gradient where torch raises), and a
    loss through it did not reach x0 (an attack on e5ef7e3)."""
    want = _head_of(lambda x: x[:2], grad_mode)
    assert want[0] and want[-1] is True  # (a view; the write through it refused the product's backward)
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        assert _head_of(ops.head_alias, grad_mode) == want


def _over_memory(fn):
    """fn(x, y) with x = a.detach() and y = a * 1 (one storage, only y with a history to a): its values,
    whether it requires grad, a's gradient of a weighted sum, y's version."""
    a = torch.tensor(X, requires_grad=True)
    y = a * 1
    x = y.detach()
    r = fn(x, y)
    g = torch.autograd.grad((r * torch.tensor(W[: r.numel()])).sum() + y.sum(), a)[0]
    return r.detach().numpy().tolist(), r.requires_grad, g.numpy().tolist(), y._version


_OVER_MEMORY = {  # to_torch's op (x, y) -> torch's equivalent
    "second_mid": (lambda x, y: y[1:3]),  # over y's storage, which x shares: a view of y, not of x
    "reversed_alias": (lambda x, y: y.flip(0)),  # negative strides: torch's flip (a copy, its gradient to y)
    "scale_then_head": (lambda x, y: y.mul_(3.0)[:2]),  # over an argument the call wrote: its view after
}


@pytest.mark.parametrize("name", sorted(_OVER_MEMORY))
def test_a_tensor_built_over_an_argument_follows_that_argument(parity_ops, torch_route, name):
    """Tensors a module function builds over an argument's memory (no Function), against torch's
    equivalents. An attack on 2b9920c: the Python path viewed the first argument over the storage (x, a
    detached alias) instead of y, whose memory it is; a negative-stride one raised as_strided's error there
    and had no history on the bridge; one over an argument the call wrote was a detached tensor."""
    ops = opbuilder.to_torch(parity_ops)
    fn = getattr(ops, name)
    theirs = _OVER_MEMORY[name]
    want = _over_memory(theirs if name == "second_mid" else lambda x, y: theirs(x, y))
    for _ in range(3):
        got = _over_memory(fn if name == "second_mid" else lambda x, y: fn(y))
        assert got[:3] == want[:3] and got[3] == (1 if name == "scale_then_head" else 0)



@pytest.mark.parametrize("kind", ["inference", "conjugate"])
def test_a_tensor_built_over_an_argument_the_op_got_as_a_copy(parity_ops, torch_route, kind):
    """head_alias(x), x an inference tensor outside inference mode or a conjugate view: the op gets a private
    copy, and its Tensor over the copy is a tensor of its own with the copy's values. 801bf2c took the copy
    for the argument and raised torch's "invalid storage offset" on every call (a review)."""
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        x = _copied_argument(kind)
        np.testing.assert_array_equal(ops.head_alias(x).numpy(), x[:2].resolve_conj().numpy())


def test_a_dispatch_mode_calling_the_op_on_other_tensors_gets_its_own_result(parity_ops, torch_route):
    """A dispatch mode that calls just_x on a clone: the call returns what the mode returned (the clone), not
    the caller's tensor; 801bf2c handed back the caller's for any registered call that returned an argument
    (a review)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Cloning(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
            return func(*args, **(kwargs or {}))
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        x = torch.tensor(X)
        with Cloning():
            r = ops.just_x(x)
        assert r is not x and r.data_ptr() != x.data_ptr()
        np.testing.assert_array_equal(r.numpy(), X)

def test_torch_func_refuses_a_tensor_built_over_an_argument_on_every_call(parity_ops):
    """torch.func.grad over head_alias (a view of its argument): the named refusal on the signature's first
    call too, which gave a zero gradient silently (an attack on 2b9920c)."""
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(2):
        with pytest.raises(NotImplementedError, match=r"^head_alias: under torch\.func an operator may not "
                                                      r"return its argument"):
            torch.func.grad(lambda y: (ops.head_alias(y) * torch.tensor(W[:2])).sum())(torch.tensor(X))


def test_a_view_written_at_its_second_argument_on_the_other_routes(parity_ops):
    """add_into_(y, x), x a view of a non-leaf, on runtime eager, runtime.jit (trace and replay) and
    torch.compile (aot_eager): the same values and gradients as torch's x.add_(y)."""
    wa, wb = np.concatenate([W, W2]), np.concatenate([W2, W])

    def run_torch(fn):
        w, v = torch.tensor(np.concatenate([X, Y]), requires_grad=True), torch.tensor(Y, requires_grad=True)
        out = fn(w, v)
        return [out.detach().numpy()] + [g.numpy() for g in torch.autograd.grad(out, [w, v])]

    def body(add_into):
        def f(w, v):
            h = w * 1
            add_into(v * 1, h[::2])
            return (h * torch.tensor(wa)).sum() + (h[::2] * torch.tensor(wb[:4])).sum()
        return f
    want = run_torch(body(lambda y, x: x.add_(y)))
    ops = opbuilder.to_torch(parity_ops)
    compiled = torch.compile(body(ops.add_into_), backend="aot_eager")
    for _ in range(2):
        for a, b in zip(run_torch(compiled), want):
            np.testing.assert_allclose(a, b, rtol=1e-12)

    def f_rt(w, v):
        h = w * 1
        parity_ops.add_into_(v * 1, h[::2])
        return (h * Tensor(wa)).sum() + (h[::2] * Tensor(wb[:4])).sum()
    for fn in [f_rt, rt.jit(f_rt), None]:
        fn = fn or jitted
        jitted = fn
        w, v = Tensor(np.concatenate([X, Y]), requires_grad=True), Tensor(Y.copy(), requires_grad=True)
        out = fn(w, v)
        out.backward()
        for a, b in zip([out.asnumpy(), w.grad.asnumpy(), v.grad.asnumpy()], want):
            np.testing.assert_allclose(a, b, rtol=1e-12)


@pytest.mark.parametrize("name", ["just_x", "head_alias"])
def test_an_argument_or_a_view_of_it_returned_under_torch_compile(parity_ops, name):
    """just_x (the argument itself) and head_alias (a Tensor built on its memory) inside torch.compile
    (aot_eager; the call is left out of the graph): torch's `return x` and x[:2], values and gradients."""
    ops = opbuilder.to_torch(parity_ops)
    ref = {"just_x": lambda x: x, "head_alias": lambda x: x[:2]}[name]

    def body(fn):
        def f(x0):
            x = x0 * 1
            r = fn(x)
            return (r * torch.tensor(W[: r.numel()])).sum() + (x * x).sum()
        return f

    def run(f):
        x0 = torch.tensor(X, requires_grad=True)
        out = f(x0)
        return out.detach().numpy(), torch.autograd.grad(out, x0)[0].numpy()
    want = run(body(ref))
    compiled = torch.compile(body(getattr(ops, name)), backend="aot_eager")
    for _ in range(2):
        for a, b in zip(run(compiled), want):
            np.testing.assert_allclose(a, b, rtol=1e-12)

def _scale_then_x(side_grad, scale_then_x):
    """x written in place by scale_ (x *= 3) inside the function, which returns x itself: under no_grad,
    then written again with grad on (allowed for x; refused for a view made in no_grad), and with grad on."""
    w = torch.tensor(W)
    x0 = torch.tensor(X, requires_grad=True)
    x = x0 * 1
    with torch.no_grad():
        out = scale_then_x(x)
    assert out is x
    out.mul_(2.0)
    (g1,) = torch.autograd.grad((out * w).sum(), x0)
    x = x0 * 1
    out = scale_then_x(x)
    (g2,) = torch.autograd.grad((out * w).sum(), x0)
    return out.detach().numpy(), [g1.numpy(), g2.numpy()]


def test_non_reentrant_checkpoint_around_ops_torch_routes(parity_ops, torch_route):
    """torch.utils.checkpoint (use_reentrant=False) counts the tensors the forward and its recomputation
    save. On 991a33e, with the bridge loaded, a forward on the Python path (a signature's first call) and a
    recomputation on the bridge saved different counts: CheckpointError at backward, for every new
    signature. Under saved-tensor hooks every call now takes the Python path."""
    from torch.utils.checkpoint import checkpoint
    ops = opbuilder.to_torch(parity_ops)

    def block(mul, exp, a, b):
        return exp(mul(a, b)) * b

    for n in (3, 3, 5, 5, 7, 3):
        xa, ya = np.random.default_rng(n).standard_normal((2, n))
        grads = []
        for mul, exp in ((torch.mul, torch.exp), (ops.mul, ops.exp_saved)):
            x, y = (torch.tensor(a, requires_grad=True) for a in (xa, ya))
            checkpoint(block, mul, exp, x, y, use_reentrant=False).sum().backward()
            grads.append((x.grad.numpy(), y.grad.numpy()))
        for a, b in zip(*grads):
            np.testing.assert_allclose(b, a, rtol=1e-12)


def test_argument_written_then_returned_is_the_argument_torch_routes(parity_ops, torch_route):
    """A function whose Function writes its argument (MarkDirty) and that then returns that argument gives
    the caller's tensor itself on every call, as torch's x.mul_(3); return x does. On 991a33e the bridge
    (calls 2+) gave a view of it: one made under no_grad, so a later write with grad on was refused where
    torch (and the first call) allow it."""
    def torch_scale_then_x(x):
        return x.mul_(3.0)

    want = _scale_then_x(None, torch_scale_then_x)
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        _same(_scale_then_x(None, ops.scale_then_x), want)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_refuses_a_saved_argument_written_in_the_graph_after_the_call(parity_ops, backend):
    """mul saves y; the compiled function then writes y in place: torch's own multiply is refused (torch's
    version error, raised while the graph compiles), and so is the op. Its compiled node kept its arguments
    out of save_for_backward, unchecked, and the gradient silently read the new y. (torch.compile of a
    plain torch.autograd.Function gives that silent gradient too; torch eager refuses.) Caches off: a graph
    compiled before would come back from inductor's cache with the old node."""
    import torch._inductor.config as inductor_config
    ops = opbuilder.to_torch(parity_ops)
    ops.mul(torch.ones(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64))

    def f(mul):
        def g(x, y):
            z = mul(x, y)
            y.mul_(10.0)
            return z
        return g
    raised = []
    for mul in (lambda a, b: a * b, ops.mul):
        torch._dynamo.reset()
        x = torch.tensor(X, requires_grad=True)
        with inductor_config.patch(force_disable_caches=True), pytest.raises(RuntimeError, match=STALE) as e:
            (torch.compile(f(mul), backend=backend)(x, torch.tensor(Y)) * torch.tensor(W)).sum().backward()
        raised.append(type(e.value))
        assert x.grad is None
    assert raised[0] is raised[1]
    torch._dynamo.reset()


def _inner_write(side, fn, name, later_write):
    """A bound function whose inner Function writes an argument in place (MarkDirty) and does not return
    it (scale_then_mul: x *= 3, then x * y), or writes and returns an intermediate (mul_then_scale). torch's
    rule for the in-place write: the argument's history is the write's (a use after the call differentiates
    through it) and its version goes up once (what saved it before is refused at backward)."""
    x, y = side.leaf(X), side.leaf(Y)
    c = x * 1
    if later_write:  # c saved before the call, by a multiply
        s = c * c
        fn(c, y)
        with pytest.raises(RuntimeError, match=STALE):
            side.grads(s.sum(), [x])
        return None, []
    out = fn(c, y)
    used = out + c * side.const(W2) if name == "scale_then_mul" else out
    return side.value(used), side.grads((used * side.const(W)).sum(), [x, y])


_INNER_WRITE_TORCH = {"scale_then_mul": lambda x, y: x.mul_(3.0) * y,
                      "mul_then_scale": lambda x, y: (x * y).mul_(3.0)}


@pytest.mark.parametrize("name, later_write", [("scale_then_mul", False), ("scale_then_mul", True),
                                               ("mul_then_scale", False)])
def test_inner_in_place_write_torch_routes(parity_ops, torch_route, name, later_write):
    """Each call of the signature (the registered operator, then the eager Function or the bridge): torch's
    values, gradients (central differences agree: test_inner_in_place_write_numeric) and version error. On
    4949359 the Python path lost the argument's new history (a gradient without the write's factor), the
    registered path also its version bump (the stale saved tensor read silently), and the bridge raised
    AttributeError writing torch's `_version` for mul_then_scale."""
    want = _inner_write(_TorchSide(None), _INNER_WRITE_TORCH[name], name, later_write)
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        _same(_inner_write(_TorchSide(ops), getattr(ops, name), name, later_write), want)


@pytest.mark.parametrize("name", ["scale_then_mul", "mul_then_scale"])
def test_inner_in_place_write_runtime_and_version(parity_ops, torch_route, name):
    """The runtime's own route gives the same, and the written argument's torch version is torch's (one write)."""
    want = _inner_write(_TorchSide(None), _INNER_WRITE_TORCH[name], name, False)
    _same(_inner_write(_RuntimeSide(parity_ops), getattr(parity_ops, name), name, False), want)
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        c, ref = torch.tensor(X, requires_grad=True) * 1, torch.tensor(X, requires_grad=True) * 1
        getattr(ops, name)(c, torch.tensor(Y))
        _INNER_WRITE_TORCH[name](ref, torch.tensor(Y))
        assert c._version == ref._version


@pytest.mark.parametrize("warm", [False, True])
def test_inner_in_place_write_under_torch_func(parity_ops, torch_route, warm):
    """torch.func cannot take an operator that writes its argument: refused with a named error on its first
    call under the transform as on later ones (on 4949359 the first vmap call ran and later ones raised)."""
    ops = opbuilder.to_torch(parity_ops)
    if warm:
        ops.scale_then_mul(torch.tensor(X), torch.tensor(Y))
    msg = r"^scale_then_mul: under torch.func an operator may not return its argument .* nor write one"
    for _ in range(2):
        with pytest.raises(NotImplementedError, match=msg):
            torch.func.vmap(lambda r: ops.scale_then_mul(r, torch.tensor(Y)))(torch.ones(3, 4, dtype=torch.float64))
        with pytest.raises(NotImplementedError, match=msg):
            torch.func.grad(lambda a: ops.scale_then_mul(a * 1, torch.tensor(Y)).sum())(torch.tensor(X))


_PLAIN_RESULT_TORCH = {"scale_void": lambda x: (x.mul_(3.0), None)[1], "scale_num": lambda x: (x.mul_(3.0), 1.5)[1]}


def _plain_result_write(fn, torch_side, later_write):
    """A function with a plain result (None, a number) whose inner Function writes its argument: the write's
    version, history and stale-saved error, as torch's x.mul_(3)."""
    a = torch.tensor(X, requires_grad=True)
    x = a * 1
    s = x * x
    got = fn(x)
    if later_write:
        with pytest.raises(RuntimeError, match=STALE):
            s.sum().backward()
        return got, x._version, None
    ((x * torch.tensor(W)).sum()).backward()
    return got, x._version, a.grad.numpy()


@pytest.mark.parametrize("later_write", [False, True])
@pytest.mark.parametrize("name", ["scale_void", "scale_num"])
def test_inner_write_with_a_plain_result(parity_ops, torch_route, name, later_write):
    """On 4949359 the plain result left record() before the writes were settled: the version stayed, the
    history was the old one (a.grad without the factor 3) and the stale saved tensor was read silently,
    on every call of both routes."""
    want = _plain_result_write(_PLAIN_RESULT_TORCH[name], True, later_write)
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        got = _plain_result_write(getattr(ops, name), False, later_write)
        assert got[:2] == want[:2]
        if not later_write:
            np.testing.assert_allclose(got[2], want[2], rtol=1e-12)


def test_inner_writes_count_each(parity_ops, torch_route):
    """scale_twice_then_mul writes x twice: torch counts two versions (3d56469 counted one)."""
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        x, ref = torch.tensor(X, requires_grad=True) * 1, torch.tensor(X, requires_grad=True) * 1
        ops.scale_twice_then_mul(x, torch.tensor(Y))
        ref.mul_(3.0).mul_(3.0)
        assert x._version == ref._version == 2


def test_inner_write_makes_the_argument_require_grad(parity_ops, torch_route):
    """add_sq_then_mul on an x that does not require grad: x.add_(y * y) makes it depend on y, and the
    later multiply takes it so. From its second call the bridge lost that edge (y's gradient without it)."""
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        grads = []
        for fn in (lambda x, y: (x.add_(y * y), x * y)[1], ops.add_sq_then_mul):
            y = torch.tensor(Y, requires_grad=True)
            (fn(torch.tensor(X), y) * torch.tensor(W)).sum().backward()
            grads.append(y.grad.numpy())
        np.testing.assert_allclose(grads[1], grads[0], rtol=1e-12)


def test_inner_write_then_an_error(parity_ops, torch_route):
    """The write done, then the function raises: as torch's x.mul_(3) before an error, x keeps the write,
    one version, and the write's history (on 505e3e8 the old one: a.grad without the factor 3)."""
    ops = opbuilder.to_torch(parity_ops)
    got = []
    for fn in [lambda x: (x.mul_(3.0), (_ for _ in ()).throw(ValueError("scale_then_throw: after the write")))]\
            + [ops.scale_then_throw] * 3:
        a = torch.tensor(X, requires_grad=True)
        x = a * 1
        with pytest.raises(ValueError, match="^scale_then_throw: after the write$"):
            fn(x)
        (x * torch.tensor(W)).sum().backward()
        got.append((x.detach().numpy().copy(), x._version, a.grad.numpy()))
    for value, version, grad in got[1:]:
        np.testing.assert_allclose(value, got[0][0], rtol=1e-12)
        assert version == got[0][1] == 1
        np.testing.assert_allclose(grad, got[0][2], rtol=1e-12)


@pytest.mark.parametrize("name", ["scale_void", "scale_num"])
def test_inner_write_into_an_inference_tensor_with_a_plain_result(parity_ops, torch_route, name):
    """torch refuses x.mul_(3) on an inference tensor outside InferenceMode; the op got a copy, and with a
    plain result its write was dropped silently (505e3e8). Now refused by name, the tensor unchanged."""
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        with torch.inference_mode():
            x = torch.tensor(X)
        with pytest.raises(RuntimeError, match=f"^{name} modifies argument 0 in place \\(MarkDirty\\), but it is an "
                                               f"inference tensor"):
            getattr(ops, name)(x)
        np.testing.assert_array_equal(x.numpy(), X)


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_inner_write_into_a_view_passed_beside_its_base(parity_ops, torch_route, view):
    """scale_second_void(base, view) writes the view: torch allows it (base's change is that write). It was
    refused as an undeclared write into argument 0 after the data changed, and without grad counted
    base's version twice (505e3e8)."""
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        got = []
        for fn in (lambda a, b: b.mul_(3.0), ops.scale_second_void):
            leaf = torch.tensor(X, requires_grad=True)
            base = leaf * 1
            fn(base, VIEWS[view](base))
            (base * torch.tensor(W)).sum().backward()
            plain = torch.tensor(X)
            fn(plain, VIEWS[view](plain))
            got.append((base.detach().numpy().copy(), leaf.grad.numpy(), plain._version))
        np.testing.assert_allclose(got[1][0], got[0][0], rtol=1e-12)
        np.testing.assert_allclose(got[1][1], got[0][1], rtol=1e-12)
        assert got[1][2] == got[0][2] == 1


def test_inner_writes_into_two_views_of_one_base(parity_ops, torch_route):
    """scale_both_void(base[:2], base[2:]): torch's values, gradient and versions. torch lets a node that
    writes a view return nothing else, so one _Rebase for both raised torch's internal error after the data
    was written (1065a89)."""
    ops = opbuilder.to_torch(parity_ops)
    got = []
    for fn in [lambda a, b: (a.mul_(3.0), b.mul_(3.0))] + [ops.scale_both_void] * 3:
        w = torch.tensor(X, requires_grad=True)
        base = w * 1
        fn(base[:2], base[2:])
        (base * torch.tensor(W)).sum().backward()
        got.append((base.detach().numpy().copy(), w.grad.numpy(), base._version))
    for value, grad, version in got[1:]:
        np.testing.assert_allclose(value, got[0][0], rtol=1e-12)
        np.testing.assert_allclose(grad, got[0][1], rtol=1e-12)
        assert version == got[0][2] == 2


def test_inner_writes_one_into_a_view_one_reading_it(parity_ops, torch_route):
    """scale_then_add_sq_void(base[:2], y): x.mul_(3), then y.add_(x * x) reads the written x: each node
    takes the other argument as it was before either write (aliases), so y's gradient reaches w through
    the write into x, as torch's."""
    ops = opbuilder.to_torch(parity_ops)
    got = []
    for fn in [lambda x, y: (x.mul_(3.0), y.add_(x * x))] + [ops.scale_then_add_sq_void] * 3:
        w, v = torch.tensor(X, requires_grad=True), torch.tensor(Y[:2], requires_grad=True)
        base, y = w * 1, v * 1
        fn(base[:2], y)
        ((base * torch.tensor(W)).sum() + (y * torch.tensor(W2[:2])).sum()).backward()
        got.append((y.detach().numpy().copy(), w.grad.numpy(), v.grad.numpy()))
    for a, b in zip(got[1:], [got[0]] * 3):
        for p, q in zip(a, b):
            np.testing.assert_allclose(p, q, rtol=1e-12)


@pytest.mark.parametrize("warm", [False, True])
def test_plain_result_writer_under_torch_func(parity_ops, torch_route, warm):
    """scale_void under torch.func: refused by name, as a writer with a tensor result is (1065a89 ran it:
    grad gave the gradient without the write's factor, vmap wrote only the first row)."""
    ops = opbuilder.to_torch(parity_ops)
    if warm:
        ops.scale_void(torch.tensor(X))
    msg = r"^scale_void: under torch.func an operator may not return its argument .* nor write one"
    for _ in range(2):
        with pytest.raises(NotImplementedError, match=msg):
            torch.func.grad(lambda x: (lambda b: (ops.scale_void(b), (b * b).sum())[1])(x * 1))(torch.tensor(X))


def test_an_undeclared_write_beside_a_written_view_is_not_the_view_s(parity_ops, torch_route):
    """sneaky_(b, b[1:]) writes the view (MarkDirty) and b[0], undeclared: b's change is not all the
    view's, so the undeclared write counts on b's version (two writes, as two torch in-place ops) and the
    signature stays watched: a later call's write into b fails the check of a tensor saved from b. On
    1065a89 the view explained any change of b: one version, and later calls' writes went uncounted."""
    ops = opbuilder.to_torch(parity_ops)
    b = torch.tensor(X)
    ops.sneaky_(b, b[1:])
    assert b._version == 2
    np.testing.assert_allclose(b.numpy(), np.concatenate([[X[0] + 100.0], X[1:] * 3.0]), rtol=1e-12)
    for _ in range(3):
        b, x = torch.tensor(X), torch.tensor(W, requires_grad=True)
        y = (x * b).sum()
        ops.sneaky_(b, torch.ones(3, dtype=torch.float64))
        with pytest.raises(RuntimeError, match=STALE):
            y.backward()


def test_inner_write_then_a_refused_write(parity_ops, torch_route):
    """scale_both_void(x, leaf): x written, then the write into a leaf that requires grad refused (torch's
    words, the leaf unchanged): x keeps its write, one version and the write's history, as torch's
    x.mul_(3) before the refused leaf.mul_(3). On dcb69fc the refusal dropped x's: version 0 and the old
    history, a.grad without the factor 3, silently."""
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        a = torch.tensor(X, requires_grad=True)
        x, leaf = a * 1, torch.tensor(Y, requires_grad=True)
        with pytest.raises(RuntimeError, match=LEAF_WRITE):
            ops.scale_both_void(x, leaf)
        np.testing.assert_array_equal(leaf.detach().numpy(), Y)
        assert x._version == 1
        (x * torch.tensor(W)).sum().backward()
        np.testing.assert_allclose(a.grad.numpy(), 3.0 * W, rtol=1e-12)


def test_double_backward_through_an_inner_write_is_the_named_error(parity_ops, torch_route):
    """A gradient of a gradient through _Rebase: torch's once-differentiable rule, as through any opbuilder
    operator (dcb69fc gave a second derivative without the write's share, silently)."""
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        leaf = torch.tensor(X, requires_grad=True)
        b = leaf * leaf
        ops.scale_void(b)
        g, = torch.autograd.grad((b * b * torch.tensor(W)).sum(), leaf, create_graph=True)
        with pytest.raises(RuntimeError, match=r"^scale_void: double backward through an opbuilder operator is "
                                               r"not supported"):
            torch.autograd.grad(g.sum(), leaf)


def test_inner_write_into_a_view_beside_a_reinterpreted_base(parity_ops, torch_route):
    """scale_second_void(b.view(int64), b[1:3]): the float64 write is every change of the int64 view's
    bytes, as torch allows; it was refused as an undeclared write (no grad: one more version)."""
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        b = torch.tensor(X)
        ops.scale_second_void(b.view(torch.int64), b[1:3])
        assert b._version == 1
        np.testing.assert_allclose(b.numpy(), np.concatenate([X[:1], X[1:3] * 3.0, X[3:]]), rtol=1e-12)


def test_inner_write_into_memory_another_tensor_shares_without_a_view(parity_ops, torch_route):
    """Two torch tensors over one numpy array (storages of their own): writing the one (b.mul_(3)) is not
    a write of the other, which torch leaves at version 0. b3cc361 grouped arguments by storage, so a's
    change was an undeclared write: refused after the data changed, and a's version bumped."""
    ops = opbuilder.to_torch(parity_ops)
    for _ in range(3):
        arr = X.copy()
        a, b = torch.from_numpy(arr).requires_grad_(), torch.from_numpy(arr[1:])
        ops.scale_second_void(a, b)
        assert a._version == 0 and b._version == 1
        np.testing.assert_allclose(arr, np.concatenate([X[:1], X[1:] * 3.0]), rtol=1e-12)


def _jit_then_use(ops, x, y):
    c = x * 1
    out = ops.scale_then_mul(c, y)
    return out + c


def _jit_write_then_raise(ops, x, y):
    c = x * 1
    try:
        ops.scale_then_throw(c)
    except ValueError:
        pass
    return c * y


@pytest.mark.parametrize("body, why", [
    (_jit_then_use, r"the C\+\+ function scale_then_mul wrote its argument 0, a tensor of the trace, in place "
                    r"without returning it"),
    (_jit_write_then_raise, r"the C\+\+ function scale_then_throw raised after writing its argument 0 in place"),
])
def test_jit_of_an_inner_write_into_an_intermediate(parity_ops, body, why):
    """runtime.jit of a function whose C++ call writes an intermediate it does not return, then uses it: on
    b3a8690 replays differentiated the later use through the history before the write (x.grad 3y + 1 where
    eager and torch give 3y + 3), and a call that raised after its write lost the write on every call,
    the first included. Such a signature now runs eagerly (not captured), with eager's values and grads."""
    def run(fn):
        x, y = Tensor(X.copy(), requires_grad=True), Tensor(Y.copy(), requires_grad=True)
        out = fn(x, y)
        (out * Tensor(W)).sum().backward()
        return out.asnumpy(), x.grad.asnumpy(), y.grad.asnumpy()
    want = run(lambda x, y: body(parity_ops, x, y))
    tx, ty = torch.tensor(X, requires_grad=True), torch.tensor(Y, requires_grad=True)
    tc = tx * 1
    if body is _jit_then_use:
        tout = tc.mul_(3.0) * ty + tc
    else:
        tout = tc.mul_(3.0) * ty
    (tout * torch.tensor(W)).sum().backward()
    for a, b in zip(want, (tout.detach().numpy(), tx.grad.numpy(), ty.grad.numpy())):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    jitted = rt.jit(lambda x, y: body(parity_ops, x, y))
    with pytest.warns(RuntimeWarning, match=r"not captured: .*" + why):
        got = run(jitted)
    for _ in range(3):
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-12)
        got = run(jitted)


def test_inner_in_place_write_numeric(parity_ops):
    """The torch reference's gradient is the function's: central differences of x -> 3x * y + 3x * w2."""
    def f(xv):
        c = xv * 1.0
        return float(((c * 3.0 * Y + c * 3.0 * W2) * W).sum())
    eps = 1e-6
    num = np.array([(f(X + eps * e) - f(X - eps * e)) / (2 * eps) for e in np.eye(4)])
    _, (gx, _) = _inner_write(_TorchSide(None), _INNER_WRITE_TORCH["scale_then_mul"], "scale_then_mul", False)
    np.testing.assert_allclose(gx, num, rtol=1e-6, atol=1e-8)


# ---- JAX routes ---------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def parity_ffi_ops(cache_dir):
    jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'opbuilder[jax]')")
    return load_op("parity_ffi_ops", [CPP / "parity_ops.cpp"], include_paths=[jax.ffi.include_dir()],
                   cflags=["-DPARITY_FFI"])


@pytest.fixture(params=["callback", "ffi", "generic_ffi"])
def jax_ops(request, parity_ffi_ops):
    """to_jax of the FFI build (its OB_XLA_FFI custom calls), or of its functions alone: the
    pure_callback route (ffi=False) or to_jax's generic custom calls; 64-bit arrays on for the test."""
    import jax
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    names = ["mul", "scale_", "ident"]
    twin = types.SimpleNamespace(**{n: getattr(parity_ffi_ops, n) for n in names},
                                 **{n + "_infer_shape": getattr(parity_ffi_ops, n + "_infer_shape") for n in names})
    # an in-place op under JAX declares its write (XLA then aliases the argument to the output)
    yield opbuilder.to_jax(parity_ffi_ops if request.param == "ffi" else twin, mutates={"scale_": [0]},
                           ffi=request.param != "callback")
    jax.config.update("jax_enable_x64", old)


def test_jax_ffi_undeclared_write_runs_on_a_copy(parity_ffi_ops):
    """Without ``mutates``, an in-place op (kAcceptsViews) writes a private copy on the FFI path, as on
    the callback path: the result is the written copy, and the caller's array keeps its values."""
    import jax
    import jax.numpy as jnp
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        x, w = jnp.asarray(X), jnp.asarray(W)
        j = opbuilder.to_jax(parity_ffi_ops)
        for f in (j.scale_, jax.jit(j.scale_)):
            np.testing.assert_allclose(np.asarray(f(x)), 3 * X, rtol=1e-12)
            np.testing.assert_array_equal(np.asarray(x), X)
        g = jax.jit(jax.grad(lambda a: (j.scale_(a) * w).sum()))(x)
        np.testing.assert_allclose(np.asarray(g), 3 * W, rtol=1e-12)
        np.testing.assert_array_equal(np.asarray(x), X)
    finally:
        jax.config.update("jax_enable_x64", old)


@pytest.mark.parametrize("name", ["scale_twice_", "scale_head_"])
def test_jax_a_markdirty_op_without_a_shape_rule_takes_the_cpp_route(parity_ffi_ops, name):
    """The probe took to_jax's own copy of a leaf the op writes (a runtime mul) for the function's work, and
    sent such an op to the host-Python route, naming a mul it never runs. Now XLA FFI, with jnp's values."""
    import jax
    import jax.numpy as jnp
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        j = opbuilder.to_jax(types.SimpleNamespace(**{name: getattr(parity_ffi_ops, name)}))
        x, w = jnp.asarray(X), jnp.asarray(W)
        f = getattr(j, name)
        assert f.route(x) == "xla_ffi"
        ref = (lambda a: (3 * a, 3 * a)) if name == "scale_twice_" else (lambda a: (3 * a, 3 * a[:2]))
        loss = (lambda g: lambda a: (g(a)[0] * w).sum() + (g(a)[1] * w[:g(a)[1].shape[0]]).sum())
        np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(loss(f)))(x)), np.asarray(jax.grad(loss(ref))(x)),
                                   rtol=1e-12)
        np.testing.assert_array_equal(np.asarray(x), X)
    finally:
        jax.config.update("jax_enable_x64", old)


def test_jax_mul(jax_ops):
    import jax
    import jax.numpy as jnp
    x, y, w = jnp.asarray(X), jnp.asarray(Y), jnp.asarray(W)
    for f in (lambda a, b: (jax_ops.mul(a, b) * w).sum(), jax.jit(lambda a, b: (jax_ops.mul(a, b) * w).sum())):
        gx, gy = jax.grad(f, argnums=(0, 1))(x, y)
        want = _expected("mul")
        np.testing.assert_allclose(np.asarray(gx), want[1][0], rtol=1e-12)
        np.testing.assert_allclose(np.asarray(gy), want[1][1], rtol=1e-12)


def test_jax_scale_leaves_the_callers_array_alone(jax_ops):
    """JAX arrays are immutable: an in-place op gives a new array, the argument keeps its values,
    in and out of jit, and its gradient is the in-place op's."""
    import jax
    import jax.numpy as jnp
    x, w = jnp.asarray(X), jnp.asarray(W)
    for f in (jax_ops.scale_, jax.jit(jax_ops.scale_)):
        out = f(x)
        np.testing.assert_allclose(np.asarray(out), 3 * X, rtol=1e-12)
        np.testing.assert_array_equal(np.asarray(x), X)
    both = jax.jit(lambda a: (jax_ops.scale_(a), a * 1))(x)  # a later use of the argument in the graph
    np.testing.assert_allclose(np.asarray(both[1]), X, rtol=1e-12)
    g = jax.grad(lambda a: (jax_ops.scale_(a * 1) * w).sum())(x)
    np.testing.assert_allclose(np.asarray(g), 3 * W, rtol=1e-12)


def test_jax_ident_after_mul(jax_ops):
    import jax
    import jax.numpy as jnp
    x, y, w, w2 = (jnp.asarray(a) for a in (X, Y, W, W2))

    def f(a, b):
        z = jax_ops.mul(a, b)
        return (jax_ops.ident(z) * w).sum() + (z * w2).sum()
    gx, gy = jax.grad(f, argnums=(0, 1))(x, y)
    want = _expected("ident_after_mul")
    np.testing.assert_allclose(np.asarray(gx), want[1][0], rtol=1e-12)
    np.testing.assert_allclose(np.asarray(gy), want[1][1], rtol=1e-12)


def test_a_broadcast_of_a_base_a_cpp_op_wrote_gets_every_rows_gradient(parity_ops):
    """scale_ (MarkDirty) writes one row of a broadcast, which writes its base: the broadcast, read after,
    is a part of the rewritten base, and its rows' gradients add up (torch's own ops: [33, 66, 99])."""
    w = np.array([[1.0, 2.0, 3.0], [10.0, 20.0, 30.0]])
    x = Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    h = x * 1.0
    b = h.broadcast_to((2, 3))
    parity_ops.scale_(b[0])
    (b * Tensor(w)).sum().backward()
    tx = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    th = tx * 1.0
    tb = th.expand(2, 3)
    tb[0].mul_(3.0)
    (tb * torch.from_numpy(w)).sum().backward()
    np.testing.assert_allclose(x.grad.asnumpy(), tx.grad.numpy())
    np.testing.assert_allclose(x.grad.asnumpy(), 3.0 * w.sum(0))


DIRTY_VIEW_MANY = (r"^{}: {} wrote argument 0 in place \({}\), a view of another tensor, and returned more than "
                   r"one tensor; as in torch, a Function that writes a view returns one tensor\. Pass a copy \(x \* "
                   r"1\), or split it into a Function that writes and returns only that tensor and one that computes "
                   r"the rest$")


class _PyScaleHead(rt.autograd.Function):
    """scale_head_ as a Python Function: x *= 3 in place, returns x and x[:2]."""

    @staticmethod
    def forward(ctx, x):
        a = x.asnumpy()
        a *= 3.0
        ctx.mark_dirty(x)
        return x, x[:2]

    @staticmethod
    def backward(ctx, g, gh):
        return g * 3.0


@pytest.mark.parametrize("kind", ["cpp", "python"])
def test_a_function_writing_a_view_and_returning_two_tensors_is_refused_as_torch(parity_ops, kind):
    """Before, the view's base was rebased through output 0 while output 1 kept the node too: backward
    ran the node twice and failed with "a second time". torch refuses the call itself, after forward."""
    x = Tensor(np.arange(1.0, 7.0), requires_grad=True)
    c = x * 1.0
    b = c[1:5]
    before = c._version
    message = (DIRTY_VIEW_MANY.format("ParityScaleHead", "Forward", "MarkDirty") if kind == "cpp"
               else DIRTY_VIEW_MANY.format("_PyScaleHead", "forward", "mark_dirty"))
    with pytest.raises(RuntimeError, match=message):
        parity_ops.scale_head_(b) if kind == "cpp" else _PyScaleHead.apply(b)
    # as torch's: the write is done and counted, the base's history untouched (its gradient is mul's)
    np.testing.assert_array_equal(c.asnumpy(), [1.0, 6.0, 9.0, 12.0, 15.0, 6.0])
    assert c._version == before + 1
    c.sum().backward()
    np.testing.assert_array_equal(x.grad.asnumpy(), np.ones(6))
    # not a view, or with no gradient recorded: allowed
    r, v = parity_ops.scale_head_(x * 1.0) if kind == "cpp" else _PyScaleHead.apply(x * 1.0)
    np.testing.assert_array_equal(v.asnumpy(), [3.0, 6.0])
    with rt.no_grad():
        r, v = parity_ops.scale_head_(c[1:5]) if kind == "cpp" else _PyScaleHead.apply(c[1:5])
    np.testing.assert_array_equal(v.asnumpy(), [18.0, 27.0])


def test_a_written_view_marked_non_differentiable_may_come_with_another_output():
    """As torch allows it (and C++ Function<T> did): a view marked non-differentiable is not rebased, so the
    refusal of 71e1bd1 does not apply. torch gives [0, 6, 6, 0, 0, 0] here."""
    class WriteAndDouble(rt.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            a = x.asnumpy()
            a *= 3.0
            ctx.mark_dirty(x)
            ctx.mark_non_differentiable(x)
            return x, Tensor(a[:2] * 2.0)

        @staticmethod
        def backward(ctx, g, gd):
            pad = np.zeros(4)
            pad[:2] = gd.asnumpy() * 6.0
            return Tensor(pad)

    x = Tensor(np.arange(1.0, 7.0), requires_grad=True)
    _, doubled = WriteAndDouble.apply((x * 1.0)[1:5])
    doubled.sum().backward()
    np.testing.assert_array_equal(x.grad.asnumpy(), [0.0, 6.0, 6.0, 0.0, 0.0, 0.0])


def test_torch_refuses_a_function_writing_a_view_and_returning_two_tensors(parity_ops, torch_route):
    ops = opbuilder.to_torch(parity_ops)
    x = torch.arange(1.0, 7.0, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"^If your Function modifies inplace an input that is a view of another "
                                           r"Tensor, your Function cannot return more than one Tensor"):
        ops.scale_head_((x * 1.0)[1:5])

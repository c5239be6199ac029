"""An op writing into a view under runtime.jit gives eager's gradients on every call (issue 33, items 6 and 11).

Eagerly, an op that writes a view in place (MarkDirty, mark_dirty) rebases the base's history
(runtime.call_rules.rebase_view, torch's CopySlices). A jit graph holds values, not memory, so a call
that records a gradient through such a trace runs eagerly (runtime/jit/function.py ``_eager_grad``);
the first call (the trace) already was eager, and replays used to send the base's gradient past the
write. Covered: a view of an intermediate and of a jit input made inside the jitted function, through
slicing, a step, reshape, transpose and a row of a reshape; a base without grad written through a view
by an op whose other input requires grad; a GRAPH_MODE Cell doing the same; views made before a write
(jit equals eager); calls recording no gradient still replay the graph with eager's values. Gradients
are compared with torch in float64 and with central differences."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import runtime as rt
from inplace_util import PyScale, VIEWS as SHARED_VIEWS, central
from runtime import Tensor, nn
from runtime.autograd import grad, no_grad

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

pytestmark = pytest.mark.build  # the module's fixture compiles tests/cpp/inplace_view_ops.cpp

X = np.array([1.0, 2.0, -3.0, 4.0, 0.5, -1.5])
W = np.array([0.5, -1.0, 2.0, 3.0, 0.25, -2.0])  # weights of the loss: each element's gradient differs
CALLS = 3  # the call that traces, then two replays
VIEWS = dict(SHARED_VIEWS)
VIEW_WRITE = r"a call of this signature that records a gradient runs eagerly"


@pytest.fixture(scope="module")
def ops(inplace_view_ops):
    return inplace_view_ops


def _scalers(ops):
    return {"cpp": ops.scale_, "cpp_views": ops.scale_views_, "python": PyScale.apply}


def _torch_grad(view, x=X):
    """torch's gradient of sum(W * b) + sum(v * v), b = 2 x, v a view of b scaled by 3 in place."""
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    tb = tx * 2.0
    tv = view(tb)
    tv.mul_(3.0)
    loss = (tb * torch.tensor(W)).sum() + (tv * tv).sum()
    return torch.autograd.grad(loss, tx)[0].numpy(), loss.item()


@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("route", ["cpp", "cpp_views", "python"])
@pytest.mark.parametrize("level", ["O0", "O1"])
def test_a_write_into_a_view_of_an_intermediate_gives_torchs_gradient_on_every_call(ops, route, view, level):
    op = _scalers(ops)[route]

    def f(x):
        b = x * 2.0
        v = VIEWS[view](b)
        op(v, 3.0)
        return (b * Tensor(W)).sum() + (v * v).sum()

    jf = rt.jit(f, jit_level=level)
    want, want_loss = _torch_grad(VIEWS[view])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for call in range(CALLS):
            x = Tensor(X.copy(), requires_grad=True)
            loss = jf(x)
            g, = grad(loss, x)
            np.testing.assert_allclose(loss.asnumpy(), want_loss, rtol=1e-12, err_msg=f"call {call}")
            np.testing.assert_allclose(g.asnumpy(), want, rtol=1e-12, err_msg=f"call {call}")

        def value(a):  # the loss from calls recording nothing: the graph replays
            with no_grad():
                return float(jf(Tensor(a)).asnumpy())
        np.testing.assert_allclose(central(value, X.copy()), want, rtol=1e-6, atol=1e-6)
    assert jf.traces == 1


@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("route", ["cpp", "python"])
def test_a_write_into_a_view_of_a_jit_input_rebases_the_callers_tensor(ops, route, view):
    """The view is made inside the jitted function, of its argument: the caller's tensor takes the write."""
    op = _scalers(ops)[route]

    @rt.jit
    def f(b):
        op(VIEWS[view](b), 3.0)
        return b * 1.0

    tx = torch.tensor(X, requires_grad=True)
    tb = tx * 1.0
    VIEWS[view](tb).mul_(3.0)
    tloss = (tb * torch.tensor(W)).sum() + (tb * 1.0 * tb).sum()
    want, = torch.autograd.grad(tloss, tx)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for call in range(CALLS):
            x = Tensor(X.copy(), requires_grad=True)
            b = x * 1.0
            r = f(b)
            np.testing.assert_allclose(b.asnumpy(), tb.detach().numpy(), rtol=1e-12)
            g, = grad((b * Tensor(W)).sum() + (r * b).sum(), x)
            np.testing.assert_allclose(g.asnumpy(), want.numpy(), rtol=1e-12, err_msg=f"call {call}")


@pytest.mark.parametrize("route", ["cpp", "python"])
def test_the_first_replay_says_once_that_it_runs_eagerly(ops, route):
    op = _scalers(ops)[route]

    @rt.jit
    def f(x):
        b = x * 1.0
        op(b[1:], 3.0)
        return b

    f(Tensor(X.copy(), requires_grad=True))  # the trace: an eager run
    with pytest.warns(RuntimeWarning, match=VIEW_WRITE):
        f(Tensor(X.copy(), requires_grad=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f(Tensor(X.copy(), requires_grad=True))


def test_a_base_without_grad_written_through_a_view_takes_the_other_inputs_gradient(ops):
    @rt.jit
    def f(y):
        base = Tensor(np.zeros(6))
        ops.add_(base[2:5], y)
        return (base * Tensor(W)).sum()

    ty = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    tbase = torch.zeros(6, dtype=torch.float64)
    tbase[2:5].add_(ty)
    want, = torch.autograd.grad((tbase * torch.tensor(W)).sum(), ty)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for call in range(CALLS):
            y = Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
            g, = grad(f(y), y)
            np.testing.assert_allclose(g.asnumpy(), want.numpy(), rtol=1e-12, err_msg=f"call {call}")


@pytest.mark.parametrize("view", ["slice", "step", "transpose"])
def test_a_graph_mode_cell_writing_a_view_gives_torchs_gradient_on_every_call(ops, graph_mode, view):
    class Net(nn.Cell):
        def construct(self, x):
            b = x * 2.0
            v = VIEWS[view](b)
            ops.scale_views_(v, 3.0)
            return (b * Tensor(W)).sum() + (v * v).sum()

    net = Net()
    want, want_loss = _torch_grad(VIEWS[view])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for call in range(CALLS):
            x = Tensor(X.copy(), requires_grad=True)
            loss = net(x)
            g, = grad(loss, x)
            np.testing.assert_allclose(loss.asnumpy(), want_loss, rtol=1e-12)
            np.testing.assert_allclose(g.asnumpy(), want, rtol=1e-12, err_msg=f"call {call}")
    assert net._graph_jit.traces == 1


def _before_write(op, sibling):
    """Views of b made before an op writes b (or, ``sibling``, another view of b): the loss reads the
    earlier view."""
    def f(x):
        b = x * 2.0
        v = b[1:]
        u = b[:3]
        if sibling:
            op(v, 3.0)
            return (u * Tensor(W[:3])).sum() + (b * b).sum()
        op(b, 3.0)
        return (v * Tensor(W[1:])).sum() + (b * b).sum()
    return f


@pytest.mark.parametrize("sibling", [False, True])
@pytest.mark.parametrize("route", ["cpp", "python"])
def test_views_made_before_a_write_give_eagers_gradient_on_every_call(ops, route, sibling):
    f = _before_write(_scalers(ops)[route], sibling)
    x = Tensor(X.copy(), requires_grad=True)
    want, = grad(f(x), x)
    jf = rt.jit(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for call in range(CALLS):
            x = Tensor(X.copy(), requires_grad=True)
            g, = grad(jf(x), x)
            np.testing.assert_allclose(g.asnumpy(), want.asnumpy(), rtol=1e-12, err_msg=f"call {call}")


def test_calls_recording_no_gradient_still_run_the_graph(ops):
    @rt.jit
    def f(x):
        b = x * 2.0
        ops.scale_views_(b.reshape(2, 3).T, 3.0)
        return b + 1.0

    with no_grad():
        outs = [f(Tensor(X.copy())).asnumpy() for _ in range(CALLS)]
    for o in outs:
        np.testing.assert_allclose(o, X * 6.0 + 1.0, rtol=1e-12)
    assert f.traces == 1 and f._cache  # one trace, and its graph replayed
    entry = next(iter(f._cache.values()))
    assert entry.calls == CALLS and entry.traced.view_writes


def test_the_backward_graph_of_such_a_signature_is_a_named_error(ops):
    @rt.jit
    def f(x):
        b = x * 2.0
        ops.scale_views_(b[1:], 3.0)
        return b

    with pytest.raises(RuntimeError, match=r"this signature has no backward graph: scale_views_ wrote its "
                                           r"argument 0 in place, a view of another tensor, and a gradient "
                                           r"through such a write is taken eagerly"):
        f.backward_graph(Tensor(X.copy(), requires_grad=True))


def test_a_write_into_a_view_of_a_leaf_input_is_refused_on_every_call(ops):
    @rt.jit
    def f(x):
        ops.scale_views_(x[1:], 3.0)
        return x

    for _ in range(CALLS):
        x = Tensor(X.copy(), requires_grad=True)
        with pytest.raises(RuntimeError, match=r"modifies argument 0 in place \(MarkDirty\), but it is a view "
                                               r"of a leaf that requires grad"):
            f(x)
        np.testing.assert_array_equal(x.asnumpy(), X)

"""A view made before an in-place write into its base keeps up with the write (issue 33, #6).

torch regenerates a view's ``grad_fn`` when its base's version changed: a view made before a recorded
write into its base (or into another view of it) is, when next used, "a part of the base's current
history". The runtime does the same (runtime/call_rules.py ``refresh_view``) on every op's input edge:
primitives, Python Functions and C++ ``Function<T>``. Each case is computed in torch too (float64)
and the gradients compared.
"""
from __future__ import annotations

import numpy as np
import pytest

import runtime as rt
from inplace_util import PyAdd, PyScale, PySquare
from runtime import Tensor
from runtime.autograd import grad

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

pytestmark = pytest.mark.build  # the module's fixture compiles tests/cpp/inplace_view_ops.cpp


@pytest.fixture(scope="module")
def ops(inplace_view_ops):
    return inplace_view_ops


# views of a 6-element base, each made the same way in the runtime and in torch
VIEWS = {
    "slice": lambda a: a[1:],
    "step": lambda a: a[::2],
    "reshape": lambda a: a.reshape(3, 2),
    "transpose": lambda a: a.reshape(2, 3).T,
    "view_of_view": lambda a: a[1:][::2],
}
W = np.arange(1.0, 7.0) * np.array([0.5, -1.0, 2.0, 3.0, 0.25, -2.0])  # each element's weight differs


def _w(v):
    """Weights of the view's shape (the same in both frameworks)."""
    return W[: int(np.prod(v.shape))].reshape(tuple(v.shape))


def _scalers(ops):
    return {"cpp": lambda t: ops.scale_(t, 3.0), "cpp_views": lambda t: ops.scale_views_(t, 3.0),
            "python": lambda t: PyScale.apply(t, 3.0)}


def _tx():
    return torch.arange(1.0, 7.0, dtype=torch.float64, requires_grad=True)


def _x():
    return Tensor(np.arange(1.0, 7.0), requires_grad=True)


@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("route", ["cpp", "cpp_views", "python"])
def test_a_view_made_before_a_write_into_its_base_sees_the_write(ops, route, view):
    x = _x()
    b = x * 1.0
    v = VIEWS[view](b)  # made before the write
    _scalers(ops)[route](b)
    g, = grad((v * Tensor(_w(v))).sum(), x)

    tx = _tx()
    tb = tx * 1.0
    tv = VIEWS[view](tb)
    tb.mul_(3.0)
    tg, = torch.autograd.grad((tv * torch.tensor(_w(tv))).sum(), tx)
    np.testing.assert_allclose(v.asnumpy(), tv.detach().numpy())
    np.testing.assert_allclose(g.asnumpy(), tg.numpy(), rtol=1e-12)
    assert not np.allclose(g.asnumpy(), np.where(tg.numpy() != 0, tg.numpy() / 3.0, 0.0))  # not the old history


@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("route", ["cpp", "cpp_views", "python"])
def test_a_sibling_view_made_before_a_write_into_another_view_sees_it(ops, route, view):
    x = _x()
    b = x * 1.0
    u = VIEWS[view](b)  # made before the write into b[1:4]
    written = b[1:4] if route != "cpp_views" else b[1::2]
    _scalers(ops)[route](written)
    g, = grad((u * Tensor(_w(u))).sum() + (b * b).sum(), x)

    tx = _tx()
    tb = tx * 1.0
    tu = VIEWS[view](tb)
    (tb[1:4] if route != "cpp_views" else tb[1::2]).mul_(3.0)
    tg, = torch.autograd.grad((tu * torch.tensor(_w(tu))).sum() + (tb * tb).sum(), tx)
    np.testing.assert_allclose(u.asnumpy(), tu.detach().numpy())
    np.testing.assert_allclose(g.asnumpy(), tg.numpy(), rtol=1e-12)


def test_the_brief_examples(ops):
    # issue 33 #6's follow-up: [0,-3,6,9,...] and [.5,-3,6,0,0,0], as torch
    x = Tensor(np.arange(6.0), requires_grad=True)
    b = x * 1.0
    v = b[1:]
    ops.scale_(b, 3.0)
    g, = grad((v * Tensor(np.array([-1.0, 2.0, 3.0, 4.0, 5.0]))).sum(), x)
    assert g.tolist() == [0.0, -3.0, 6.0, 9.0, 12.0, 15.0]
    b = x * 1.0
    u = b[:3]
    ops.scale_views_(b[1:], 3.0)
    g, = grad((u * Tensor(np.array([0.5, -1.0, 2.0]))).sum(), x)
    assert g.tolist() == [0.5, -3.0, 6.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("reader", ["primitive", "cpp", "python"])
@pytest.mark.parametrize("route", ["cpp", "python"])
def test_an_older_view_read_by_each_kind_of_op(ops, route, reader):
    # the view's history is made anew on the input edge of a primitive, a C++ Function and a Python Function
    read = {"primitive": lambda t: t * t, "cpp": ops.square, "python": PySquare.apply}[reader]
    x = _x()
    b = x * 1.0
    v = b[::2]
    _scalers(ops)[route](b)
    g, = grad((read(v) * Tensor(_w(v))).sum(), x)
    tx = _tx()
    tb = tx * 1.0
    tv = tb[::2]
    tb.mul_(3.0)
    tg, = torch.autograd.grad((tv * tv * torch.tensor(_w(tv))).sum(), tx)
    np.testing.assert_allclose(g.asnumpy(), tg.numpy(), rtol=1e-12)


@pytest.mark.parametrize("route", ["cpp", "python"])
def test_an_older_view_written_after_its_base_was_written(ops, route):
    # the second write's own edge to the view is the view's new history (a part of the written base)
    scale = _scalers(ops)[route]
    x = _x()
    b = x * 1.0
    v = b[2:]
    scale(b)
    scale(v)
    g, = grad((b * Tensor(W)).sum() + (v * Tensor(_w(v))).sum(), x)
    tx = _tx()
    tb = tx * 1.0
    tv = tb[2:]
    tb.mul_(3.0)
    tv.mul_(3.0)
    tg, = torch.autograd.grad((tb * torch.tensor(W)).sum() + (tv * torch.tensor(_w(tv))).sum(), tx)
    np.testing.assert_allclose(g.asnumpy(), tg.numpy(), rtol=1e-12)


@pytest.mark.parametrize("route", ["cpp", "python"])
def test_an_older_view_of_a_base_without_grad_gets_the_written_history(ops, route):
    # the base had no history when the view was made; a recorded write gives it one, and the view too
    add = ops.add_ if route == "cpp" else PyAdd.apply
    y = Tensor(np.arange(1.0, 7.0), requires_grad=True)
    b = Tensor(np.ones(6))
    v = b.reshape(2, 3).T
    assert not v.requires_grad
    add(b, y)
    out = (v * Tensor(_w(v))).sum()
    assert out.requires_grad
    g, = grad(out, y)
    ty = torch.arange(1.0, 7.0, dtype=torch.float64, requires_grad=True)
    tb = torch.ones(6, dtype=torch.float64)
    tv = tb.reshape(2, 3).T
    tb.add_(ty)
    tg, = torch.autograd.grad((tv * torch.tensor(_w(tv))).sum(), ty)
    np.testing.assert_allclose(g.asnumpy(), tg.numpy(), rtol=1e-12)


@pytest.mark.parametrize("write", ["imul", "setitem"])
def test_a_built_in_write_under_no_grad_leaves_an_older_view_s_gradient_as_torch(ops, write):
    # a built-in in-place op (runtime/ops/writes.py) records nothing: torch's no_grad write is not
    # differentiated either; the view's history made anew says the same as its old one
    x = _x()
    b = x * 1.0
    v = b[1:]
    with rt.no_grad():
        if write == "imul":
            b *= 2.0
        else:
            b[0:3] = 7.0
    g, = grad((v * Tensor(_w(v))).sum(), x)
    tx = _tx()
    tb = tx * 1.0
    tv = tb[1:]
    with torch.no_grad():
        if write == "imul":
            tb *= 2.0
        else:
            tb[0:3] = 7.0
    tg, = torch.autograd.grad((tv * torch.tensor(_w(tv))).sum(), tx)
    np.testing.assert_allclose(v.asnumpy(), tv.detach().numpy())
    np.testing.assert_allclose(g.asnumpy(), tg.numpy(), rtol=1e-12)


def test_a_built_in_write_then_a_recorded_write_into_a_base_without_grad(ops):
    # a leaf without grad may be written by a built-in op while recording (writes.py); a MarkDirty op
    # then gives it a history, which the view made before both writes sees
    y = Tensor(np.arange(1.0, 7.0), requires_grad=True)
    b = Tensor(np.ones(6))
    v = b[::2]
    b *= 2.0
    ops.add_(b, y)
    ops.scale_(b, 3.0)
    g, = grad((v * v * Tensor(_w(v))).sum(), y)
    ty = torch.arange(1.0, 7.0, dtype=torch.float64, requires_grad=True)
    tb = torch.ones(6, dtype=torch.float64)
    tv = tb[::2]
    tb *= 2.0
    tb.add_(ty)
    tb.mul_(3.0)
    tg, = torch.autograd.grad((tv * tv * torch.tensor(_w(tv))).sum(), ty)
    np.testing.assert_allclose(v.asnumpy(), tv.detach().numpy())
    np.testing.assert_allclose(g.asnumpy(), tg.numpy(), rtol=1e-12)


# ---- views made under no_grad: torch refuses what would be ambiguous -----------------------------------------

NO_GRAD_WRITE = (r"modifies argument 0 in place \((MarkDirty|mark_dirty)\): a view was created in no_grad mode "
                 r"and is being modified in place with grad mode enabled")


@pytest.mark.parametrize("route", ["cpp", "cpp_views", "python"])
def test_a_recorded_write_into_a_view_made_under_no_grad_is_refused_and_writes_nothing(ops, route):
    x = _x()
    b = x * 1.0
    with rt.no_grad():
        v = b[1:]
    with pytest.raises(RuntimeError, match=NO_GRAD_WRITE):
        _scalers(ops)[route](v)
    assert b.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    tb = _tx() * 1.0
    with torch.no_grad():
        tv = tb[1:]
    with pytest.raises(RuntimeError, match="A view was created in no_grad mode and is being modified inplace with "
                                           "grad mode enabled"):
        tv.mul_(3.0)


def test_a_view_made_under_no_grad_read_after_a_recorded_write_is_refused(ops):
    x = _x()
    b = x * 1.0
    with rt.no_grad():
        v = b[1:]
    ops.scale_(b, 3.0)
    with pytest.raises(RuntimeError, match="a view was created in no_grad mode and its base \\(or another view of "
                                           "its base\\) was then modified in place with grad mode enabled"):
        v * 2.0
    with rt.no_grad():  # outside recording it is only values
        assert (v * 2.0).tolist() == [12.0, 18.0, 24.0, 30.0, 36.0]
    tb = _tx() * 1.0
    with torch.no_grad():
        tv = tb[1:]
    tb.mul_(3.0)
    with pytest.raises(RuntimeError, match="A view was created in no_grad mode and its base or another view of its "
                                           "base has been modified inplace with grad mode enabled"):
        tv * 2.0


def test_a_view_made_under_no_grad_and_never_written_stays_outside_the_graph(ops):
    x = _x()
    b = x * 1.0
    with rt.no_grad():
        v = b[1:]
    assert not (v * 2.0).requires_grad


@pytest.mark.parametrize("route", ["cpp", "python"])
def test_the_gradient_of_an_older_view_itself(ops, route):
    # backward from the view (no op reads it after the write): its history is made anew there too
    x = _x()
    b = x * 1.0
    v = b.reshape(2, 3).T
    _scalers(ops)[route](b)
    g, = grad(v, x, Tensor(_w(v)))
    tx = _tx()
    tb = tx * 1.0
    tv = tb.reshape(2, 3).T
    tb.mul_(3.0)
    tg, = torch.autograd.grad(tv, tx, torch.tensor(_w(tv)))
    np.testing.assert_allclose(g.asnumpy(), tg.numpy(), rtol=1e-12)


@pytest.mark.parametrize("sibling", [False, True])
@pytest.mark.parametrize("route", ["cpp", "python"])
def test_under_jit_an_older_view_gives_torchs_gradient_on_every_call(ops, route, sibling):
    # runtime.jit runs a signature that writes into a view eagerly when it records a gradient: torch's
    # numbers on the call that traces and on the later ones
    import warnings

    scale = _scalers(ops)[route]

    def f(x):
        b = x * 1.0
        v = b[::2]
        u = b[:3]
        if sibling:
            scale(b[1:])
            return (u * Tensor(W[:3])).sum()
        scale(b)
        return (v * Tensor(W[:3])).sum()

    tx = _tx()
    tb = tx * 1.0
    tv, tu = tb[::2], tb[:3]
    if sibling:
        tb[1:].mul_(3.0)
        tloss = (tu * torch.tensor(W[:3])).sum()
    else:
        tb.mul_(3.0)
        tloss = (tv * torch.tensor(W[:3])).sum()
    tg, = torch.autograd.grad(tloss, tx)
    jf = rt.jit(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for call in range(3):
            x = _x()
            g, = grad(jf(x), x)
            np.testing.assert_allclose(g.asnumpy(), tg.numpy(), rtol=1e-12, err_msg=f"call {call}")


def test_a_no_grad_view_of_a_leaf_read_after_an_optimizer_step_is_refused():
    """torch refuses it for a leaf base too (the view's history would be ambiguous); the runtime read the
    view as a constant, silently giving no gradient to the leaf through it."""
    w = Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    with rt.no_grad():
        v = w[0:2]
        w -= 0.5  # an optimizer's step
    with pytest.raises(RuntimeError, match="a view was created in no_grad mode and its base"):
        v * 3.0
    with rt.no_grad():
        assert (v * 3.0).tolist() == [1.5, 4.5]
    u = w[0:2]  # a view made with grad on is regenerated from the leaf as before
    (u * 3.0).sum().backward()
    assert w.grad.tolist() == [3.0, 3.0, 0.0]

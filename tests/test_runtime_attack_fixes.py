"""Runtime fixes from the attack round on issue 33, each compared with torch in float64.

* An operator returning its argument unchanged (a C++ ``Function<T>``, a Python ``Function``) returns a
  view of it (runtime/call_rules.py ``share_alias``), as torch makes a custom Function's output that is
  its input: a MarkDirty write into the alias of a leaf that requires grad is refused before Forward
  runs, and the leaf keeps its values.
* ``saved_tensors_hooks`` apply to built-in ops (primitives, runtime/ops/primitive.py) too: what their
  derivative rules read goes through the pack hook when recorded, and backward reads the unpack hook's
  tensors, so a raw write after the forward does not reach the gradient (torch's rule).
"""
from __future__ import annotations

import numpy as np
import pytest

import runtime as rt
from inplace_util import PyScale
from runtime import Tensor
from runtime.autograd import Function, grad, saved_tensors_hooks

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

VIEW_OF_LEAF = (r"modifies argument 0 in place \((MarkDirty|mark_dirty)\), but it is a view of a leaf that "
                r"requires grad")


@pytest.fixture(scope="module")
def ops(inplace_view_ops):
    return inplace_view_ops


class PyIdent(Function):
    """Returns its argument unchanged."""

    @staticmethod
    def forward(ctx, a):
        return a

    @staticmethod
    def backward(ctx, g):
        return g


class TIdent(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        return a

    @staticmethod
    def backward(ctx, g):
        return g


def _idents(ops):
    return {"cpp": ops.identity, "python": PyIdent.apply}


def _scalers(ops):
    return {"cpp": ops.scale_, "python": PyScale.apply}


# ---- an argument returned unchanged is a view of it -------------------------------------------------------

@pytest.mark.build
@pytest.mark.parametrize("ident", ["cpp", "python"])
@pytest.mark.parametrize("scale", ["cpp", "python"])
def test_a_write_into_a_returned_leaf_is_refused_and_leaves_it_untouched(ops, ident, scale):
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    r = _idents(ops)[ident](x)
    with pytest.raises(RuntimeError, match=VIEW_OF_LEAF):
        _scalers(ops)[scale](r, 3.0)
    np.testing.assert_array_equal(x.asnumpy(), [1.0, 2.0])
    tx = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="is a view and is being modified inplace"):
        TIdent.apply(tx).mul_(3.0)
    np.testing.assert_array_equal(tx.detach().numpy(), [1.0, 2.0])


@pytest.mark.build
@pytest.mark.parametrize("ident", ["cpp", "python"])
def test_a_returned_view_of_a_leaf_is_refused_too(ops, ident):
    x = Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    r = _idents(ops)[ident](x[1:])
    with pytest.raises(RuntimeError, match=VIEW_OF_LEAF):
        ops.scale_(r, 3.0)
    np.testing.assert_array_equal(x.asnumpy(), [1.0, 2.0, 3.0])


@pytest.mark.build
@pytest.mark.parametrize("ident", ["cpp", "python"])
def test_a_returned_leaf_made_under_no_grad_is_a_plain_alias_as_in_torch(ops, ident):
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    with rt.no_grad():
        r = _idents(ops)[ident](x)
    assert r._base is None and not r.requires_grad
    ops.scale_(r, 3.0)
    tx = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        tr = TIdent.apply(tx)
    assert not tr._is_view() and not tr.requires_grad
    tr.mul_(3.0)  # torch writes the leaf through it too
    np.testing.assert_array_equal(x.asnumpy(), tx.detach().numpy())
    assert x._version == r._version


@pytest.mark.build
@pytest.mark.parametrize("ident", ["cpp", "python"])
def test_a_returned_argument_that_needs_no_grad_is_still_written(ops, ident):
    x = Tensor(np.array([1.0, 2.0]))
    r = _idents(ops)[ident](x)
    assert r._base is x  # torch: a view of it, though nothing is recorded
    ops.scale_(r, 3.0)
    np.testing.assert_array_equal(x.asnumpy(), [3.0, 6.0])
    assert x._version == r._version


@pytest.mark.build
@pytest.mark.parametrize("ident", ["cpp", "python"])
def test_a_write_into_a_returned_non_leaf_rebases_its_history(ops, ident):
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    w = Tensor(np.array([5.0, 7.0]), requires_grad=True)
    b = x * 1.0
    r = _idents(ops)[ident](b)
    ops.scale_(r, 3.0)
    gx, gw = grad((b * w).sum(), [x, w])
    tx = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    tw = torch.tensor([5.0, 7.0], dtype=torch.float64, requires_grad=True)
    tb = tx * 1.0
    tb.view_as(tb).mul_(3.0)  # what torch does for a view (it refuses the custom Function's own view)
    (tb * tw).sum().backward()
    np.testing.assert_allclose(gx.asnumpy(), tx.grad.numpy())
    np.testing.assert_allclose(gw.asnumpy(), tw.grad.numpy())
    np.testing.assert_array_equal(b.asnumpy(), tb.detach().numpy())


# ---- saved_tensors_hooks apply to built-in ops ------------------------------------------------------------

def _copying_hooks(packs):
    def pack(t):
        packs.append(t)
        return t.asnumpy().copy()
    return saved_tensors_hooks(pack, lambda a: Tensor(a))


@pytest.mark.parametrize("op, top", [
    (lambda a, c: a * c, lambda a, c: a * c),
    (lambda a, c: a / c, lambda a, c: a / c),
    (lambda a, c: (a * c).sin(), lambda a, c: (a * c).sin()),
    (lambda a, c: a.exp() * c, lambda a, c: a.exp() * c),
])
def test_a_builtin_op_reads_what_the_pack_hook_kept(op, top):
    packs = []
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    b = Tensor(np.array([3.0, 4.0]))
    with _copying_hooks(packs):
        y = op(x, b)
    b.asnumpy()[:] *= 10  # a raw write after the forward (no version bump)
    g, = grad(y.sum(), x)
    assert packs
    tx = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    tb = torch.tensor([3.0, 4.0], dtype=torch.float64)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
        ty = top(tx, tb)
    tb.data.mul_(10)
    ty.sum().backward()
    np.testing.assert_allclose(g.asnumpy(), tx.grad.numpy())


def test_a_write_under_no_grad_after_the_forward_is_not_seen_by_the_hooked_node():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    b = Tensor(np.array([3.0, 4.0]))
    with _copying_hooks([]):
        y = x * b
    with rt.no_grad():
        b *= 10.0  # a counted write: no version error, the hook's copy is read
    g, = grad(y.sum(), x)
    np.testing.assert_allclose(g.asnumpy(), [3.0, 4.0])


def test_a_hooked_output_is_read_from_the_hook():
    x = Tensor(np.array([0.5, 1.0]), requires_grad=True)
    with _copying_hooks([]):
        y = x.exp()  # exp's rule reads its output
    y.asnumpy()[:] = 0.0
    g, = grad(y.sum(), x)
    tx = torch.tensor([0.5, 1.0], dtype=torch.float64, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
        ty = tx.exp()
    ty.data.zero_()
    ty.sum().backward()
    np.testing.assert_allclose(g.asnumpy(), tx.grad.numpy())


def test_a_hooked_node_gives_a_second_order_gradient():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    with _copying_hooks([]):
        y = (x * x * x).sum()
    g, = grad(y, x, create_graph=True)
    gg, = grad(g.sum(), x)
    tx = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
        ty = (tx * tx * tx).sum()
    tg, = torch.autograd.grad(ty, tx, create_graph=True)
    tgg, = torch.autograd.grad(tg.sum(), tx)
    np.testing.assert_allclose(g.asnumpy(), tg.detach().numpy())
    np.testing.assert_allclose(gg.asnumpy(), tgg.numpy())


def test_an_unpack_hook_returning_no_tensor_is_a_named_error():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    with saved_tensors_hooks(lambda t: t.asnumpy().copy(), lambda a: a):
        y = x * x
    with pytest.raises(TypeError, match=r"mul: the saved_tensors_hooks unpack hook returned a ndarray for "
                                        r"argument 0; it must return a runtime.Tensor"):
        grad(y.sum(), x)


def test_a_hooked_node_freed_by_backward_says_so():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    with _copying_hooks([]):
        y = (x * x).sum()
    grad(y, x)
    with pytest.raises(RuntimeError, match="a second time: its saved tensors were freed"):
        grad(y, x)


def test_without_hooks_a_builtin_op_records_a_plain_node():
    from runtime.ops.primitive import HookedPrimitiveNode, PrimitiveNode
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    assert type((x * x)._node) is PrimitiveNode
    with _copying_hooks([]):
        assert type((x * x)._node) is HookedPrimitiveNode

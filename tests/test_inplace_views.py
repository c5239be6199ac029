"""In-place writes through an op, decided once (runtime/call_rules.py, include/opbuilder/detail/call_rules.h).

Issue 33: MarkDirty on a view rebases the base's history as torch does (#6); an argument returned
unchanged shares the caller's version counter (#7); a refused MarkDirty is decided before Forward and
leaves the data untouched (#14); a gradient of a gradient through a Backward that records no graph is
one named error (#16). Each case is computed in torch too, and the gradients compared.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import runtime as rt
from inplace_util import PyScale, PyAdd, VIEWS as SHARED_VIEWS
from runtime import Tensor
from runtime.autograd import Function, grad

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

pytestmark = pytest.mark.build  # the module's fixture compiles tests/cpp/inplace_view_ops.cpp

OVERLAP = ("unsupported operation: more than one element of the written-to tensor refers to a single memory "
           "location. Please clone() the tensor before performing the operation.")
DIRTY = r"modifies argument 0 in place \((MarkDirty|mark_dirty)\)"  # C++'s word, or the Python Function's


@pytest.fixture(scope="module")
def ops(inplace_view_ops):
    return inplace_view_ops


VIEWS = {
    **SHARED_VIEWS,
    "reversed": lambda a: a[::-1] if not isinstance(a, torch.Tensor) else None,
    "element": lambda a: a[2],  # an index of integers only: a 0-d view, as torch's (numpy's is a copy)
    "element_of_2d": lambda a: a.reshape(3, 2)[1, 0],
}

W = np.array([0.5, -1.0, 2.0, 3.0, 0.25, -2.0])  # weights of the loss: each element's gradient differs


def _scalers(ops):
    return {"cpp": ops.scale_, "cpp_views": ops.scale_views_, "cpp_mark_after": ops.scale_then_mark,
            "python": PyScale.apply}


@pytest.mark.parametrize("view", [v for v in VIEWS if v != "reversed"])
@pytest.mark.parametrize("route", ["cpp", "cpp_views", "python"])
def test_markdirty_on_a_view_rebases_the_base_as_torch_does(ops, route, view):
    op = _scalers(ops)[route]
    x = Tensor(np.arange(1.0, 7.0), requires_grad=True)
    a = x * 1.0
    b = VIEWS[view](a)
    r = op(b, 3.0)
    assert r is b
    loss = (a * Tensor(W)).sum() + (b * b).sum()
    g, = grad(loss, x)

    tx = torch.arange(1.0, 7.0, dtype=torch.float64, requires_grad=True)
    ta = tx * 1.0
    tb = VIEWS[view](ta)
    tb.mul_(3.0)
    tloss = (ta * torch.tensor(W)).sum() + (tb * tb).sum()
    tg, = torch.autograd.grad(tloss, tx)
    np.testing.assert_allclose(a.asnumpy(), ta.detach().numpy())
    np.testing.assert_allclose(g.asnumpy(), tg.numpy(), rtol=1e-12)


@pytest.mark.parametrize("route", ["cpp", "python"])
def test_a_view_written_twice_and_a_view_of_a_view(ops, route):
    op = _scalers(ops)[route]
    x = Tensor(np.arange(1.0, 7.0), requires_grad=True)
    a = x * 1.0
    op(a[1:], 2.0)
    op(a.reshape(2, 3)[:, 1], 5.0)
    g, = grad((a * Tensor(W)).sum(), x)
    tx = torch.arange(1.0, 7.0, dtype=torch.float64, requires_grad=True)
    ta = tx * 1.0
    ta[1:].mul_(2.0)
    ta.reshape(2, 3)[:, 1].mul_(5.0)
    tg, = torch.autograd.grad((ta * torch.tensor(W)).sum(), tx)
    np.testing.assert_allclose(g.asnumpy(), tg.numpy(), rtol=1e-12)


def test_markdirty_on_a_reversed_view_rebases_the_base(ops):
    # numpy's negative strides (torch has none): a[::-1] *= 3 then a weighted sum
    x = Tensor(np.arange(1.0, 7.0), requires_grad=True)
    a = x * 1.0
    ops.scale_views_(a[::-1][1:4], 3.0)
    g, = grad((a * Tensor(W)).sum(), x)
    expect = W.copy()
    expect[2:5] *= 3.0  # a[::-1][1:4] is a[4], a[3], a[2]
    np.testing.assert_allclose(g.asnumpy(), expect)


@pytest.mark.parametrize("route", ["cpp", "python"])
def test_a_write_into_a_view_of_a_base_without_grad_gives_the_base_a_history(ops, route):
    add = ops.add_ if route == "cpp" else PyAdd.apply
    base = Tensor(np.zeros(6))
    y = Tensor(np.arange(1.0, 4.0), requires_grad=True)
    add(base[2:5], y)
    assert base.requires_grad and not base.is_leaf
    g, = grad((base * Tensor(W)).sum(), y)
    tbase = torch.zeros(6, dtype=torch.float64)
    ty = torch.arange(1.0, 4.0, dtype=torch.float64, requires_grad=True)
    tbase[2:5].add_(ty)
    tg, = torch.autograd.grad((tbase * torch.tensor(W)).sum(), ty)
    np.testing.assert_allclose(g.asnumpy(), tg.numpy())


# ---- refusals: decided before Forward, the data untouched --------------------------------------------------

@pytest.mark.parametrize("route", ["cpp", "cpp_views", "cpp_mark_after", "python"])
def test_markdirty_on_a_leaf_that_requires_grad_is_refused_and_writes_nothing(ops, route):
    op = _scalers(ops)[route]
    x = Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    v = x._version
    with pytest.raises(RuntimeError, match=DIRTY + r", but it is a leaf that requires grad; in-place changes of "
                                           r"such leaves are not allowed"):
        op(x, 3.0)
    assert x.tolist() == [1.0, 2.0, 3.0] and x._version == v
    t = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        t.mul_(3.0)
    assert t.tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("route", ["cpp", "cpp_views", "cpp_mark_after", "python"])
@pytest.mark.parametrize("view", ["slice", "step", "reshape"])
def test_markdirty_on_a_view_of_a_leaf_that_requires_grad_is_refused_and_writes_nothing(ops, route, view):
    op = _scalers(ops)[route]
    x = Tensor(np.arange(1.0, 7.0), requires_grad=True)
    with pytest.raises(RuntimeError, match=DIRTY + r", but it is a view of a leaf that requires grad; in-place "
                                           r"changes of such views are not allowed"):
        op(VIEWS[view](x), 3.0)
    assert x.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    with rt.no_grad():  # outside recording the write is allowed, as torch's
        op(VIEWS[view](x), 3.0)
    assert x.tolist() != [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


OVERLAP_RE = DIRTY + ": " + re.escape(OVERLAP)


@pytest.mark.parametrize("route", ["cpp", "cpp_views"])
@pytest.mark.parametrize("grad_mode", [True, False])
def test_markdirty_on_an_expanded_tensor_is_refused_as_torch_does(ops, route, grad_mode):
    op = _scalers(ops)[route]
    x = Tensor(np.array([2.0]), requires_grad=True)
    a = x * 1.0  # a non-leaf
    e = rt.ops.broadcast_to(a, (4,))
    assert e._data.strides == (0,)
    with rt.set_grad_enabled(grad_mode):
        with pytest.raises(RuntimeError, match=OVERLAP_RE):
            op(e, 3.0)
    assert a.tolist() == [2.0] and e.tolist() == [2.0] * 4
    ta = torch.tensor([2.0], requires_grad=True) * 1.0
    with torch.set_grad_enabled(grad_mode), pytest.raises(RuntimeError, match="unsupported operation: more than one "
                                                                              "element of the written-to tensor"):
        ta.expand(4).mul_(3.0)


@pytest.mark.parametrize("route", ["cpp", "cpp_views", "cpp_mark_after", "python"])
@pytest.mark.parametrize("grad_mode", [True, False])
def test_markdirty_on_writable_memory_that_elements_share_is_refused_and_put_back(ops, route, grad_mode):
    op = _scalers(ops)[route]
    base = np.array([2.0])
    e = rt.from_numpy(np.lib.stride_tricks.as_strided(base, (4,), (0,)))  # writable: Forward can write it
    with rt.set_grad_enabled(grad_mode):
        with pytest.raises(RuntimeError, match=OVERLAP_RE):
            op(e, 3.0)
    assert base.tolist() == [2.0]


def test_a_writable_expanded_array_is_refused_by_a_declared_inplace_write():
    from runtime.ops import CustomRegOp
    from op_util import CUSTOM_SRC
    info = CustomRegOp("assign_add").input(0, "x", inplace=True).input(1, "y").output(0, "out").get_op_info()
    op = rt.ops.Custom(f"{CUSTOM_SRC / 'aot_inplace.cpp'}:AssignAdd", lambda x, y: x, lambda x, y: x,
                       reg_info=info)
    base = np.array([1.0], np.float32)
    e = np.lib.stride_tricks.as_strided(base, (3,), (0,))  # writable, every element one location
    with pytest.raises(RuntimeError, match=r"Custom 'AssignAdd' writes its input 0 in place \(its reg_info says "
                                           r"inplace\): unsupported operation: more than one element"):
        op(e, np.ones(3, np.float32))
    assert base.tolist() == [1.0]


@pytest.mark.parametrize("route", ["cpp", "python"])
def test_a_refusal_leaves_a_large_argument_untouched(ops, route):
    op = _scalers(ops)[route]
    x = Tensor(np.arange(10000.0), requires_grad=True)  # beyond the sampled-fingerprint size
    with pytest.raises(RuntimeError, match="but it is a leaf that requires grad"):
        op(x, 3.0)
    np.testing.assert_array_equal(x.asnumpy(), np.arange(10000.0))


# ---- an argument returned unchanged shares the caller's version counter -------------------------------------

@pytest.mark.parametrize("requires_grad", [False, True])
def test_an_argument_returned_unchanged_shares_its_version_counter(ops, requires_grad):
    x = Tensor(np.array([1.0, 2.0]), requires_grad=requires_grad)
    y = ops.identity(x)
    assert y is not x and np.shares_memory(y._data, x._data)
    v = x._version
    with rt.no_grad():
        y += 1.0
    assert x._version == v + 1 == y._version
    assert x.tolist() == [2.0, 3.0]


def test_a_write_through_the_returned_argument_is_caught_at_backward(ops):
    x = Tensor(np.array([1.0, 2.0]))
    w = Tensor(np.array([3.0, 4.0]), requires_grad=True)
    z = w * x  # saves x for w's gradient
    y = ops.identity(x)  # no gradient: the fast path
    y += 1.0
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        z.sum().backward()
    tx = torch.tensor([1.0, 2.0])
    tw = torch.tensor([3.0, 4.0], requires_grad=True)
    tz = tw * tx
    ty = tx.view_as(tx)
    ty += 1.0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        tz.sum().backward()


# ---- a gradient of a gradient through a Backward that records no graph --------------------------------------

DOUBLE = (r"{op}: double backward through an opbuilder operator is not supported: its Backward is "
          r"once-differentiable \(create_graph=True, then a gradient of the gradient\)")


def test_double_backward_through_a_cpp_function_is_one_named_error(ops):
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    g, = grad(ops.square(x).sum(), x, create_graph=True)
    np.testing.assert_allclose(g.asnumpy(), [2.0, 4.0])
    assert g.requires_grad
    with pytest.raises(RuntimeError, match=DOUBLE.format(op="Square")):
        grad(g.sum(), x)


def test_double_backward_through_a_numpy_backward_is_the_same_error():
    class NpSquare(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.asnumpy() ** 2

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return 2 * x.asnumpy() * g.asnumpy()

    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    g, = grad(NpSquare.apply(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=DOUBLE.format(op=r"NpSquare \(its gradient 0 is a numpy array\)")):
        grad(g.sum(), x)


def test_a_views_function_that_writes_read_only_memory_says_it_wrote(ops):
    """A kAcceptsViews Function gets the caller's read-only memory itself; one that writes it anyway (against
    is_writable()) and marks it dirty is refused, and the error says the values have changed (it said the
    memory was never written). A Function given a private copy leaves the caller's memory as it was."""
    a = np.arange(1.0, 4.0)
    a.flags.writeable = False
    with pytest.raises(ValueError, match=re.escape(
            "ScaleInplaceViews: argument 0 is read-only memory (a numpy array with writeable=False, a bytes "
            "buffer or a read-only memory map), but Forward marked it dirty (an in-place write); pass a writable "
            "copy, e.g. x * 1. Forward got that memory itself (kAcceptsViews) and wrote it although "
            "is_writable() is false: its values have changed; a Function that accepts views must check "
            "is_writable() before writing") + "$"):
        ops.scale_views_(rt.from_numpy(a), 3.0)
    np.testing.assert_array_equal(a, [3.0, 6.0, 9.0])  # what the message says
    b = np.arange(1.0, 4.0)
    b.flags.writeable = False
    with pytest.raises(ValueError, match=r"ScaleInplace: argument 0 is read-only memory .* e\.g\. x \* 1$"):
        ops.scale_(rt.from_numpy(b), 3.0)
    np.testing.assert_array_equal(b, [1.0, 2.0, 3.0])


@pytest.mark.parametrize("second", ["same view", "another view of the same elements"])
def test_a_function_given_one_view_twice_writes_and_differentiates_as_torch(second):
    """PyAdd(v, v) with v a view of y = x * 1: the base was rebased once per argument, and the second
    rebase found the first one's node (an IndexError after the write). Two views of the same elements:
    the one not marked dirty was called written without mark_dirty, where the marked write explains it.
    torch: y = [2, 4, 3], x.grad = [2, 20, 100] for both."""
    x = Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    y = x * 1
    v = y[0:2]
    PyAdd.apply(v, v if second == "same view" else y[0:2])
    assert y.asnumpy().tolist() == [2.0, 4.0, 3.0]
    (y * Tensor(np.array([1.0, 10.0, 100.0]))).sum().backward()
    assert x.grad.asnumpy().tolist() == [2.0, 20.0, 100.0]


class _WritesBoth(Function):
    """Writes x (marked dirty) and y (not marked)."""

    @staticmethod
    def forward(ctx, x, y):
        x.asnumpy()[...] += 1.0
        y.asnumpy()[...] *= 2.0
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_an_unmarked_write_into_a_view_beside_the_marked_one_is_still_refused():
    """y[::2] and y[1::2] share the bounds of their memory, not one element: the write into the second is
    not explained by the marked first, and stays an error (a bounds-only overlap check had let it pass)."""
    x = Tensor(np.array([1.0, 2.0, 3.0, 4.0]), requires_grad=True)
    y = x * 1
    with pytest.raises(RuntimeError, match=r"_WritesBoth.forward modified argument 1 in place without mark_dirty"):
        _WritesBoth.apply(y[::2], y[1::2])

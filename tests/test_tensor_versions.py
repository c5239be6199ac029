"""One version counter per piece of memory: a write through a view, a detached tensor or another
``from_numpy`` tensor over the same array is seen by the version check of a node that saved the
tensor (the backward raises eager's version error instead of using the written values)."""
from __future__ import annotations

import re

import numpy as np
import pytest

import runtime as rt
from numeric_util import central as _central
from runtime import Parameter, Tensor, jit, ops
from runtime.call_rules import OVERLAP_MESSAGE, PARTIAL_OVERLAP_MESSAGE

OUT_OF_EXP = r"output 0 of exp is at version 1; expected version 0"


def _plus_100(v: Tensor) -> None:
    v += 100


# every way to get a tensor over y's memory, then a write through it
VIEWS = {
    "reshape": lambda y: _plus_100(y.reshape(2, 2)),
    "slice": lambda y: _plus_100(y[0:2]),
    "detach": lambda y: _plus_100(y.detach()),
    "transpose": lambda y: _plus_100(y.reshape(2, 2).T),
    "view of a view": lambda y: _plus_100(y.reshape(2, 2)[1]),
    "setitem on a view": lambda y: y.reshape(2, 2).__setitem__((0, 0), 7.0),
    "expand_dims": lambda y: _plus_100(ops.expand_dims(y, 0)),
    "squeeze": lambda y: _plus_100(ops.squeeze(ops.expand_dims(y, 0))),
    "split": lambda y: _plus_100(ops.split(y, 2)[1]),
    "cast to its own dtype": lambda y: _plus_100(y.astype(rt.float64)),
    "from_dlpack": lambda y: _plus_100(rt.from_dlpack(y)),
    "assign": lambda y: ops.assign(y.reshape(2, 2), Tensor(np.zeros((2, 2)))),
}


@pytest.mark.parametrize("write", list(VIEWS.values()), ids=list(VIEWS))
def test_a_write_through_a_view_of_a_saved_output_fails_the_backward(write):
    x = Tensor(np.array([0.1, 0.2, 0.3, 0.4]), requires_grad=True)
    y = x.exp()
    with rt.no_grad():
        write(y)
    with pytest.raises(RuntimeError, match=OUT_OF_EXP):
        y.sum().backward()


def test_a_write_through_a_view_of_a_saved_argument_fails_the_backward():
    x = Tensor(np.array([[1.0, 2.0], [3.0, 4.0]]), requires_grad=True)
    y = x * x
    with rt.no_grad():
        v = x[1]
        v += 1
    assert x._version == 1 and v._version == 1
    with pytest.raises(RuntimeError, match=r"argument 0 of mul is at version 1; expected version 0"):
        y.sum().backward()


def test_a_write_to_the_base_is_seen_by_a_node_that_saved_a_view():
    x = Tensor(np.array([1.0, 2.0, 3.0, 4.0]), requires_grad=True)
    v = x.reshape(2, 2)
    y = v.sin()  # saves v
    with rt.no_grad():
        other = x.detach()  # another tensor over x's memory
        other += 1
    with pytest.raises(RuntimeError, match=r"argument 0 of sin is at version 1; expected version 0"):
        y.sum().backward()


def test_a_write_to_a_tensor_that_only_looks_like_a_view_leaves_the_gradient_right():
    """New memory (an op's result, a reshape that had to copy) has a counter of its own."""
    a = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    x = Tensor(a, requires_grad=True)
    y = x.exp()
    with rt.no_grad():
        c = y.T.reshape(6)  # not a view: numpy copies a transposed array to flatten it
        c += 100
        d = y + 0
        d += 100
    assert y._version == 0
    y.sum().backward()
    np.testing.assert_allclose(x.grad.asnumpy(), _central(lambda v: np.exp(v).sum(), a), rtol=1e-6)


def test_writing_a_broadcast_view_follows_torchs_expand():
    """torch refuses ``y.expand(2, 3).add_(100)`` (its elements share memory) and writes ``e[1, 0] = v`` or
    ``e[0] += v`` into ``y``. Before, the runtime gave the read-only broadcast a private copy: ``b`` silently
    stopped being a view of ``y``, and ``y`` kept its values."""
    a = np.array([0.5, -1.0, 2.0])
    x = Tensor(a, requires_grad=True)
    y = x.exp()
    ey = np.exp(a)
    with rt.no_grad():
        b = y.broadcast_to((2, 3))
        with pytest.raises(RuntimeError, match=r"^'\+=': " + re.escape(OVERLAP_MESSAGE) + "$"):
            b += 100
        with pytest.raises(RuntimeError, match=r"^Tensor\.__setitem__: " + re.escape(OVERLAP_MESSAGE) + "$"):
            b[:, 0] = 7.0  # a column: two elements over one
        assert y._version == 0 and b.asnumpy().tolist() == [ey.tolist()] * 2
        b[1, 0] = 7.0  # one element: written into y
        row = b[0]  # a view without shared elements: written into y too
        row += 100
    want = [7.0 + 100, ey[1] + 100, ey[2] + 100]
    np.testing.assert_allclose(y.asnumpy(), want)
    np.testing.assert_allclose(b.asnumpy(), [want, want])
    assert y._version == b._version == row._version == 2
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        y.sum().backward()  # exp saved y, which the writes changed
    t = Tensor(np.zeros(1)).broadcast_to((3,))
    with pytest.raises(RuntimeError, match=r"^assign: " + re.escape(OVERLAP_MESSAGE) + "$"):
        rt.ops.assign(t, 1.0)
    e = Tensor(np.zeros(0)).broadcast_to((3, 0))  # no elements: nothing shares memory (torch allows it)
    e += 1
    assert e.shape == (3, 0)


def test_a_write_from_a_value_over_part_of_its_memory_is_refused_as_torch_does():
    x = Tensor(np.arange(5.0))
    with pytest.raises(RuntimeError, match=r"^'\+=': " + re.escape(PARTIAL_OVERLAP_MESSAGE) + "$"):
        x[1:] += x[:-1]
    with pytest.raises(RuntimeError, match=r"^Tensor\.__setitem__: " + re.escape(PARTIAL_OVERLAP_MESSAGE) + "$"):
        x[1:] = x[:-1]
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0] and x._version == 0
    x += x  # the same elements: torch's x.add_(x)
    x[0:2] = x[3:5]  # no shared memory
    assert x.tolist() == [6.0, 8.0, 4.0, 6.0, 8.0]
    x[None] = x  # the same elements in another shape: allowed, as torch's (its setitem expands the value)
    x.reshape(1, 5)[...] = x
    assert x.tolist() == [6.0, 8.0, 4.0, 6.0, 8.0] and x._version == 4
    with pytest.raises(RuntimeError, match=re.escape(PARTIAL_OVERLAP_MESSAGE)):
        x[None] += x  # torch: x.unsqueeze(0).add_(x) is refused (its strides differ)
    m = Tensor(np.arange(8.0).reshape(2, 4))
    m[...] = m[0]  # torch: the value is expanded first, then nothing can be proved: allowed
    m[...] = m[0:1]
    with pytest.raises(RuntimeError, match=re.escape(PARTIAL_OVERLAP_MESSAGE)):
        m += m[0]  # torch's add_ checks the operand as given
    with pytest.raises(RuntimeError, match=re.escape(PARTIAL_OVERLAP_MESSAGE)):
        rt.ops.assign(m, m[0])  # torch's copy_ too
    assert m.tolist() == [[0.0, 1.0, 2.0, 3.0]] * 2


def test_tensors_from_numpy_on_one_array_share_its_counter():
    a = np.array([1.0, 2.0, 3.0])
    w = Tensor(np.array([0.5, 0.5, 0.5]), requires_grad=True)
    t1 = rt.from_numpy(a)
    loss = (w * t1).sum()  # saves t1
    with rt.no_grad():
        t2 = rt.from_numpy(a[1:])
        t2 += 10
    assert t1._version == 1 and rt.from_numpy(a)._version == 1
    with pytest.raises(RuntimeError, match=r"argument 1 of mul is at version 1; expected version 0"):
        loss.backward()


def test_from_numpy_on_different_arrays_counts_apart():
    a, b = np.ones(2), np.ones(2)
    t = rt.from_numpy(a)
    with rt.no_grad():
        u = rt.from_numpy(b)
        u += 1
    assert t._version == 0 and u._version == 1


def test_the_version_attribute_is_one_count_for_every_view():
    """``_version`` is what the C++ side reads and sets (MarkDirty): a set through a view is the base's."""
    x = Tensor(np.zeros((2, 3)))
    v = x[0]
    v._version = v._version + 1
    assert x._version == 1 and x.detach()._version == 1 and x.reshape(6)._version == 1
    assert Tensor(np.zeros(2))._version == 0  # a new tensor starts at 0


def test_set_data_leaves_the_old_memory_to_its_views():
    p = Parameter(np.array([1.0, 2.0]), name="p")
    old = p.detach()  # over the old memory
    w = Tensor(np.array([3.0, -1.0]), requires_grad=True)
    y = (w * old).sum()  # saves old
    p.set_data(np.array([5.0, 6.0]))
    assert p._version == 1 and old._version == 0
    y.backward()  # the old memory was not written: the gradient is right
    np.testing.assert_allclose(w.grad.asnumpy(), _central(lambda v: (v * np.array([1.0, 2.0])).sum(),
                                                          w.asnumpy()), rtol=1e-6)


def test_a_jitted_output_written_through_a_view_fails_the_backward():
    f = jit(lambda x: ops.exp(x) * 1.0 + ops.exp(x))
    x = Tensor(np.array([0.1, 0.2, 0.3, 0.4]), requires_grad=True)
    y = jit(lambda t: ops.exp(t))(x)
    with rt.no_grad():
        _plus_100(y.reshape(2, 2))
    with pytest.raises(RuntimeError, match=r"modified by an in-place operation"):
        y.sum().backward()
    z = f(x)  # unwritten: the gradient is right
    z.sum().backward()
    np.testing.assert_allclose(x.grad.asnumpy(), _central(lambda v: 2 * np.exp(v).sum(), x.asnumpy()), rtol=1e-6)


def test_a_write_into_an_argument_no_rule_reads_leaves_the_gradient_right():
    """add's and transpose's derivatives read no value of their arguments (as in PyTorch, nothing is
    checked there); mul's read the other factor, which is checked."""
    a0, b0 = np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([[0.5, -1.0], [2.0, 0.25]])
    a, b = Tensor(a0, requires_grad=True), Tensor(b0, requires_grad=True)
    z = a * 1.0
    y = (z.T + b) * b
    with rt.no_grad():
        z += 100  # read by no rule: transpose's and add's derivatives take only g
    y.sum().backward()
    np.testing.assert_allclose(a.grad.asnumpy(), _central(lambda v: ((v.T + b0) * b0).sum(), a0), rtol=1e-6)
    np.testing.assert_allclose(b.grad.asnumpy(), _central(lambda v: ((a0.T + v) * v).sum(), b0), rtol=1e-6)


def test_writable_memory_elements_share_takes_one_element_writes_only():
    """A writable tensor whose elements share memory (a C++ op's expand, numpy's as_strided): as torch, a
    write into several elements over one is refused; one element is written where it lives. Before, ``*=``
    wrote the shared element as numpy's ufunc happened to, with no error."""
    base = np.array([2.0])
    e = rt.from_numpy(np.lib.stride_tricks.as_strided(base, (4,), (0,)))
    with pytest.raises(RuntimeError, match=r"^'\*=': " + re.escape(OVERLAP_MESSAGE) + "$"):
        e *= 2
    assert base.tolist() == [2.0] and e._version == 0
    e[1] = 7.0  # torch: e = x.expand(4); e[1] = 7 writes x
    assert base.tolist() == [7.0] and e.tolist() == [7.0] * 4 and e._version == 1
    rows = rt.from_numpy(np.lib.stride_tricks.as_strided(np.zeros((1, 2)), (3, 2), (0, 8)))
    rows[np.array(1)] = np.array([5.0, 6.0])  # a 0-d integer index is an int (torch writes one row)
    assert rows.tolist() == [[5.0, 6.0]] * 3


def test_memory_a_user_made_read_only_is_never_written_through_a_view():
    """Only views the runtime made read-only (a broadcast of a writable tensor) are written in place; an
    array its owner marked read-only keeps getting a private copy, whatever memory lies under it."""
    a = np.arange(3.0)
    v = a.view()
    v.flags.writeable = False  # the user's choice
    t = rt.from_numpy(v)
    b = t.broadcast_to((2, 3))[0]
    b += 100  # b's base t is read-only too: b gets its own copy
    t2 = rt.from_numpy(v)[1:]
    t2 += 1
    assert a.tolist() == [0.0, 1.0, 2.0] and b.tolist() == [100.0, 101.0, 102.0] and t2.tolist() == [2.0, 3.0]


def test_a_broadcast_is_written_where_its_memory_lives_whoever_owns_it():
    """A broadcast of writable memory is writable, as torch's expand: a write into one of its rows reaches
    the memory whether the tensor it came from is gone, or the memory is Fortran-ordered or a bytearray's.
    Before, such a row got a silent private copy: the base kept its values and its version."""
    a = np.arange(3.0)
    row = rt.from_numpy(a).broadcast_to((2, 3))[0]  # the from_numpy Tensor is a temporary
    row += 10
    assert a.tolist() == [10.0, 11.0, 12.0]
    y = Tensor(np.arange(3.0))
    v = y[:]
    c = y.broadcast_to((2, 3))[0]
    del y
    c += 1
    assert v.tolist() == [1.0, 2.0, 3.0] and v._version == 1
    f = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    cf = rt.from_numpy(f).broadcast_to((4, 2, 3))[1]
    cf += 10
    assert f.tolist() == [[10.0, 11.0, 12.0], [13.0, 14.0, 15.0]]
    buf = np.frombuffer(bytearray(24), np.float64)
    cb = rt.from_numpy(buf).broadcast_to((2, 3))[0]
    cb += 10
    assert buf.tolist() == [10.0] * 3


def test_a_view_made_under_no_grad_is_not_written_with_grad_on():
    """torch refuses writing, with grad mode on, a view made under no_grad of a tensor that requires grad;
    the runtime's C++ and Custom writes did, its own ``+=``, ``x[i] = v`` and ``ops.assign`` did not."""
    p = Tensor(np.ones(3), requires_grad=True)
    with rt.no_grad():
        v = p[0:2]
        b = p.broadcast_to((2, 3))[0]
    for write in (lambda: v.__iadd__(1.0), lambda: v.__setitem__(0, 5.0), lambda: rt.ops.assign(b, 2.0)):
        with pytest.raises(RuntimeError, match="a view was created in no_grad mode and is being modified in place"):
            write()
    assert p.tolist() == [1.0, 1.0, 1.0]
    with rt.no_grad():
        v += 1  # under no_grad: a plain data update
    assert p.tolist() == [2.0, 2.0, 1.0]


def test_a_view_of_a_view_made_under_no_grad_is_not_written_with_grad_on():
    """torch: "a view of a view which was created in no_grad mode". Before, w = v[0:1] (made with grad on)
    was written, and x.grad came out [20, 16, 24] where element 0 gets none."""
    x = Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    y = x * 2.0
    with rt.no_grad():
        v = y[0:2]
    w = v[0:1]
    with pytest.raises(RuntimeError, match="a view was created in no_grad mode and is being modified in place"):
        w += 3.0
    with pytest.raises(RuntimeError, match="a view was created in no_grad mode and is being modified in place"):
        v.broadcast_to((2, 2))[0, 0] = 5.0
    (y * y).sum().backward()
    np.testing.assert_allclose(x.grad.asnumpy(), [8.0, 16.0, 24.0])


def test_a_broadcast_read_after_its_base_was_written_gets_every_rows_gradient():
    """The broadcast's history becomes "a part of its base" after the base is written; its rows are one
    memory, so their gradients add up. Before, the scatter kept the last row's: [10, 20, 30] for torch's
    [11, 22, 33]."""
    w = np.array([[1.0, 2.0, 3.0], [10.0, 20.0, 30.0]])
    x = Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    h = x * 1.0
    b = h.broadcast_to((2, 3))
    with rt.no_grad():
        h *= 3.0
    (b * Tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.asnumpy(), w.sum(0))

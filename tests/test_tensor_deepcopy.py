"""copy.deepcopy, copy.copy and pickle of runtime tensors follow torch's rules: only a leaf is deep-copied;
a copy is a leaf with memory of its own; tensors copied together that shared memory share the copy; a
pickled view keeps its own elements. No op is compiled here."""
import copy
import pickle

import numpy as np
import pytest

import runtime as rt
from runtime import Parameter, Tensor
from runtime.nn import Cell

NON_LEAF = ("Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol at the "
            "moment (copy.deepcopy of a tensor with history; detach() it first)")


@pytest.mark.parametrize("pick", [lambda b: b, lambda b: b[1:], lambda b: b.reshape(3, 1), lambda b: b[::2]],
                         ids=["result", "slice", "reshape", "strided"])
def test_deepcopy_of_a_tensor_with_history_is_refused(pick):
    a = Tensor(np.array([1., 2., 3.]), requires_grad=True)

    def f(x):
        copy.deepcopy(pick(x * 2.0))
        return (x * x).sum()

    with pytest.raises(RuntimeError) as e:
        rt.grad(f)(a)
    assert str(e.value) == NON_LEAF


def test_deepcopy_of_a_leaf_is_a_leaf_with_its_own_memory_and_grad():
    a = Tensor(np.array([1., 2., 3.]), requires_grad=True)
    a.grad = Tensor(np.array([4., 5., 6.]))
    c = copy.deepcopy(a)
    assert c.is_leaf and c.requires_grad and c._base is None
    assert not np.shares_memory(c._data, a._data)
    np.testing.assert_array_equal(c.asnumpy(), [1., 2., 3.])
    np.testing.assert_array_equal(c.grad.asnumpy(), [4., 5., 6.])
    assert c.grad is not a.grad


def test_a_write_into_a_deep_copied_leaf_leaves_the_original():
    a = Tensor(np.array([1., 2., 3.]), requires_grad=True)
    c = copy.deepcopy(a)
    c[0] = 10.0
    np.testing.assert_array_equal(a.asnumpy(), [1., 2., 3.])
    assert (a._version, c._version) == (0, 1)


def test_deepcopy_of_a_no_grad_view_is_an_independent_leaf():
    b = Tensor(np.array([1., 2., 3., 4.]), requires_grad=True)
    with rt.no_grad():
        v = b[1:]
    c = copy.deepcopy(v)
    assert c._base is None and c.is_leaf and not c.requires_grad
    c[0] = 20.0  # torch: the copy is a leaf of its own; its write reaches neither b nor v
    np.testing.assert_array_equal(c.asnumpy(), [20., 3., 4.])
    np.testing.assert_array_equal(b.asnumpy(), [1., 2., 3., 4.])
    np.testing.assert_array_equal(v.asnumpy(), [2., 3., 4.])


@pytest.mark.parametrize("order", ["base first", "view first"])
@pytest.mark.parametrize("container", [list, tuple, lambda xs: dict(enumerate(xs))], ids=["list", "tuple", "dict"])
def test_tensors_copied_together_share_the_copied_memory_and_its_counter(order, container):
    a = Tensor(np.arange(6.).reshape(2, 3))
    v = a.T[1]  # a strided view: the middle column
    items = [a, v] if order == "base first" else [v, a]
    got = copy.deepcopy(container(items))
    got = list(got.values()) if isinstance(got, dict) else list(got)
    a2, v2 = got if order == "base first" else got[::-1]
    assert np.shares_memory(a2._data, v2._data) and not np.shares_memory(a2._data, a._data)
    before = a2._version
    v2[...] = np.array([10., 40.])
    np.testing.assert_array_equal(a2.asnumpy(), [[0., 10., 2.], [3., 40., 5.]])
    np.testing.assert_array_equal(a.asnumpy(), np.arange(6.).reshape(2, 3))  # the original is untouched
    assert a2._version == v2._version == before + 1  # a write through one is seen by the other's checks


def test_copies_from_two_deepcopy_calls_do_not_share_memory():
    a = Tensor(np.arange(3.))
    c1, c2 = copy.deepcopy(a), copy.deepcopy(a)
    c1[0] = 7.0
    assert c2.asnumpy()[0] == 0.0


def test_a_copied_parameter_keeps_its_class_name_and_values():
    p = Parameter(np.array([1., 2.], dtype=np.float32), name="w")
    c = copy.deepcopy(p)
    assert type(c) is Parameter and c.name == "w" and c.requires_grad
    np.testing.assert_array_equal(c.asnumpy(), p.asnumpy())
    assert not np.shares_memory(c._data, p._data)


class _Scale(Cell):
    def __init__(self):
        super().__init__()
        self.w = Parameter(np.array([2., 3.]), name="w")

    def construct(self, x):
        return (self.w * x).sum()


def test_a_deep_copied_cell_trains_apart_from_the_original():
    m = _Scale()
    m2 = copy.deepcopy(m)
    x = Tensor(np.array([1., 4.]))
    _, grads = rt.value_and_grad(m2, None, m2.trainable_params())(x)
    with rt.no_grad():
        m2.w[...] = m2.w.asnumpy() - 0.5 * grads[0].asnumpy()
    np.testing.assert_array_equal(m.w.asnumpy(), [2., 3.])
    np.testing.assert_allclose(m2.w.asnumpy(), [1.5, 1.0])


def test_pickle_of_a_view_keeps_its_own_elements_as_a_leaf():
    v = Tensor(np.arange(4.))[1:]
    r = pickle.loads(pickle.dumps(v))
    assert r._base is None and r.is_leaf
    np.testing.assert_array_equal(r.asnumpy(), [1., 2., 3.])


def test_pickle_of_a_result_is_a_leaf_that_requires_grad():
    a = Tensor(np.array([1., 2.]), requires_grad=True)
    seen = []

    def f(x):
        y = x * 3.0
        seen.append(pickle.loads(pickle.dumps(y)))
        return y.sum()

    rt.grad(f)(a)
    r = seen[0]
    assert r.is_leaf and r.requires_grad  # as torch's: the history stays in this process
    np.testing.assert_array_equal(r.asnumpy(), [3., 6.])


def test_shallow_copy_shares_memory_and_the_write_counter():
    a = Tensor(np.arange(3.))
    c = copy.copy(a)
    assert c is not a and c._data is a._data and c.is_leaf
    c[1] = 9.0
    assert a.asnumpy()[1] == 9.0 and a._version == c._version == 1

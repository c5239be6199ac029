"""``Tensor(data)`` and ``Parameter(data)`` copy the caller's array (as ``torch.tensor`` and MindSpore's
``Tensor``); ``runtime.from_numpy`` and ``as_tensor`` share its memory."""
from __future__ import annotations

import numpy as np
import pytest

import runtime as rt
from numeric_util import central as _central
from runtime import Parameter, Tensor, nn
from runtime.tensor import as_tensor


def test_a_loader_that_refills_one_buffer_gets_the_right_gradient():
    batches = [np.array([1.0, 2.0]), np.array([3.0, 4.0])]
    w0 = np.array([0.5, -0.5])
    w = Parameter(w0, name="w")
    buf = np.empty(2)
    loss = None
    for b in batches:  # micro-batches, one backward at the end
        buf[:] = b
        term = (w * Tensor(buf)).sum()
        loss = term if loss is None else loss + term
    loss.backward()
    want = _central(lambda v: sum((v * b).sum() for b in batches), w0)
    np.testing.assert_allclose(w.grad.asnumpy(), want, rtol=1e-6)  # [4, 6], not [6, 8]


def test_parameters_made_from_one_array_are_not_tied():
    a = np.array([1.0, 2.0], np.float32)
    p1, p2 = Parameter(a, name="p1"), Parameter(a, name="p2")
    opt = nn.SGD([p1], learning_rate=0.5)
    opt((Tensor(np.array([1.0, 1.0], np.float32)),))
    assert p1.tolist() == [0.5, 1.5] and p2.tolist() == [1.0, 2.0] and a.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("make", [Tensor, Parameter], ids=["Tensor", "Parameter"])
def test_the_constructor_copies_an_array_both_ways(make):
    a = np.array([1.0, 2.0, 3.0])
    t = make(a)
    a[0] = 9.0
    assert t.tolist() == [1.0, 2.0, 3.0]
    with rt.no_grad():
        t += 1
    assert a.tolist() == [9.0, 2.0, 3.0] and not np.shares_memory(t.asnumpy(), a)


@pytest.mark.parametrize("src", [
    lambda: np.arange(6.0).reshape(2, 3)[:, 1],  # a view
    lambda: np.frombuffer(bytearray(np.arange(3, dtype=np.float32).tobytes()), np.float32),  # a foreign buffer
    lambda: Tensor(np.arange(3.0)),  # a tensor
], ids=["view", "buffer", "tensor"])
def test_the_constructor_copies_views_buffers_and_tensors(src):
    s = src()
    t = Tensor(s)
    assert t.tolist() == np.asarray(s).tolist() and not np.shares_memory(t.asnumpy(), np.asarray(s))


def test_a_converting_constructor_gives_new_memory():
    a = np.array([1.0, 2.0], np.float64)
    t = Tensor(a, rt.float32)
    assert t.dtype == rt.float32 and not np.shares_memory(t.asnumpy(), a)


def test_from_numpy_shares_memory_both_ways():
    a = np.array([1.0, 2.0, 3.0], np.float32)
    t = rt.from_numpy(a)
    a[0] = 7.0
    assert t.tolist() == [7.0, 2.0, 3.0]
    with rt.no_grad():
        t += 1
    assert a.tolist() == [8.0, 3.0, 4.0] and t.asnumpy() is a


def test_as_tensor_shares_an_array():
    a = np.arange(3.0)
    assert as_tensor(a).asnumpy() is a


def test_from_numpy_refuses_what_it_cannot_share():
    with pytest.raises(TypeError, match=r"from_numpy expects a numpy.ndarray, got list"):
        rt.from_numpy([1.0, 2.0])
    with pytest.raises(TypeError, match=r"from_numpy: the array's dtype >f8 is not in this machine's byte order"):
        rt.from_numpy(np.arange(3.0).astype(">f8"))
    with pytest.raises(TypeError, match="supported"):
        rt.from_numpy(np.zeros(2, np.longdouble))  # (complex64, the example here, is a tensor dtype now)


def test_set_data_copies_the_array_it_is_given():
    a = np.array([1.0, 2.0])
    p = Parameter(np.zeros(2), name="p")
    p.set_data(a)
    a[0] = 9.0
    assert p.tolist() == [1.0, 2.0] and not np.shares_memory(p.asnumpy(), a)


@pytest.mark.skipif(not rt.cuda.is_available(), reason="no usable GPU")
def test_the_constructor_copies_a_gpu_array():
    import cupy as cp
    a = cp.arange(3, dtype=cp.float32)
    t = Tensor(a)
    a[0] = 9.0
    assert t.device == "GPU:0" and t.tolist() == [0.0, 1.0, 2.0]

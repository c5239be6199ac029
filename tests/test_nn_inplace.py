"""In-place writes: ``net.w -= x`` keeps the Cell's Parameter (same object, updated, version bumped),
``Tensor.__setitem__``, ``ops.assign``, ``Parameter.set_data``; writes that would lose a gradient are refused."""
import numpy as np
import pytest

import runtime as rt
from runtime import Parameter, Tensor, nn, ops


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = Parameter(np.array([1.0, 2.0], np.float32), name="w")
        self.b = Parameter(np.float32(0.5), name="b")

    def construct(self, x):
        return (x * self.w).sum() + self.b


def test_inplace_operators_keep_the_parameter_of_its_cell():
    net = Net()
    w = net.w
    buf = w.asnumpy()
    v0 = w._version
    net.w -= Tensor(np.array([0.5, 0.5], np.float32))
    net.w *= 2
    net.w += 1
    net.w /= 2
    assert net.w is w and isinstance(net.w, Parameter)
    assert net.w.asnumpy() is buf  # updated in place, no new buffer
    assert w.tolist() == [1.0, 2.0]  # ((1-.5)*2+1)/2, ((2-.5)*2+1)/2
    assert w._version == v0 + 4 and w.dtype == rt.float32
    assert [n for n, _ in net.parameters_and_names()] == ["w", "b"]  # order kept
    assert [id(p) for p in net.trainable_params()] == [id(w), id(net.b)]


def test_manual_sgd_loop_trains():
    net = Net()
    x = Tensor(np.array([1.0, -1.0], np.float32))
    grad_fn = rt.value_and_grad(lambda x: (net(x) - 3.0) ** 2, None, net.trainable_params())
    first = None
    for _ in range(30):
        loss, grads = grad_fn(x)
        first = float(loss) if first is None else first
        for p, g in zip(net.trainable_params(), grads):
            p -= 0.05 * g
    assert len(net.trainable_params()) == 2
    assert float(loss) < 1e-3 * first


def test_a_saved_parameter_changed_in_place_is_reported_at_backward():
    w = Parameter(np.array([1.0, 2.0]), name="w")
    y = (w * w).sum()
    w -= 1.0
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        y.backward()


def test_setitem_and_assign():
    t = Tensor(np.zeros((2, 3), np.float32))
    t[0] = 1.0
    t[1, 1:] = Tensor(np.array([2.0, 3.0], np.float32))
    t[Tensor(np.array([0])), 2] = 9
    assert t.tolist() == [[1, 1, 9], [0, 2, 3]] and t._version == 3
    p = Parameter(np.zeros(3, np.float32))
    assert ops.assign(p, Tensor(np.array([1.0, 2.0, 3.0]))) is p  # cast to the variable's dtype
    assert p.tolist() == [1, 2, 3] and p.dtype == rt.float32
    ops.assign(p, 7.0)
    assert p.tolist() == [7, 7, 7]
    p.set_data(np.array([4.0, 5.0, 6.0]))
    assert p.tolist() == [4, 5, 6] and p.dtype == rt.float32


def test_read_only_data_is_copied_before_a_write():
    src = np.broadcast_to(np.float32(1.0), (3,))  # read-only
    p = Parameter(src)
    p += 1
    assert p.tolist() == [2, 2, 2] and src.tolist() == [1, 1, 1]


def test_writes_that_would_lose_a_gradient_are_refused():
    x = Tensor(np.ones(3), requires_grad=True)
    y = x * 2
    with pytest.raises(RuntimeError, match="output of a recorded op"):
        y += 1
    with pytest.raises(RuntimeError, match="output of a recorded op"):
        y[0] = 5.0
    t = Tensor(np.zeros(3))
    with pytest.raises(RuntimeError, match="the value written requires grad"):
        t[0] = y[1]
    with pytest.raises(RuntimeError, match="the value written requires grad"):
        ops.assign(t, y)
    with rt.no_grad():  # outside recording the same writes are plain data updates
        y += 1
        t[0] = y[1]
    assert t.tolist() == [3.0, 0.0, 0.0]


def test_bad_inplace_inputs():
    i = Tensor(np.array([1, 2], np.int32))
    for other in (0.5, Tensor(np.array([1.5, 2.0], np.float32))):  # it quoted numpy's "from dtype('float64')"
        with pytest.raises(TypeError) as info:
            i += other
        assert str(info.value) == ("'+=': a floating-point result cannot be written into a Int32 tensor in place "
                                   "(as torch refuses it); use x = x + y to get a new tensor")
    assert i.tolist() == [1, 2]
    with pytest.raises(TypeError, match=r"'/=' on a Int32 tensor would need a floating-point result"):
        i /= 2
    f = Tensor(np.zeros(2, np.float32))
    with pytest.raises(ValueError, match=r"a tensor of shape \[2\] cannot be updated in place with a value of "
                                         r"shape \[3, 2\]"):
        f += np.ones((3, 2), np.float32)
    with pytest.raises(ValueError, match=r"cannot write a value of shape \[3\]"):
        f[:] = np.ones(3)
    with pytest.raises(TypeError, match="cannot write float64 values into a Int32 tensor"):
        i[0] = 1.5
    with pytest.raises(ValueError, match=r"a value of shape \[4\] does not fit a variable of shape \[2\]"):
        ops.assign(f, np.ones(4))
    with pytest.raises(TypeError, match="variable must be a Parameter or Tensor"):
        ops.assign(np.zeros(2), 1.0)
    assert i.tolist() == [1, 2] and f.tolist() == [0, 0]

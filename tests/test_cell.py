"""nn.Cell: parameter and sub-cell registration, and a user bprop."""
import numpy as np
import pytest

import runtime as rt
from runtime import Parameter, Tensor, nn, ops


class Inner(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = Parameter(np.ones(2, np.float32))
        self.frozen = Parameter(np.zeros(2, np.float32), requires_grad=False)

    def construct(self, x):
        return x * self.w + self.frozen


class Outer(nn.Cell):
    def __init__(self):
        super().__init__()
        self.inner = Inner()
        self.scale = Parameter(2.0, name="scale")
        self.shared = self.inner.w  # the same Parameter twice: listed once

    def construct(self, x):
        return self.inner(x) * self.scale


def test_registration_and_listing():
    net = Outer()
    names = [n for n, _ in net.parameters_and_names()]
    # a cell's own parameters first, in assignment order; a shared one is listed once
    assert names == ["scale", "shared", "inner.frozen"]
    assert [id(p) for p in net.trainable_params()] == [id(net.scale), id(net.inner.w)]
    assert net.inner.w.name == "inner.w"  # named where it was first registered, with its cell path (auto_prefix)
    assert len(list(net.get_parameters())) == 3
    assert net(Tensor(np.array([1.0, 2.0], np.float32))).asnumpy().tolist() == [2.0, 4.0]


def test_parameters_are_listed_depth_first_like_mindspore():
    class Leaf(nn.Cell):
        def __init__(self):
            super().__init__()
            self.p = Parameter(1.0)

    class A(nn.Cell):
        def __init__(self):
            super().__init__()
            self.leaf = Leaf()

    class Top(nn.Cell):
        def __init__(self):
            super().__init__()
            self.a = A()
            self.b = Leaf()
            self.q = Parameter(2.0)

    top = Top()
    assert [n for n, _ in top.parameters_and_names()] == ["q", "a.leaf.p", "b.p"]
    assert [n for n, _ in top.cells_and_names()] == ["", "a", "a.leaf", "b"]


def test_reassigning_a_parameters_name_keeps_it_unless_none():
    """None unregisters a Parameter (as torch's). A number in its place dropped it silently, an optimizer
    made before then training an orphan (attack on 13161c5): a TypeError now, as MindSpore's and torch's."""
    net = Inner()
    with pytest.raises(TypeError, match=r"^cannot assign a value of type int to Parameter 'w' of Inner: assign a "
                                        r"Parameter, a Tensor \(its new data\), or None \(which removes it\)$"):
        net.w = 3
    with pytest.raises(TypeError, match=r"^cannot assign a value of type numpy.ndarray to Parameter 'w'"):
        net.w = np.ones(2, np.float32)
    assert [n for n, _ in net.parameters_and_names()] == ["w", "frozen"]
    net.w = None
    assert [n for n, _ in net.parameters_and_names()] == ["frozen"]
    net.w = 3  # no Parameter of that name now: a plain attribute
    assert net.w == 3


def test_a_tensor_assigned_to_a_parameters_name_sets_its_data():
    """net.weight = Tensor(...) replaced the Parameter: trainable_params lost it, an optimizer made before
    trained the orphan while forward used the Tensor (attack on 07d2521). As MindSpore's Cell, it sets the
    Parameter's data; the Parameter, its name and its place stay."""
    net = nn.Dense(2, 1)
    w = net.weight
    opt = nn.SGD(net.trainable_params(), 0.1)
    net.weight = Tensor(np.full((1, 2), 0.5, np.float32))
    assert net.weight is w and [p.name for p in net.trainable_params()] == ["weight", "bias"]
    np.testing.assert_array_equal(w.asnumpy(), [[0.5, 0.5]])
    net.weight = net.weight * 2.0  # a Tensor with history: its values
    assert net.weight is w and w.requires_grad and w.asnumpy().tolist() == [[1.0, 1.0]]
    x = Tensor(np.ones((1, 2), np.float32))
    for _ in range(2):
        _, g = rt.value_and_grad(lambda a: net(a).sum(), None, opt.parameters)(x)
        opt(g)
    np.testing.assert_allclose(w.asnumpy(), [[0.8, 0.8]], rtol=1e-6)


def test_parameter_before_init_is_an_error():
    class Bad(nn.Cell):
        def __init__(self):
            self.p = Parameter(1.0)
            super().__init__()

    with pytest.raises(AttributeError, match="super\\(\\).__init__"):
        Bad()


def test_construct_is_required():
    with pytest.raises(NotImplementedError, match="construct"):
        nn.Cell()(Tensor(1.0))


class Square(nn.Cell):
    def construct(self, x):
        return x * x

    def bprop(self, x, out, dout):
        return (dout * 10,)  # deliberately not 2x: shows bprop replaced the backward


def test_user_bprop_replaces_backward():
    g = rt.grad(Square())(Tensor(3.0))
    assert g.item() == 10.0
    assert Square()(Tensor(3.0)).item() == 9.0


class AddCell(nn.Cell):
    def construct(self, x, y):
        return x + y

    def bprop(self, x, y, out, dout):
        return (y, x)  # the seed's pattern: gradients need not be the true ones


def test_bprop_with_two_inputs_and_grad_position():
    t1, t2 = Tensor([1.0, 2.0, 3.0]), Tensor([3.0, 2.0, 1.0])
    g = rt.grad(AddCell(), grad_position=(0,))(t1, t2)
    assert isinstance(g, Tensor)  # a one-position tuple gives the gradient itself, as MindSpore
    np.testing.assert_array_equal(g.asnumpy(), [3.0, 2.0, 1.0])


class ExpByOut(nn.Cell):
    """exp(x) * y whose bprop uses out and dout for the true gradients."""

    def construct(self, x, y):
        return rt.ops.exp(x) * y

    def bprop(self, x, y, out, dout):
        return (dout * out, dout * out / y)


def test_bprop_gets_the_real_out_and_dout_inside_a_larger_graph():
    rng = np.random.default_rng(3)
    x, y = Tensor(rng.standard_normal((2, 3))), Tensor(rng.uniform(1.0, 2.0, (2, 3)))
    cell = ExpByOut()
    # dout arrives through sin(); out feeds the rest of the graph too; gradcheck's random output weights
    # make dout anything but ones
    assert rt.gradcheck(lambda a, b: rt.ops.sin(cell(a * 2, b)) + a, [x, y])
    gx, gy = rt.grad(lambda a, b: rt.ops.sin(cell(a * 2, b)).sum(), grad_position=(0, 1))(x, y)
    inner = np.exp(2 * x.asnumpy()) * y.asnumpy()
    np.testing.assert_allclose(gx.asnumpy(), np.cos(inner) * inner * 2)
    np.testing.assert_allclose(gy.asnumpy(), np.cos(inner) * inner / y.asnumpy())


class BadBprop(nn.Cell):
    def construct(self, x):
        return x * 2

    def bprop(self, x, out, dout):
        return dout


def test_bprop_must_return_a_tuple():
    with pytest.raises(TypeError, match="BadBprop.bprop must return a tuple"):
        rt.grad(BadBprop())(Tensor(1.0))


class NumpyBprop(nn.Cell):
    def construct(self, x):
        return x * x

    def bprop(self, x, out, dout):
        return (2 * x.asnumpy() * dout.asnumpy(),)  # numpy: first order only


def test_bprop_returning_numpy_is_first_order_only():
    x = Tensor(np.array([1.5, -2.0]))
    np.testing.assert_allclose(rt.grad(NumpyBprop())(x).asnumpy(), [3.0, -4.0])
    with pytest.raises(RuntimeError, match="NumpyBprop.bprop is once-differentiable"):
        rt.grad(lambda t: rt.grad(NumpyBprop())(t).sum())(x)


class ScaledBprop(nn.Cell):
    """construct x * w; bprop deliberately 100x, so which one ran is visible."""

    def __init__(self):
        super().__init__()
        self.w = Parameter(Tensor(np.array(2.0)), name="w")

    def construct(self, x):
        return x * self.w

    def bprop(self, x, out, dout):
        return (dout * self.w * 100,)


def test_a_bprop_cell_gives_its_parameters_the_same_gradient_however_grad_is_asked():
    """bprop decides the gradients whenever one is recorded, also when only the cell's own Parameters
    require grad: never autodiff through construct. Its Parameters get none from it (zeros), as in MindSpore."""
    c = ScaledBprop()
    x = Tensor(np.array([1.0, 2.0, 3.0]))
    f = lambda t: ops.sum(c(t))  # noqa: E731
    (gw,) = rt.grad(f, None, [c.w])(x)
    gx, (gw2,) = rt.grad(f, 0, [c.w])(x)
    assert gw.asnumpy() == 0.0 and gw2.asnumpy() == 0.0
    np.testing.assert_array_equal(gx.asnumpy(), [200.0, 200.0, 200.0])


def test_a_bprop_cell_called_with_keywords_gets_them_in_place():
    class Mul(nn.Cell):
        def construct(self, x, y):
            return x * y

        def bprop(self, x, y, out, dout):
            return (dout * y, dout * x)

    c = Mul()
    x, y = Tensor(np.array([1.0, 2.0])), Tensor(np.array([3.0, 5.0]))
    gx, gy = rt.grad(lambda a, b: ops.sum(c(a, y=b)), (0, 1))(x, y)
    np.testing.assert_array_equal(gx.asnumpy(), [3.0, 5.0])
    np.testing.assert_array_equal(gy.asnumpy(), [1.0, 2.0])
    with pytest.raises(TypeError, match=r"^Mul: got an unexpected keyword argument 'z'$"):
        rt.grad(lambda a: ops.sum(c(a, y, z=y)))(x)

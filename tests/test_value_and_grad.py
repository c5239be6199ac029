"""value_and_grad / grad with MindSpore's conventions."""
import numpy as np
import pytest

import runtime as rt
from runtime import Parameter, Tensor, nn, ops as F


def f(x, y):
    return x * x * y


x0, y0 = Tensor(3.0, rt.float32), Tensor(2.0, rt.float32)


def test_int_position_gives_one_gradient():
    out, g = rt.value_and_grad(f, grad_position=0)(x0, y0)
    assert out.item() == 18.0 and isinstance(g, Tensor) and g.item() == 12.0


def test_tuple_position_gives_tuple():
    _, g = rt.value_and_grad(f, grad_position=(1, 0))(x0, y0)
    assert isinstance(g, tuple) and [t.item() for t in g] == [9.0, 12.0]


def test_inputs_need_no_requires_grad_and_are_not_modified():
    a = Tensor(3.0)
    rt.grad(f)(a, y0)
    assert not a.requires_grad and a.grad is None


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = Parameter(np.array([1.0, 2.0], np.float32), name="w")
        self.b = Parameter(0.5)

    def construct(self, x):
        return (x * self.w).sum() + self.b


def test_weights_only_and_both():
    net = Net()
    x = Tensor(np.array([3.0, 4.0], np.float32))
    _, wg = rt.value_and_grad(net, grad_position=None, weights=net.trainable_params())(x)
    assert isinstance(wg, tuple) and len(wg) == 2
    np.testing.assert_array_equal(wg[0].asnumpy(), [3.0, 4.0])
    assert wg[1].item() == 1.0
    _, (ig, wg2) = rt.value_and_grad(net, grad_position=0, weights=net.trainable_params())(x)
    np.testing.assert_array_equal(ig.asnumpy(), [1.0, 2.0])
    assert len(wg2) == 2
    g_single = rt.grad(net, grad_position=None, weights=net.w)(x)  # one Parameter -> one gradient
    np.testing.assert_array_equal(g_single.asnumpy(), [3.0, 4.0])


def test_has_aux_differentiates_first_output_only():
    def g(x):
        return x * x, x * 100
    (out, aux), gx = rt.value_and_grad(g, has_aux=True)(Tensor(3.0))
    assert out.item() == 9.0 and aux.item() == 300.0 and gx.item() == 6.0
    gx2, auxs = rt.grad(g, has_aux=True)(Tensor(3.0))
    assert gx2.item() == 6.0 and auxs[0].item() == 300.0


def test_the_value_and_aux_come_back_without_history_at_the_top_level():
    """MindSpore stops the gradient of aux; the runtime returned the value and aux with their graph, which a
    list of each step's logits kept alive. At the top level they are values now (namedtuples kept); inside
    an outer differentiation they keep their history (the outer one differentiates through them)."""
    import collections
    Pair = collections.namedtuple("Pair", "loss logits")

    def g(x):
        logits = x * 100
        return x * x, Pair(x * 3, logits)
    (out, aux), gx = rt.value_and_grad(g, has_aux=True)(Tensor(3.0))
    assert type(aux) is Pair and aux.logits.item() == 300.0 and gx.item() == 6.0
    assert not out.requires_grad and out._node is None
    assert all(not t.requires_grad and t._node is None for t in aux)
    (_, aux), _ = rt.value_and_grad(lambda x: (x * x, {"y": x * 2}), has_aux=True)(Tensor(3.0))
    assert not aux["y"].requires_grad and aux["y"]._node is None and aux["y"].item() == 6.0
    outer = rt.grad(lambda x: rt.value_and_grad(g, has_aux=True)(x)[0][1].logits)(Tensor(3.0))
    assert outer.item() == 100.0  # the inner aux keeps its history for the outer gradient


def test_multiple_outputs_are_summed():
    _, g = rt.value_and_grad(lambda x: (x * 2, x * 3))(Tensor(1.0))
    assert g.item() == 5.0


def test_unused_inputs_get_zeros_of_their_shape():
    _, (gx, gy) = rt.value_and_grad(lambda x, y: x * 2, (0, 1))(Tensor(1.0), Tensor(np.ones((2, 3))))
    assert gx.item() == 2.0 and gy.shape == (2, 3) and not gy.asnumpy().any()
    _, g = rt.value_and_grad(lambda x: Tensor(5.0))(Tensor(np.ones(4)))
    assert g.shape == (4,) and not g.asnumpy().any()


def test_gradient_of_gradient():
    d1 = rt.grad(lambda x: x * x * x)
    d2 = rt.grad(d1)
    d3 = rt.grad(d2)
    x = Tensor(2.0, rt.float64)
    assert d1(x).item() == 12.0 and d2(x).item() == 12.0 and d3(x).item() == 6.0
    assert rt.grad(rt.grad(lambda x: F.sin(x)))(x).item() == pytest.approx(-np.sin(2.0))


@pytest.mark.parametrize("bad", ["0", (0, "1"), (), 1.5, True])
def test_bad_grad_position_is_type_error(bad):
    with pytest.raises(TypeError, match="grad_position must be an int, a non-empty tuple of ints, or None; got"):
        rt.value_and_grad(f, grad_position=bad)


def test_grad_position_out_of_range():
    with pytest.raises(ValueError, match="grad_position 2 is out of range"):
        rt.value_and_grad(f, grad_position=2)(x0, y0)


def test_non_tensor_input_at_grad_position():
    with pytest.raises(TypeError, match="grad_position 0 must be a Tensor"):
        rt.grad(f)(3.0, y0)


def test_neither_positions_nor_weights():
    with pytest.raises(ValueError, match="both are None"):
        rt.value_and_grad(f, grad_position=None)


def test_bad_weights():
    with pytest.raises(TypeError, match="weights must be Parameters"):
        rt.grad(f, weights=[1.0])


def test_function_must_return_tensors():
    with pytest.raises(TypeError, match="must return Tensors"):
        rt.grad(lambda x: 1.0)(x0)


def test_other_inputs_are_constants_and_the_callers_graph_is_left_alone():
    """A weight reached only through an input's history is not differentiated (as MindSpore),
    and the caller's graph is neither followed nor freed."""
    w = Parameter(2.0)
    y = w * 3  # history through w
    _, g = rt.value_and_grad(lambda a, b: (a * b * w).sum(), None, w)(Tensor(1.0), y)
    assert g.item() == 6.0  # d/dw of a*b*w with b constant: a*b = 6 (not 12 through y)
    y.sum().backward()  # the caller's graph is intact
    assert w.grad.item() == 3.0


def test_a_weight_passed_as_an_input_is_still_a_weight():
    w = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    _, g = rt.value_and_grad(lambda x, v: (x * v).sum(), None, [w])(Tensor(np.array([3.0, 4.0])), w)
    np.testing.assert_array_equal(g[0].asnumpy(), [3.0, 4.0])


def test_every_gradient_has_its_own_buffer():
    _, (ga, gb) = rt.value_and_grad(lambda a, b: a + b, (0, 1))(Tensor(np.ones(2)), Tensor(np.ones(2)))
    assert ga is not gb and not np.shares_memory(ga.asnumpy(), gb.asnumpy())
    x1, x2 = Tensor(np.ones(2), requires_grad=True), Tensor(np.ones(2), requires_grad=True)
    (x1 + x2).backward(gradient=np.array([1.0, 2.0]))
    assert not np.shares_memory(x1.grad.asnumpy(), x2.grad.asnumpy())
    seed = np.array([5.0, 6.0])
    x3 = Tensor(np.ones(2), requires_grad=True)
    x3.backward(gradient=seed)  # a leaf's gradient is a copy of the caller's array
    seed[0] = 0.0
    np.testing.assert_array_equal(x3.grad.asnumpy(), [5.0, 6.0])


def test_backward_with_create_graph_keeps_the_graph():
    x = Tensor(np.array([0.5, 1.5]), requires_grad=True)
    F.exp(x).sum().backward(create_graph=True)
    g1 = x.grad
    x.grad = None
    g1.sum().backward()  # second order through exp: needs the first graph kept
    np.testing.assert_allclose(x.grad.asnumpy(), np.exp([0.5, 1.5]))

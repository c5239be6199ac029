"""MindSpore's autodiff and training spellings a ported script uses: ops.GradOperation (get_all,
get_by_list, sens_param), ops.stop_gradient, ParameterTuple, Cell.set_grad, nn.WithLossCell and
nn.TrainOneStepCell. Gradients against central differences in float64. Pure Python: nothing compiles."""
from __future__ import annotations

import numpy as np
import pytest

import runtime as rt
from runtime import Parameter, Tensor, nn, ops

from numeric_util import central

X0 = np.array([0.5, -1.0, 2.0])
Y0 = np.array([1.5, 0.25, -0.75])


def _f(x, y):
    return (x * y * y).sum()


def test_grad_operation_takes_the_first_input_all_inputs_or_the_weights():
    x, y = Tensor(X0), Tensor(Y0)
    gx = ops.GradOperation()(_f)(x, y)
    np.testing.assert_allclose(gx.asnumpy(), central(lambda v: float(np.sum(v * Y0 * Y0)), X0), rtol=1e-7)
    gx2, gy = ops.GradOperation(get_all=True)(_f)(x, y)
    np.testing.assert_allclose(gx2.asnumpy(), gx.asnumpy())
    np.testing.assert_allclose(gy.asnumpy(), central(lambda v: float(np.sum(X0 * v * v)), Y0), rtol=1e-7)

    net = nn.Dense(3, 2)
    weights = rt.ParameterTuple(net.trainable_params())
    loss = lambda t: (net(t) ** 2).sum()  # noqa: E731
    wg = ops.GradOperation(get_by_list=True)(loss, weights)(Tensor(X0.reshape(1, 3).astype(np.float32)))
    want = rt.grad(loss, None, list(weights))(Tensor(X0.reshape(1, 3).astype(np.float32)))
    assert isinstance(wg, tuple) and len(wg) == len(weights) == 2
    for a, b in zip(wg, want):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy())
    both = ops.GradOperation(get_all=True, get_by_list=True)(loss, weights)(Tensor(X0.reshape(1, 3).astype(np.float32)))
    assert len(both) == 2 and len(both[0]) == 1 and len(both[1]) == 2


def test_sens_param_takes_the_last_input_as_the_outputs_gradient():
    s0 = np.array([2.0, -3.0, 0.5])
    x, y, sens = Tensor(X0), Tensor(Y0), Tensor(s0)
    gx = ops.GradOperation(sens_param=True)(lambda a, b: a * b)(x, y, sens)  # the vector-Jacobian product
    np.testing.assert_allclose(gx.asnumpy(), central(lambda v: float(np.sum(v * Y0 * s0)), X0), rtol=1e-7)
    with pytest.raises(ValueError, match=r"^GradOperation\(sens_param=True\): sens of shape \[2\] for an output "
                                         r"of shape \[3\]$"):
        ops.GradOperation(sens_param=True)(lambda a, b: a * b)(x, y, Tensor([1.0, 2.0]))


def test_stop_gradient_cuts_the_history():
    x = Tensor(X0)
    g = rt.grad(lambda t: (t * ops.stop_gradient(t)).sum())(x)
    np.testing.assert_allclose(g.asnumpy(), X0)  # d/dt (t * c) with c = t held constant
    xr = Tensor(X0, requires_grad=True)
    assert (xr * 1.0)._node is not None
    a, b = ops.stop_gradient((xr * 1.0, xr * 2.0))
    assert a._node is None and b._node is None and not a.requires_grad


def test_train_one_step_cell_is_value_and_grad_then_the_optimizer():
    rt.set_seed(0)
    net = nn.Dense(3, 1)
    data = Tensor(np.array([[0.5, -1.0, 2.0], [1.0, 0.0, -0.5]], np.float32))
    label = Tensor(np.array([[1.0], [-1.0]], np.float32))
    loss_fn = nn.MSELoss()
    before = [p.asnumpy().copy() for p in net.trainable_params()]
    want_loss, want_grads = rt.value_and_grad(lambda d, l: loss_fn(net(d), l), None,
                                              net.trainable_params())(data, label)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), nn.SGD(net.trainable_params(), learning_rate=0.1))
    assert step.set_grad() is step and step.set_train() is step
    loss = step(data, label)
    np.testing.assert_allclose(loss.asnumpy(), want_loss.asnumpy())
    for p, b, g in zip(net.trainable_params(), before, want_grads):
        np.testing.assert_allclose(p.asnumpy(), b - 0.1 * g.asnumpy(), rtol=1e-6)
    assert [p.name for p in step.trainable_params()] == ["weight", "bias"]  # the wrappers add no prefix


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match=r"^GradOperation\(get_by_list=True\) needs the weights"):
        ops.GradOperation(get_by_list=True)(_f)
    with pytest.raises(TypeError, match="^GradOperation: get_all must be a bool, got int$"):
        ops.GradOperation(get_all=1)
    with pytest.raises(TypeError, match="^ParameterTuple holds Parameters, got Tensor$"):
        rt.ParameterTuple([Tensor([1.0])])
    p = Parameter(Tensor([1.0]), name="p")
    with pytest.raises(ValueError, match=r"^ParameterTuple: a parameter, or a parameter's name, is listed twice "
                                         r"\(names must be unique, as MindSpore's\)$"):
        rt.ParameterTuple([p, p])
    with pytest.raises(TypeError, match=r"^TrainOneStepCell\(network, optimizer\): optimizer must be an "
                                        r"nn.Optimizer, got list$"):
        nn.TrainOneStepCell(nn.Dense(1, 1), [p])


def test_what_mindspore_code_reads_from_grad_operation():
    """get_all gives a tuple even for one input (MindSpore code reads grads[0]; grad unwrapped it, so
    grads[0] was the gradient's first row); a single Parameter as weights works (list() of it iterated its
    rows: zero gradients); keyword arguments pass through."""
    w = Parameter(Tensor(np.array([[1.0, 2.0], [3.0, 4.0]])), name="w")
    f = lambda x: (x * x).sum()  # noqa: E731
    x = Tensor(np.array([[1.0, 2.0], [3.0, 4.0]]))
    (gx,) = ops.GradOperation(get_all=True)(f)(x)
    np.testing.assert_allclose(gx.asnumpy(), 2 * x.asnumpy())
    (gx,) = ops.GradOperation(get_all=True, sens_param=True)(lambda t: t * 3.0)(x, Tensor(np.ones((2, 2))))
    np.testing.assert_allclose(gx.asnumpy(), np.full((2, 2), 3.0))
    gw = ops.GradOperation(get_by_list=True)(lambda t: (t * w).sum(), w)(x)
    np.testing.assert_allclose(gw.asnumpy(), x.asnumpy())
    g = ops.GradOperation()(lambda a, scale=1.0: (a * scale).sum())(x, scale=Tensor(2.0, rt.float64))
    np.testing.assert_allclose(g.asnumpy(), np.full((2, 2), 2.0))
    assert ops.stop_gradient(2.0) == 2.0  # MindSpore takes any input
    with pytest.raises(ValueError, match="names must be unique"):
        rt.ParameterTuple([Parameter(Tensor([1.0]), name="p"), Parameter(Tensor([2.0]), name="p")])


def test_train_one_step_returns_the_loss_as_a_value():
    net = nn.Dense(2, 1)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.1))
    loss = step(Tensor(np.ones((2, 2), np.float32)), Tensor(np.zeros((2, 1), np.float32)))
    assert not loss.requires_grad and loss._node is None


def test_broadcast_to_keeps_a_dimension_given_as_minus_one():
    x = Tensor(np.arange(3.0))
    assert ops.broadcast_to(x, (2, -1)).shape == (2, 3) and x.broadcast_to((2, -1)).shape == (2, 3)
    with pytest.raises(ValueError, match=r"^broadcast_to: -1 at dimension 0 of \[-1, 3\], which \[3\] does not "
                                         r"have \(-1 keeps the size of an existing dimension\)$"):
        ops.broadcast_to(x, (-1, 3))


def test_weights_from_a_generator_serve_every_call_and_sens_takes_keywords():
    """net.get_parameters() is a generator: it was drained by the first call, and later calls returned ()
    with no error. sens_param with a keyword argument raised an unexpected-keyword TypeError."""
    net = nn.Dense(2, 1)
    loss = lambda t: (net(t) ** 2).sum()  # noqa: E731
    grads = ops.GradOperation(get_by_list=True)(loss, net.get_parameters())
    x = Tensor(np.ones((1, 2), np.float32))
    first, second = grads(x), grads(x)
    assert len(first) == len(second) == 2
    for a, b in zip(first, second):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy())
    g = ops.GradOperation(sens_param=True)(lambda a, scale=1.0: a * scale)(Tensor(X0), Tensor(np.ones(3)),
                                                                          scale=Tensor(2.0, rt.float64))
    np.testing.assert_allclose(g.asnumpy(), np.full(3, 2.0))

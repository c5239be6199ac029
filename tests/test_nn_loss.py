"""Losses against numpy formulas, their gradients against central differences in float64,
numerical stability with large logits, and bad inputs."""
import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, nn
from runtime.autograd.gradcheck import gradcheck

RNG = np.random.default_rng(11)


def np_log_softmax(x):
    m = x.max(1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(1, keepdims=True))


def test_mse_and_l1_values_and_reductions():
    a, b = RNG.standard_normal((3, 4)), RNG.standard_normal((3, 4))
    assert nn.MSELoss()(Tensor(a), Tensor(b)).item() == pytest.approx(((a - b) ** 2).mean())
    assert nn.L1Loss(reduction="sum")(Tensor(a), Tensor(b)).item() == pytest.approx(np.abs(a - b).sum())
    np.testing.assert_allclose(nn.MSELoss(reduction="none")(Tensor(a), Tensor(b)).asnumpy(), (a - b) ** 2)


def test_cross_entropy_values():
    x = RNG.standard_normal((5, 4))
    y = np.array([0, 3, 1, 1, 2])
    logp = np_log_softmax(x)
    nll = -logp[np.arange(5), y]
    assert nn.CrossEntropyLoss()(Tensor(x), Tensor(y)).item() == pytest.approx(nll.mean())
    w = np.array([1.0, 2.0, 0.5, 3.0])
    expect = (nll * w[y]).sum() / w[y].sum()
    assert nn.CrossEntropyLoss(weight=Tensor(w))(Tensor(x), Tensor(y)).item() == pytest.approx(expect)
    y_ign = np.array([0, -100, 1, 1, 2])
    keep = y_ign != -100
    assert nn.CrossEntropyLoss()(Tensor(x), Tensor(y_ign)).item() == pytest.approx(
        (-logp[np.arange(5)[keep], y_ign[keep]]).mean())
    probs = np.abs(RNG.standard_normal((5, 4)))
    probs /= probs.sum(1, keepdims=True)
    assert nn.CrossEntropyLoss()(Tensor(x), Tensor(probs)).item() == pytest.approx(-(probs * logp).sum(1).mean())
    ls = 0.1
    smooth = np.eye(4)[y] * (1 - ls) + ls / 4
    assert nn.CrossEntropyLoss(label_smoothing=ls)(Tensor(x), Tensor(y)).item() == pytest.approx(
        -(smooth * logp).sum(1).mean())
    per = nn.SoftmaxCrossEntropyWithLogits(sparse=True)(Tensor(x), Tensor(y)).asnumpy()
    np.testing.assert_allclose(per, nll)
    onehot = np.eye(4)[y]
    assert nn.SoftmaxCrossEntropyWithLogits(reduction="mean")(Tensor(x), Tensor(onehot)).item() == pytest.approx(
        nll.mean())


def test_cross_entropy_is_stable_with_large_logits():
    x = Tensor(np.array([[1e4, 0.0, -1e4], [0.0, 5e3, 0.0]], np.float32))
    y = Tensor(np.array([2, 1]))
    loss = nn.CrossEntropyLoss()(x, y)
    assert np.isfinite(loss.item()) and loss.item() == pytest.approx(1e4)
    g = rt.grad(lambda x: nn.CrossEntropyLoss()(x, y))(x).asnumpy()
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, [[0.5, 0, -0.5], [0, 0, 0]], atol=1e-6)
    soft = nn.SoftmaxCrossEntropyWithLogits()(x, Tensor(np.eye(3, dtype=np.float32)[[2, 1]]))
    assert np.all(np.isfinite(soft.asnumpy()))


LOSSES = {
    "mse": (nn.MSELoss(), lambda: Tensor(RNG.standard_normal((3, 4)))),
    "l1": (nn.L1Loss(reduction="sum"), lambda: Tensor(RNG.standard_normal((3, 4)))),
    "ce_int": (nn.CrossEntropyLoss(), lambda: Tensor(np.array([1, 0, 3]))),
    "ce_int_weighted_ignore": (nn.CrossEntropyLoss(weight=np.array([1.0, 2.0, 3.0, 0.5]), ignore_index=0,
                                                   reduction="sum"), lambda: Tensor(np.array([1, 0, 3]))),
    "ce_smooth": (nn.CrossEntropyLoss(label_smoothing=0.2), lambda: Tensor(np.array([2, 0, 3]))),
    "ce_probs": (nn.CrossEntropyLoss(reduction="none"),
                 lambda: Tensor(np.abs(RNG.standard_normal((3, 4))) / 4)),
    "sce_sparse": (nn.SoftmaxCrossEntropyWithLogits(sparse=True), lambda: Tensor(np.array([3, 1, 0]))),
    "sce_dense": (nn.SoftmaxCrossEntropyWithLogits(reduction="mean"),
                  lambda: Tensor(np.eye(4)[[0, 2, 1]])),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss_gradients_against_central_differences(name):
    loss, labels = LOSSES[name]
    y = labels()
    x = Tensor(RNG.standard_normal((3, 4)))
    if y._data.dtype.kind == "f":
        assert gradcheck(lambda a, b: loss(a, b), [x, y])
    else:
        assert gradcheck(lambda a: loss(a, y), [x])


@pytest.mark.filterwarnings("ignore:Mean of empty slice", "ignore:invalid value encountered")  # numpy's, empty
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("labels", [[-100, -100, -100], []], ids=["all_ignored", "empty"])
def test_a_mean_over_no_counted_label_is_nan_with_zero_gradients(labels, smoothing):
    """torch's 0/0: NaN, and zero gradients. It was 0.0 (the total weight was clamped to 1e-38), while
    SoftmaxCrossEntropyWithLogits(sparse=True) gave NaN on an empty batch: the two disagreed."""
    x = Tensor(RNG.standard_normal((len(labels), 4)), requires_grad=True)
    y = Tensor(np.array(labels, np.int64))
    loss_fn = nn.CrossEntropyLoss(label_smoothing=smoothing)
    assert np.isnan(loss_fn(x, y).item())
    g = rt.grad(lambda a: loss_fn(a, y))(x)
    assert g.shape == x.shape and np.array_equal(g.asnumpy(), np.zeros(x.shape))
    if not labels:
        assert np.isnan(nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")(x, y).item())


def test_cross_entropy_second_order():
    y = Tensor(np.array([1, 0]))
    x = Tensor(RNG.standard_normal((2, 3)))
    assert gradcheck(lambda x: rt.grad(lambda z: nn.CrossEntropyLoss()(z, y))(x), [x])


def test_bad_loss_inputs():
    x = Tensor(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="reduction must be 'mean', 'sum' or 'none', got 'avg'"):
        nn.MSELoss(reduction="avg")
    with pytest.raises(ValueError, match=r"logits have shape \[2, 3\] but labels \[3\]"):
        nn.MSELoss()(x, Tensor(np.zeros(3, np.float32)))
    with pytest.raises(IndexError, match="label 3 is out of range for 3 classes"):
        nn.CrossEntropyLoss()(x, Tensor(np.array([0, 3])))
    with pytest.raises(ValueError, match=r"integer labels must have shape \[2\]"):
        nn.CrossEntropyLoss()(x, Tensor(np.array([0, 1, 2])))
    with pytest.raises(ValueError, match=r"logits must have shape \[N, C\]"):
        nn.CrossEntropyLoss()(Tensor(np.zeros((2, 3, 4), np.float32)), Tensor(np.array([0, 1])))
    with pytest.raises(TypeError, match="logits must be floating-point"):
        nn.CrossEntropyLoss()(Tensor(np.zeros((2, 3), np.int32)), Tensor(np.array([0, 1])))
    with pytest.raises(ValueError, match=r"weight must have shape \[3\]"):
        nn.CrossEntropyLoss(weight=np.ones(2))(x, Tensor(np.array([0, 1])))
    with pytest.raises(TypeError, match="pass sparse=True for class indices"):
        nn.SoftmaxCrossEntropyWithLogits()(x, Tensor(np.array([0, 1])))
    with pytest.raises(TypeError, match=r"sparse=True\): labels must be integer class indices"):
        nn.SoftmaxCrossEntropyWithLogits(sparse=True)(x, x)
    with pytest.raises(ValueError, match=r"label_smoothing must be in \[0, 1\]"):
        nn.CrossEntropyLoss(label_smoothing=1.5)
    with pytest.raises(TypeError) as info:  # it said: "logits have shape [2, 3] but labels [2]; they must match"
        nn.CrossEntropyLoss()(x, Tensor(np.array([0.0, 2.0])))
    assert str(info.value) == ("CrossEntropyLoss: labels of shape [2] are class indices, which must be integers, got "
                               "Float64; cast them (labels.astype(runtime.int32)), or give probabilities of the "
                               "logits' shape [2, 3]")

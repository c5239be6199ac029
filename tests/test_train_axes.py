"""Axes as a user gets them wrong, and shapes at the edges: a duplicated or out-of-range axis is a
clear error naming it (it was numpy's bare message, or silently wrapped to another axis); softmax
and log_softmax along an empty axis give an empty result; label-smoothed cross-entropy of one
sample keeps a 0-d loss. Gradients against central differences in float64."""
import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, mint, nn, ops
from runtime.autograd.gradcheck import gradcheck
from runtime.ops import math as m

RNG = np.random.default_rng(11)


@pytest.mark.parametrize("fn", [
    lambda x: m.sum(x, (0, 0)),
    lambda x: m.mean(x, (1, -1)),
    lambda x: mint.sum(x, (-2, 0), keepdim=True),
    lambda x: ops.logsumexp(x, (1, -1)),
    lambda x: mint.squeeze(x, (0, 0)),
], ids=["sum", "mean", "mint.sum", "logsumexp", "mint.squeeze"])
def test_a_duplicated_axis_is_a_clear_error(fn):
    with pytest.raises(ValueError, match=r"axis \[.*\] names dimension \d twice \(for a tensor of 2 dimensions\)"):
        fn(Tensor(np.zeros((1, 3))))


def test_an_axis_that_is_not_an_int_is_a_type_error():
    x = Tensor(np.zeros((2, 3)))
    with pytest.raises(TypeError, match="axis must be None, an int or a tuple of ints, got float 1.5"):
        m.sum(x, 1.5)
    with pytest.raises(TypeError, match=r"got bool True"):
        x.mean(True)
    assert m.sum(x, np.array([0, 1])).shape == () and m.sum(x, [np.int64(-1)]).shape == (2,)


@pytest.mark.parametrize("fn,msg", [
    (lambda x: m.transpose(x, (0, 5)), r"transpose axes \[0, 5\] are out of range for a tensor of 2 dimensions"),
    (lambda x: x.transpose(-3, 0), r"transpose axes \[-3, 0\] are out of range"),
    (lambda x: mint.permute(x, (5, 0)), r"transpose axes \[5, 0\] are out of range"),
    (lambda x: m.transpose(x, (1, 1)), r"transpose axes \[1, 1\] are not a permutation of 2 dimensions"),
])
def test_transpose_axes_out_of_range_are_errors_not_wrapped(fn, msg):
    """(0, 5) on a matrix was taken as (0, 1) and (5, 0) as (1, 0): a silent wrong permutation."""
    with pytest.raises(ValueError, match=msg):
        fn(Tensor(np.zeros((2, 3))))
    x = Tensor(RNG.standard_normal((2, 3, 4)))
    assert m.transpose(x, (-1, 0, -2)).shape == (4, 2, 3)
    assert gradcheck(lambda t: m.transpose(t, (-1, 0, 1)), [Tensor(RNG.standard_normal((3, 4, 2))[:, ::2].T)])


def test_flatten_dims_out_of_range_are_errors_not_wrapped():
    """Flatten(5) of a 3-D tensor wrapped 5 to 2 and returned it unflattened."""
    x = Tensor(np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match=r"Flatten: start_dim 5 and end_dim -1 do not select dims of a tensor "
                                         r"of shape \[2, 3, 4\]"):
        nn.Flatten(5)(x)
    with pytest.raises(ValueError, match=r"start_dim 1 and end_dim -1 do not select dims of a tensor of shape \[3\]"):
        nn.Flatten()(Tensor(np.zeros(3)))
    with pytest.raises(ValueError, match="start_dim 0 and end_dim -4"):
        nn.Flatten(0, -4)(x)
    assert nn.Flatten(-2)(x).shape == (2, 12) and nn.Flatten(0, 1)(x).shape == (6, 4)


@pytest.mark.parametrize("fn", [lambda x: ops.softmax(x, 0), lambda x: ops.log_softmax(x, -2),
                                lambda x: mint.nn.functional.softmax(x, 0)], ids=["softmax", "log_softmax", "mint"])
def test_softmax_along_an_empty_axis_is_empty(fn):
    """numpy's max has no identity: an empty axis was 'zero-size array to reduction operation maximum'."""
    x = Tensor(np.zeros((0, 3))).requires_grad_(True)
    out = fn(x)
    assert out.shape == (0, 3)
    out.backward(Tensor(np.zeros((0, 3))))
    assert x.grad.shape == (0, 3)
    assert gradcheck(fn, [Tensor(RNG.standard_normal((4, 3))[::-1])])


@pytest.mark.parametrize("weight", [None, np.array([0.5, 2.0, 1.0])])
def test_label_smoothed_cross_entropy_of_one_sample_is_0d(weight):
    """1-D logits with integer labels and label_smoothing, reduction 'none': a shape [1] loss (without
    smoothing it was 0-d already), as torch's [] is."""
    loss = nn.CrossEntropyLoss(weight=weight, reduction="none", label_smoothing=0.2)
    x = RNG.standard_normal(3)
    out = loss(Tensor(x), Tensor(np.array(1)))
    assert out.shape == ()
    logp = x - x.max() - np.log(np.exp(x - x.max()).sum())
    w = np.ones(3) if weight is None else weight
    target = np.full(3, 0.2 / 3) + 0.8 * (np.arange(3) == 1)
    np.testing.assert_allclose(out.asnumpy(), -(w * target * logp).sum(), rtol=1e-12)
    assert gradcheck(lambda t: loss(t, Tensor(np.array(1))), [Tensor(x)])


@pytest.mark.parametrize("axis", [0, -1])
def test_softmax_of_a_0d_tensor_is_one_as_log_softmax_is_zero(axis):
    """softmax normalised the axis against 0 dimensions ('axis -1 is out of range'), so its 0-d branch
    never ran; log_softmax already took axis 0 or -1 of a 0-d tensor."""
    x = Tensor(np.float64(2.5))
    assert ops.softmax(x, axis).shape == () and float(ops.softmax(x, axis)) == 1.0
    assert float(ops.log_softmax(x, axis)) == 0.0
    assert gradcheck(lambda t: ops.softmax(t, axis) * t, [x])
    with pytest.raises(ValueError, match="axis 1"):
        ops.softmax(x, 1)

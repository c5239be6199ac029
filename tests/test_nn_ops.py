"""The training ops (log_softmax, logsumexp, clip, gelu, concat, stack, split, squeeze, expand_dims,
gather, one_hot, dense, argmax/argmin, ops.max/min): values against numpy, gradients against central
differences in float64 (views and empty shapes included), and each bad input's error."""
import math

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, ops
from runtime.autograd.gradcheck import gradcheck

RNG = np.random.default_rng(7)


def t64(*shape):
    return Tensor(RNG.standard_normal(shape))


def np_log_softmax(x, axis):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


# ---- values ---------------------------------------------------------------------------------
def test_log_softmax_and_logsumexp_match_numpy_and_do_not_overflow():
    x = np.array([[1000.0, 0.0, -1000.0], [1.0, 2.0, 3.0]])
    out = ops.log_softmax(Tensor(x), 1).asnumpy()
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, np_log_softmax(x, 1))
    lse = ops.logsumexp(Tensor(x), 1).asnumpy()
    np.testing.assert_allclose(lse, [1000.0, 3.0 + math.log(1 + math.exp(-1) + math.exp(-2))])
    assert ops.logsumexp(Tensor(x), (0, 1), keep_dims=True).shape == (1, 1)
    assert ops.log_softmax(Tensor(np.float32(3.0))).asnumpy() == 0.0


def test_clip_and_gelu_values():
    x = Tensor(np.array([-2.0, -0.5, 0.5, 2.0]))
    assert ops.clip(x, -1, 1).tolist() == [-1.0, -0.5, 0.5, 1.0]
    assert ops.clip(x, max=0).tolist() == [-2.0, -0.5, 0.0, 0.0]
    exact = [v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x.tolist()]
    np.testing.assert_allclose(ops.gelu(x).asnumpy(), exact)
    np.testing.assert_allclose(ops.gelu(x, approximate="tanh").asnumpy(), exact, atol=1e-3)


def test_shape_ops_values():
    a, b = np.arange(6.0).reshape(2, 3), np.arange(6.0, 10.0).reshape(2, 2)
    np.testing.assert_array_equal(ops.concat([Tensor(a), Tensor(b)], 1).asnumpy(), np.concatenate([a, b], 1))
    np.testing.assert_array_equal(ops.stack([Tensor(a), Tensor(a)], -1).asnumpy(), np.stack([a, a], -1))
    parts = ops.split(Tensor(np.arange(7.0)), 3)
    assert [p.tolist() for p in parts] == [[0, 1, 2], [3, 4, 5], [6]]
    parts = ops.split(Tensor(a), [1, 2], axis=1)
    assert [p.shape for p in parts] == [(2, 1), (2, 2)]
    assert ops.squeeze(Tensor(np.zeros((1, 3, 1)))).shape == (3,)
    assert ops.squeeze(Tensor(np.zeros((1, 3, 1))), 2).shape == (1, 3)
    assert ops.expand_dims(Tensor(a), -1).shape == (2, 3, 1)
    np.testing.assert_array_equal(ops.gather(Tensor(a), Tensor(np.array([2, 0, 2])), 1).asnumpy(), a[:, [2, 0, 2]])
    oh = ops.one_hot(Tensor(np.array([0, 2, 5, -1])), 3)
    assert oh.dtype == rt.float32
    assert oh.tolist() == [[1, 0, 0], [0, 0, 1], [0, 0, 0], [0, 0, 0]]  # out of range: all off
    assert ops.one_hot(Tensor(np.array([1])), 2, 5, -1, axis=0).tolist() == [[-1], [5]]


def test_argmax_and_max_with_indices():
    x = Tensor(np.array([[1.0, 5.0, 2.0], [7.0, 0.0, 7.0]]))
    assert ops.argmax(x, 1).tolist() == [1, 0]
    assert ops.argmin(x).tolist() == 4
    # MindSpore's keywords: ops.argmax(input, dim=None, keepdim=False)
    assert ops.argmax(input=x, dim=0, keepdim=True).tolist() == [[1, 0, 1]]
    assert ops.argmin(input=x, dim=1).tolist() == [0, 1]
    v, i = ops.max(x, 1)
    assert v.tolist() == [5.0, 7.0] and i.tolist() == [1, 0]
    v, i = ops.min(x, axis=None)
    assert v.tolist() == 0.0 and i.tolist() == 4
    v, i = ops.max(x, 0, keepdims=True)
    assert v.shape == (1, 3) and i.tolist() == [[1, 0, 1]]


def test_dense_matches_numpy():
    x, w, b = RNG.standard_normal((4, 3)), RNG.standard_normal((5, 3)), RNG.standard_normal(5)
    np.testing.assert_allclose(ops.dense(Tensor(x), Tensor(w), Tensor(b)).asnumpy(), x @ w.T + b)
    x3 = RNG.standard_normal((2, 4, 3))
    np.testing.assert_allclose(ops.dense(Tensor(x3), Tensor(w)).asnumpy(), x3 @ w.T)


# ---- gradients ------------------------------------------------------------------------------
GRAD_CASES = {
    "log_softmax": (lambda x: ops.log_softmax(x, 0), [(4, 3)]),
    "log_softmax_last": (lambda x: ops.log_softmax(x), [(2, 5)]),
    "logsumexp": (lambda x: ops.logsumexp(x, 1), [(3, 4)]),
    "logsumexp_keep": (lambda x: ops.logsumexp(x, (0, 2), True), [(2, 3, 2)]),
    "clip": (lambda x: ops.clip(x, -0.5, 0.7), [(4, 5)]),
    "clip_tensor_bounds": (lambda x, lo: ops.clip(x, lo, 1.5), [(3, 4), (4,)]),
    "gelu": (lambda x: ops.gelu(x), [(3, 4)]),
    "gelu_tanh": (lambda x: ops.gelu(x, "tanh"), [(3, 4)]),
    "concat": (lambda a, b, c: ops.concat([a, b, c], 1), [(2, 1), (2, 3), (2, 2)]),
    "stack": (lambda a, b: ops.stack([a, b], 1), [(2, 3), (2, 3)]),
    "split": (lambda x: ops.split(x, [1, 3, 0], 1), [(2, 4)]),
    "squeeze": (lambda x: ops.squeeze(x, 0), [(1, 3)]),
    "expand_dims": (lambda x: ops.expand_dims(x, 1), [(2, 3)]),
    "gather_repeated": (lambda x: ops.gather(x, Tensor(np.array([[0, 2], [2, 2]])), 1), [(3, 4)]),
    "gather_axis0": (lambda x: ops.gather(x, Tensor(np.array([1, 1, 0])), 0), [(2, 3)]),
    "dense": (lambda x, w, b: ops.dense(x, w, b), [(4, 3), (2, 3), (2,)]),
    "dense_3d": (lambda x, w: ops.dense(x, w), [(2, 4, 3), (5, 3)]),
    "max_axis": (lambda x: ops.max(x, 1)[0], [(3, 4)]),
}


@pytest.mark.parametrize("name", sorted(GRAD_CASES))
def test_gradients_against_central_differences(name):
    fn, shapes = GRAD_CASES[name]
    assert gradcheck(fn, [t64(*s) for s in shapes])


def test_gradients_on_views_and_empty_shapes():
    base = RNG.standard_normal((4, 6))
    view = rt.from_numpy(base[:, ::2])  # a strided view (Tensor() would copy it)
    assert not view.asnumpy().flags.c_contiguous
    assert gradcheck(lambda x: ops.log_softmax(x, 1), [view])
    assert gradcheck(lambda x, y: ops.concat([x, y], 0), [rt.from_numpy(base.T[:2, :3]), view])
    assert gradcheck(lambda x: ops.gather(x, Tensor(np.array([0, 2])), 1), [rt.from_numpy(base.T)])
    empty = Tensor(np.zeros((0, 3)))
    assert ops.log_softmax(empty, 1).shape == (0, 3)
    assert ops.concat([empty, Tensor(np.ones((2, 3)))], 0).shape == (2, 3)
    assert ops.split(Tensor(np.zeros((0, 2))), 1, 1)[0].shape == (0, 1)
    g = rt.grad(lambda x, y: ops.concat([x, y], 0).sum(), (0, 1))(empty, Tensor(np.ones((2, 3))))
    assert g[0].shape == (0, 3) and g[1].tolist() == [[1.0] * 3] * 2


def test_second_order_through_log_softmax():
    # rules use runtime ops, so the gradient is differentiable again
    x = t64(2, 3)
    assert gradcheck(lambda x: rt.grad(lambda z: (ops.log_softmax(z, 1) * z).sum())(x), [x])


# ---- errors ---------------------------------------------------------------------------------
def test_errors():
    x = Tensor(np.ones((2, 3), np.float32))
    with pytest.raises(TypeError, match="log_softmax needs a floating-point tensor"):
        ops.log_softmax(Tensor(np.ones(3, np.int32)))
    with pytest.raises(TypeError, match="axis must be an int"):
        ops.log_softmax(x, 1.0)
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        ops.logsumexp(x, 2)
    with pytest.raises(ValueError, match="at least one of min and max"):
        ops.clip(x)
    assert ops.clip(x, 2, 1).asnumpy().tolist() == [[1.0] * x.shape[1]] * x.shape[0]  # min > max: max, as MindSpore
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        ops.gelu(x, "fast")
    with pytest.raises(TypeError, match="takes a list or tuple of tensors"):
        ops.concat(x)
    with pytest.raises(ValueError, match="at least one tensor"):
        ops.stack([])
    with pytest.raises(ValueError, match=r"tensor 1 has shape \[2, 2\], which does not match"):
        ops.concat([x, Tensor(np.ones((2, 2), np.float32))], 0)
    with pytest.raises(TypeError, match="same dtype"):
        ops.concat([x, Tensor(np.ones((2, 3)))], 0)
    with pytest.raises(ValueError, match=r"stack: tensor 1 has shape \[3\]"):
        ops.stack([Tensor(np.ones(2)), Tensor(np.ones(3))])
    with pytest.raises(ValueError, match=r"section sizes \[1, 1\] must be non-negative and add up to 3"):
        ops.split(x, [1, 1], 1)
    with pytest.raises(ValueError, match="must be positive"):
        ops.split(x, 0)
    with pytest.raises(ValueError, match="axis 1 of a tensor of shape \\[2, 3\\] has size 3, not 1"):
        ops.squeeze(x, 1)
    with pytest.raises(ValueError, match="axis 3 is out of range"):
        ops.expand_dims(x, 3)
    with pytest.raises(IndexError, match=r"must lie in \[-3, 3\) for axis 1 of length 3, got values from 0 to 3"):
        ops.gather(x, Tensor(np.array([0, 3])), 1)
    with pytest.raises(TypeError, match="input_indices must be integers"):
        ops.gather(x, Tensor(np.array([0.0])), 1)
    with pytest.raises(NotImplementedError, match="batch_dims=0"):
        ops.gather(x, Tensor(np.array([0])), 1, batch_dims=1)
    with pytest.raises(TypeError, match="one_hot: indices must be integers"):
        ops.one_hot(Tensor(np.array([0.5])), 3)
    with pytest.raises(ValueError, match="depth must be non-negative"):
        ops.one_hot(Tensor(np.array([0])), -1)
    with pytest.raises(ValueError, match=r"input of shape \[2, 3\] does not match weight of shape \[4, 2\]"):
        ops.dense(x, Tensor(np.ones((4, 2), np.float32)))
    with pytest.raises(TypeError, match="input is Float32 but weight is Float64"):
        ops.dense(x, Tensor(np.ones((4, 3))))
    with pytest.raises(ValueError, match=r"bias must have shape \[4\]"):
        ops.dense(x, Tensor(np.ones((4, 3), np.float32)), Tensor(np.ones(3, np.float32)))

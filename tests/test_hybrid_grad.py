"""A hybrid op whose bprop is itself a hybrid op (two gradient outputs), gradchecked in float64 against
central differences, on views and on empty inputs."""
import numpy as np
import pytest

from runtime import Tensor, from_numpy, ops
from runtime.autograd.gradcheck import gradcheck
from runtime.hybrid import kernel

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)


@kernel
def fwd(x, y):
    z = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            z[i, j] = x[i, j] * x[i, j] * y[i, j] + sin(x[i, j])
    return z


@kernel
def fwd_grad(x, y, dout):
    dx = output_tensor(x.shape, x.dtype)
    dy = output_tensor(y.shape, y.dtype)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            dx[i, j] = (2.0 * x[i, j] * y[i, j] + cos(x[i, j])) * dout[i, j]
            dy[i, j] = x[i, j] * x[i, j] * dout[i, j]
    return dx, dy


@pytest.fixture(scope="module")
def op():
    """Built here, not at import: a build that fails at collection stops the whole session's run."""
    grad_op = ops.Custom(fwd_grad)
    return ops.Custom(fwd, bprop=lambda x, y, out, dout: grad_op(x, y, dout))


def test_hybrid_bprop_gradchecks_in_float64_on_views(op):
    rng = np.random.default_rng(0)
    base = rng.standard_normal((4, 3))
    x = from_numpy(base.T)  # a transpose (Tensor() would copy it)
    y = from_numpy(np.broadcast_to(rng.standard_normal((1, 4)), (3, 4)))  # a broadcast view
    assert gradcheck(op, [x, y])
    assert gradcheck(op, [from_numpy(base[::2]), from_numpy(base[1::2])])  # strided slices


def test_hybrid_bprop_on_empty_inputs(op):
    x = Tensor(np.zeros((0, 3))).requires_grad_(True)
    y = Tensor(np.zeros((0, 3))).requires_grad_(True)
    out = op(x, y)
    assert out.shape == (0, 3)
    out.sum().backward()
    assert x.grad.shape == (0, 3) and y.grad.shape == (0, 3)


def test_a_wrong_hybrid_bprop_fails_gradcheck():
    @kernel
    def wrong_grad(x, y, dout):
        dx = output_tensor(x.shape, x.dtype)
        dy = output_tensor(y.shape, y.dtype)
        for i in range(x.shape[0]):
            for j in range(x.shape[1]):
                dx[i, j] = 2.0 * x[i, j] * y[i, j] * dout[i, j]  # the cos term is missing
                dy[i, j] = x[i, j] * x[i, j] * dout[i, j]
        return dx, dy

    wrong = ops.Custom(wrong_grad)
    op = ops.Custom(fwd, bprop=lambda x, y, out, dout: wrong(x, y, dout))
    rng = np.random.default_rng(1)
    from runtime.autograd.gradcheck import GradcheckError
    with pytest.raises(GradcheckError):
        gradcheck(op, [Tensor(rng.standard_normal((2, 2))), Tensor(rng.standard_normal((2, 2)))])

"""Gradients through C++ Function ops match central differences (float64), broadcasting included."""
import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, ops as F


SHAPES = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 5)), ((), (2, 2)), ((2, 1, 3), (4, 1))]


@pytest.mark.parametrize("sx,sy", SHAPES)
def test_mul_gradients_match_numerical(my_ops, sx, sy):
    rng = np.random.default_rng(7)
    x = Tensor(rng.standard_normal(sx))
    y = Tensor(rng.standard_normal(sy))
    assert rt.gradcheck(my_ops.mul, [x, y])


def test_ms_style_mul_gradients_match_numerical(ms_ops):
    # the MindSpore-style source is float32 only: compare with a float32-sized tolerance
    rng = np.random.default_rng(3)
    x = Tensor(rng.standard_normal((2, 3)).astype(np.float32))
    y = Tensor(rng.standard_normal((3,)).astype(np.float32))
    assert rt.gradcheck(ms_ops.mul, [x, y], eps=1e-2, atol=1e-3, rtol=1e-2)


def test_custom_op_composes_with_builtin_ops(my_ops):
    rng = np.random.default_rng(11)
    x = Tensor(rng.standard_normal((3, 4)))
    w = Tensor(rng.standard_normal((4, 2)))
    b = Tensor(rng.standard_normal((2,)))

    def f(x, w, b):
        h = F.tanh(my_ops.mul(x @ w, b) + b)
        return my_ops.mul(h, h).sum(axis=0)

    assert rt.gradcheck(f, [x, w, b])


def test_value_and_grad_through_custom_op_equals_closed_form(my_ops):
    rng = np.random.default_rng(5)
    xa, ya = rng.standard_normal((2, 3)), rng.standard_normal((3,))
    out, (gx, gy) = rt.value_and_grad(lambda x, y: my_ops.mul(x, y).sum(), (0, 1))(Tensor(xa), Tensor(ya))
    np.testing.assert_allclose(out.asnumpy(), (xa * ya).sum())
    np.testing.assert_allclose(gx.asnumpy(), np.broadcast_to(ya, (2, 3)))
    np.testing.assert_allclose(gy.asnumpy(), xa.sum(axis=0))
    assert gx.shape == (2, 3) and gy.shape == (3,)


def test_no_node_recorded_without_grad(my_ops):
    x, y = Tensor(np.ones(3)), Tensor(np.ones(3))
    z = my_ops.mul(x, y)
    assert not z.requires_grad and z._node is None
    x.requires_grad_(True)
    with rt.no_grad():
        z = my_ops.mul(x, y)
    assert not z.requires_grad and z._node is None
    z = my_ops.mul(x, y)
    assert z.requires_grad and z._node is not None and "CustomMul" in z._node.name


def test_saved_tensors_released_after_backward(my_ops):
    x = Tensor(np.ones(3), requires_grad=True)
    y = Tensor(np.full(3, 2.0), requires_grad=True)
    z = my_ops.mul(x, y).sum()
    z.backward()
    np.testing.assert_array_equal(x.grad.asnumpy(), [2, 2, 2])
    with pytest.raises(RuntimeError, match="second time|freed"):
        z.backward()


def test_cpp_exception_in_forward_becomes_python_exception(my_ops):
    with pytest.raises(ValueError, match="expected two float32 or two float64"):
        my_ops.mul(Tensor(np.ones(2, np.int32)), Tensor(np.ones(2, np.int32)))


def test_non_tensor_argument_is_a_type_error(my_ops):
    with pytest.raises(TypeError, match="runtime.Tensor"):
        my_ops.mul("a", Tensor(np.ones(2)))

"""runtime.mint: MindSpore 2.x mint signatures and results, gradients against central differences (float64)."""
import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, mint

rng = np.random.default_rng(0)


def T(*shape, positive=False):
    a = rng.standard_normal(shape)
    return Tensor(np.abs(a) + 0.5 if positive else a)


def distinct(*shape):
    """float64 values far apart (so max/min and their gradients are well defined)."""
    return Tensor(rng.permutation(np.prod(shape, dtype=int)).reshape(shape) * 0.37 - 1.0)


UNARY = {
    "sin": mint.sin, "cos": mint.cos, "exp": mint.exp, "abs": mint.abs, "neg": mint.neg,
    "negative": mint.negative, "square": mint.square, "relu": mint.relu, "sigmoid": mint.sigmoid,
    "tanh": mint.tanh, "sum": mint.sum, "sum_dim": lambda x: mint.sum(x, 1), "sum_dims_keep": lambda x: mint.sum(
        x, dim=(0, 1), keepdim=True), "mean": mint.mean, "mean_dim": lambda x: mint.mean(x, -1, True),
    "softmax": lambda x: mint.softmax(x, 1), "softmax_0": lambda x: mint.softmax(x, dim=0),
    "nn_softmax_default": mint.nn.functional.softmax, "nn_relu": mint.nn.functional.relu,
    "reshape": lambda x: mint.reshape(x, (4, 3)), "transpose": lambda x: mint.transpose(x, 0, 1),
    "permute": lambda x: mint.permute(x, (1, 0)), "flatten": mint.flatten,
    "unsqueeze": lambda x: mint.unsqueeze(x, 1), "squeeze": lambda x: mint.squeeze(mint.unsqueeze(x, 0)),
    "div_scalar": lambda x: mint.div(x, 2.0),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_gradients(name):
    assert rt.gradcheck(UNARY[name], [T(3, 4)])


@pytest.mark.parametrize("name,fn", [("log", mint.log), ("sqrt", mint.sqrt)])
def test_positive_domain_gradients(name, fn):
    assert rt.gradcheck(fn, [T(3, 4, positive=True)])


EXTREMES = {
    "max": mint.max, "min": mint.min,
    "max_dim_values": lambda x: mint.max(x, 1)[0], "min_dim_keep_values": lambda x: mint.min(x, 0, True)[0],
    "max_neg_dim": lambda x: mint.max(x, -1, keepdim=False)[0],
}


@pytest.mark.parametrize("name", sorted(EXTREMES))
def test_max_and_min_gradients(name):
    assert rt.gradcheck(EXTREMES[name], [distinct(3, 4)])


BINARY = {
    "add": mint.add, "add_alpha": lambda x, y: mint.add(x, y, alpha=2.5), "sub": mint.sub,
    "sub_alpha": lambda x, y: mint.sub(x, y, alpha=-0.5), "mul": mint.mul, "div": mint.div,
    "divide": mint.divide, "maximum": mint.maximum, "minimum": mint.minimum,
    "max_other": lambda x, y: mint.max(x, y), "min_other": lambda x, y: mint.min(x, y),
}


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("sx,sy", [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 4), (3, 1))])
def test_binary_gradients_with_broadcasting(name, sx, sy):
    assert rt.gradcheck(BINARY[name], [T(*sx), T(*sy, positive=True)])


def test_pow_and_matmul_gradients():
    assert rt.gradcheck(mint.pow, [T(3, 4, positive=True), T(4)])
    assert rt.gradcheck(mint.matmul, [T(3, 4), T(4, 2)])
    assert rt.gradcheck(mint.matmul, [T(2, 3, 4), T(4)])


def test_gradients_of_gradients_through_softmax_and_max():
    x = T(2, 3)
    assert rt.gradcheck(lambda t: rt.grad(lambda u: (mint.softmax(u, 1) * u).sum())(t), [x])
    assert rt.gradcheck(lambda t: rt.grad(lambda u: mint.max(u * u, 1)[0].sum())(t), [distinct(2, 3)])


# ---- values and signatures, as MindSpore documents them --------------------------------

def test_max_and_min_as_mindspore_documents_them():
    y = Tensor(np.array([[0.0, 0.3, 0.4, 0.5, 0.1], [3.2, 0.4, 0.1, 2.9, 4.0]]), rt.float32)
    output, index = mint.max(y, 0, True)
    np.testing.assert_allclose(output.asnumpy(), [[3.2, 0.4, 0.4, 2.9, 4.0]], rtol=1e-6)
    assert index.dtype == rt.int64 and index.tolist() == [[1, 1, 0, 1, 1]]
    x = Tensor(np.array([0.0, 0.4, 0.6, 0.7, 0.1]), rt.float32)
    m = mint.max(x)
    assert m.shape == () and m.dtype == rt.float32 and m.item() == pytest.approx(0.7)
    v, i = mint.max(x, 0, keepdim=True)
    assert v.shape == (1,) and i.tolist() == [3]
    v, i = mint.min(y, dim=1)
    np.testing.assert_allclose(v.asnumpy(), [0.0, 0.1], rtol=1e-6)
    assert i.tolist() == [0, 2] and mint.min(x).item() == 0.0
    np.testing.assert_array_equal(mint.max(Tensor([1.0, 5.0]), Tensor([3.0, 2.0])).asnumpy(), [3.0, 5.0])


def test_max_ties_share_the_gradient_and_max_along_a_dim_picks_the_returned_index():
    x = Tensor([1.0, 3.0, 3.0])
    assert rt.grad(lambda t: mint.max(t))(x).tolist() == [0.0, 0.5, 0.5]
    assert rt.grad(lambda t: mint.max(t, 0)[0])(x).tolist() == [0.0, 1.0, 0.0]
    assert rt.grad(lambda a, b: mint.maximum(a, b), (0, 1))(Tensor([2.0]), Tensor([2.0]))[0].tolist() == [0.5]


def test_max_of_a_scalar_and_argmax():
    v, i = mint.max(Tensor(2.5), 0)
    assert v.item() == 2.5 and i.item() == 0 and i.dtype == rt.int64
    y = Tensor(np.array([[1, 9, 3], [7, 2, 8]], np.int32))
    assert mint.argmax(y).item() == 1 and mint.argmin(y).item() == 0
    assert mint.argmax(y, dim=1).tolist() == [1, 2] and mint.argmin(y, 0, keepdim=True).tolist() == [[0, 1, 0]]
    assert mint.max(y).dtype == rt.int32 and mint.max(y).item() == 9


def test_sum_and_mean_signatures():
    x = Tensor(np.arange(1, 55, dtype=np.float32).reshape(3, 3, 6) // 6 % 9 + 1)
    assert mint.sum(Tensor(np.tile(np.arange(1, 10, dtype=np.float32).reshape(3, 3, 1), (1, 1, 6)))).item() == 270.0
    assert mint.sum(x, dim=2).shape == (3, 3) and mint.sum(x, dim=2, keepdim=True).shape == (3, 3, 1)
    assert mint.sum(x, [0, 2]).shape == (3,)
    assert mint.sum(Tensor([1, 2], rt.int32), dtype=rt.float64).dtype == rt.float64
    assert mint.mean(Tensor([[1.0, 2.0], [3.0, 5.0]]), 1).tolist() == [1.5, 4.0]
    assert mint.mean(Tensor([1, 2], rt.int64), dtype=rt.float32).item() == 1.5


def test_transpose_swaps_two_dims_and_the_rest_of_the_shape_ops():
    x = Tensor(np.ones((2, 3, 4), dtype=np.float32))
    assert mint.transpose(x, 0, 2).shape == (4, 3, 2)
    assert mint.transpose(x, -1, 1).shape == (2, 4, 3)
    assert mint.permute(x, (2, 0, 1)).shape == (4, 2, 3)
    assert mint.flatten(x).shape == (24,) and mint.flatten(x, 1).shape == (2, 12)
    assert mint.flatten(x, 0, 1).shape == (6, 4)
    assert mint.unsqueeze(x, -1).shape == (2, 3, 4, 1) and mint.squeeze(Tensor(np.ones((1, 3, 1)))).shape == (3,)
    assert mint.squeeze(Tensor(np.ones((1, 3, 1))), 0).shape == (3, 1)
    assert mint.reshape(x, (-1, 4)).shape == (6, 4)


def test_softmax_values_and_dtype():
    out = mint.nn.functional.softmax(Tensor(np.array([1, 2, 3, 4, 5]), rt.float32))
    np.testing.assert_allclose(out.asnumpy(), [0.01165623, 0.03168492, 0.08612854, 0.23412167, 0.6364086], rtol=1e-5)
    assert mint.softmax(Tensor([1, 2], rt.int32), 0, dtype=rt.float64).dtype == rt.float64
    assert mint.softmax(Tensor([1000.0, 1000.0]), 0).tolist() == [0.5, 0.5]  # stable


def test_div_rounding_modes():
    a, b = Tensor([7.0, -7.0]), Tensor([2.0, 2.0])
    assert mint.div(a, b).tolist() == [3.5, -3.5]
    assert mint.div(a, b, rounding_mode="floor").tolist() == [3.0, -4.0]
    assert mint.div(a, b, rounding_mode="trunc").tolist() == [3.0, -3.0]
    i = mint.div(Tensor([7, -7], rt.int32), 2, rounding_mode="floor")
    assert i.dtype == rt.int32 and i.tolist() == [3, -4]
    assert rt.grad(lambda t: mint.div(t, 2.0, rounding_mode="floor").sum())(a).tolist() == [0.0, 0.0]


def test_constructors():
    assert mint.zeros((2, 3)).dtype == rt.float32 and mint.zeros((2, 3)).shape == (2, 3)
    assert mint.ones(4, dtype=rt.int64).tolist() == [1, 1, 1, 1]
    x = Tensor([1.0, 2.0], rt.float64)
    assert mint.zeros_like(x).dtype == rt.float64 and mint.ones_like(x, dtype=rt.int32).tolist() == [1, 1]


# ---- errors -----------------------------------------------------------------------------

def test_max_errors():
    x = Tensor([[1.0, 2.0]])
    with pytest.raises(ValueError, match=r"max\(input\) reduces every dim; keepdim applies only with a dim"):
        mint.max(x, keepdim=True)
    with pytest.raises(TypeError, match="max: dim must be an int, got float"):
        mint.max(x, 1.0)
    with pytest.raises(TypeError, match="min: keepdim must be a bool, got int"):
        mint.min(x, 1, 1)
    with pytest.raises(ValueError, match="axis 2 is out of range for a tensor of 2 dimensions"):
        mint.max(x, 2)
    with pytest.raises(ValueError, match=r"max of an empty tensor \(shape \[0\]\) has no value"):
        mint.max(Tensor(np.zeros(0)))
    with pytest.raises(ValueError, match=r"min along dim 0 of a tensor of shape \[0, 2\]: that dim is empty"):
        mint.min(Tensor(np.zeros((0, 2))), 0)


def test_shape_and_reduction_errors():
    x = Tensor(np.ones((2, 3)))
    with pytest.raises(ValueError, match="axis 5 is out of range for a tensor of 2 dimensions"):
        mint.transpose(x, 0, 5)
    with pytest.raises(TypeError, match="transpose: dims must be ints, got str"):
        mint.transpose(x, "0", 1)
    with pytest.raises(TypeError, match=r"dim must be None, an int, or a tuple or list of ints, got 'a'"):
        mint.sum(x, "a")
    with pytest.raises(TypeError, match="keepdim must be a bool, got str"):
        mint.mean(x, 0, "yes")
    with pytest.raises(ValueError, match="flatten: start_dim 1 comes after end_dim 0"):
        mint.flatten(x, 1, 0)
    with pytest.raises(TypeError, match=r"size must be an int or a tuple or list of ints, got \(2, 'x'\)"):
        mint.zeros((2, "x"))


def test_softmax_div_and_relu_errors():
    with pytest.raises(TypeError, match="softmax needs a floating-point tensor, got Int32; cast it first"):
        mint.softmax(Tensor([1, 2], rt.int32), 0)
    with pytest.raises(TypeError, match="softmax: axis must be an int, got tuple"):
        mint.softmax(Tensor([1.0]), (0,))
    with pytest.raises(ValueError, match=r"div: rounding_mode must be None, 'floor' or 'trunc', got 'round'"):
        mint.div(Tensor([1.0]), 2.0, rounding_mode="round")
    with pytest.raises(ValueError, match=r"relu\(inplace=True\) is not supported"):
        mint.nn.functional.relu(Tensor([1.0]), inplace=True)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.int8])
def test_integer_div_with_rounding_is_exact_and_refuses_zero(dtype):
    """Integer floor/trunc division went through float64: past 2**53 the quotient was off, and a zero
    divisor gave garbage (inf cast to int)."""
    info = np.iinfo(dtype)
    a = np.array([info.max, info.min, 7, 0, info.max - 1], dtype)
    b = np.array([1, 3, 2, 5, 2], dtype) if info.min == 0 else np.array([1, 3, -2, -5, 2], dtype)
    floor = mint.div(Tensor(a), Tensor(b), rounding_mode="floor").asnumpy()
    trunc = mint.div(Tensor(a), Tensor(b), rounding_mode="trunc").asnumpy()
    want_floor = [int(x) // int(y) for x, y in zip(a, b)]
    want_trunc = [abs(int(x)) // abs(int(y)) * (1 if (x < 0) == (y < 0) else -1) for x, y in zip(a, b)]
    assert floor.dtype == dtype and floor.tolist() == want_floor
    assert trunc.dtype == dtype and trunc.tolist() == want_trunc
    with pytest.raises(ZeroDivisionError, match=r"^div\(rounding_mode='floor'\): integer division by zero$"):
        mint.div(Tensor(a), Tensor(np.zeros(5, dtype)), rounding_mode="floor")


def test_int64_floor_division_past_two_to_the_53():
    a = np.array([2**62 + 1, 9007199254740993], np.int64)
    assert mint.div(Tensor(a), Tensor(np.array([1, 1], np.int64)), rounding_mode="floor").tolist() == a.tolist()

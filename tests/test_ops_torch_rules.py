"""Results that followed numpy where torch and MindSpore's mint have another rule, found by a differential
fuzzer against torch 2.13: the dtype of float ops on integers, numpy scalars and two numbers, empty axis
tuples, the gradient of a NaN maximum, and clip's bounds. Each was silently wrong before."""
from __future__ import annotations

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, mint, ops
from runtime.autograd.gradcheck import gradcheck


@pytest.mark.parametrize("op", [ops.exp, ops.log, ops.sin, ops.cos, ops.tanh, ops.sqrt, ops.sigmoid, mint.exp,
                                mint.sigmoid, rt.nn.Sigmoid()])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.int64, np.bool_])
def test_a_float_op_takes_integers_as_float32(op, dtype):
    """numpy gave float64 (int32/int64) or float16 (8-bit ints, bool: values rounded), and sigmoid cast its
    result back to the integers: all zeros. torch and mint give float32."""
    x = np.array([0, 1, 2, 3], dtype) if dtype is not np.bool_ else np.array([False, True])
    got = op(Tensor(x))
    assert got.dtype == rt.float32
    want = {"exp": np.exp, "log": np.log, "sin": np.sin, "cos": np.cos, "tanh": np.tanh, "sqrt": np.sqrt}
    name = getattr(op, "__name__", "sigmoid")
    with np.errstate(divide="ignore"):  # log(0)
        ref = want.get(name, lambda v: 1 / (1 + np.exp(-v)))(x.astype(np.float64))
    np.testing.assert_allclose(got.asnumpy(), ref.astype(np.float32), rtol=1e-6)


@pytest.mark.parametrize("reduce", [lambda t: ops.sum(t, ()), lambda t: mint.sum(t, []), lambda t: mint.mean(t, ()),
                                    lambda t: ops.mean(t, [])])
def test_an_empty_axis_tuple_reduces_every_axis(reduce):
    """MindSpore's ReduceSum axis=() and torch's dim=() reduce all; numpy's axis=() reduced none."""
    x = Tensor(np.arange(6.0).reshape(2, 3))
    assert reduce(x).shape == ()


@pytest.mark.parametrize("extreme", [mint.max, mint.min, lambda t: ops.max(t)[0]])
def test_the_gradient_of_a_nan_extreme_goes_to_the_nan(extreme):
    """x == NaN never holds, so the tie share divided 0 by 0: NaN in every element's gradient. torch gives
    the gradient to the NaN element."""
    a = Tensor(np.array([1.0, np.nan, 3.0], np.float32), requires_grad=True)
    assert rt.grad(lambda t: extreme(t))(a).asnumpy().tolist() == [0.0, 1.0, 0.0]


def test_numpy_scalars_and_two_numbers_take_the_tensors_dtype():
    f32, f16, i32 = (Tensor(np.ones(2, d)) for d in (np.float32, np.float16, np.int32))
    assert (f32 * np.sqrt(2.0)).dtype == rt.float32  # numpy's promotion gave float64
    assert (np.float64(2.0) * f32).dtype == rt.float32
    assert (f16 * np.float32(2)).dtype == rt.float16
    assert (i32 + np.int64(1)).dtype == rt.int32
    assert (i32 * np.float32(0.5)).dtype == rt.float32
    assert ops.add(1.0, 2).dtype == rt.float32  # two numbers: as a float alone
    assert ops.where(Tensor(np.array([True, False])), 2, 2.5).dtype == rt.float32
    assert (i32 * 1j).dtype == rt.complex64


def test_mint_add_with_alpha_keeps_the_inputs_dtype():
    f32, f16, i32 = (Tensor(np.ones(2, d)) for d in (np.float32, np.float16, np.int32))
    assert mint.add(f32, 2, alpha=2.5).dtype == rt.float32  # alpha * other was two numbers made float64
    assert mint.add(f16, 2.5, alpha=2.5).dtype == rt.float16
    assert mint.sub(i32, 2, alpha=3).dtype == rt.int32
    assert mint.add(f32, 1.5, alpha=2).asnumpy().tolist() == [4.0, 4.0]


def test_clip_follows_torchs_clamp():
    ints = Tensor(np.array([-2, 0, 1, 3], np.int32))
    got = ops.clip(ints, 0.5, 2.5)  # the bounds were truncated to the integers: 0 below min
    assert got.dtype == rt.float32 and got.asnumpy().tolist() == [0.5, 0.5, 1.0, 2.5]
    assert ops.clip(Tensor(np.array([0.0, 1.0, 5.0])), 1.0, -1.0).asnumpy().tolist() == [-1.0] * 3  # min > max
    # Tensor bounds: at a tie the input keeps its gradient (maximum/minimum split it in half)
    x = Tensor(np.array([0.0, 1.0, -1.0, 3.0]), requires_grad=True)
    lo, hi = Tensor(np.zeros(4), requires_grad=True), Tensor(np.array([2.0, 1.0, 2.0, 2.0]), requires_grad=True)
    gx, glo, ghi = rt.grad(lambda a, b, c: ops.sum(ops.clip(a, b, c)), (0, 1, 2))(x, lo, hi)
    assert gx.asnumpy().tolist() == [1.0, 1.0, 0.0, 0.0]
    assert glo.asnumpy().tolist() == [0.0, 0.0, 1.0, 0.0] and ghi.asnumpy().tolist() == [0.0, 0.0, 0.0, 1.0]
    rng = np.random.default_rng(0)
    assert gradcheck(lambda a, b, c: ops.clip(a, b, c),
                     tuple(Tensor(rng.uniform(-1, 1, 5) + off, requires_grad=True) for off in (0.0, -0.5, 0.5)))


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint8, np.int32])
def test_mint_sum_of_integers_is_int64(dtype):
    """numpy summed uint8 to uint64; torch and MindSpore's mint.sum give int64."""
    x = Tensor(np.array([1, 0, 1], dtype))
    got = mint.sum(x)
    assert got.dtype == rt.int64 and int(got.asnumpy()) == 2
    assert mint.sum(x, dtype=rt.int32).dtype == rt.int32


def test_clip_with_tensor_bounds_keeps_nan_as_torch():
    """Through where() a NaN bound was dropped (x came back) and a NaN input got the gradient; torch's clamp
    gives NaN, and no gradient to a NaN input."""
    x = Tensor(np.float32([0.5, 0.5]))
    got = ops.clip(x, Tensor(np.float32([np.nan, 0.0])), Tensor(np.float32([1.0, np.nan])))
    assert np.isnan(got.asnumpy()).all()
    x = Tensor(np.array([0.0, 1.0, -1.0, 3.0, np.nan]), requires_grad=True)
    lo = Tensor(np.zeros(5), requires_grad=True)
    hi = Tensor(np.array([2.0, 1.0, 2.0, 2.0, 2.0]), requires_grad=True)
    gx, glo, ghi = rt.grad(lambda a, b, c: ops.sum(ops.clip(a, b, c)), (0, 1, 2))(x, lo, hi)
    assert gx.asnumpy().tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert glo.asnumpy().tolist() == [0.0, 0.0, 1.0, 0.0, 0.0] and ghi.asnumpy().tolist() == [0.0, 0.0, 0.0, 1.0, 0.0]
    assert ops.clip(Tensor(np.ones(2)), Tensor(np.ones(2) * 0.5), None).asnumpy().tolist() == [1.0, 1.0]


@pytest.mark.parametrize("op", [ops.maximum, ops.minimum])
def test_maximum_and_minimum_give_a_nan_pair_the_gradient_on_both_sides(op):
    """torch: where either input is NaN, neither loses, so both get the gradient (the runtime gave 0 to both,
    which a second derivative showed); a tie still splits it in half."""
    x = Tensor(np.float32([np.nan, 2.0, 1.0]), requires_grad=True)
    y = Tensor(np.float32([1.0, 1.0, 1.0]), requires_grad=True)
    gx, gy = rt.grad(lambda a, b: ops.sum(op(a, b)), grad_position=(0, 1))(x, y)
    wins_x = 1.0 if op is ops.maximum else 0.0
    assert gx.asnumpy().tolist() == [1.0, wins_x, 0.5]
    assert gy.asnumpy().tolist() == [1.0, 1.0 - wins_x, 0.5]

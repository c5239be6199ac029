"""ms_extension.h's host custom::CustomLaunchAclnn (include/mindspore/aclnn_host.h): each operator against
numpy across dtypes, broadcasting and strided inputs, the argument forms MindSpore sources write, a clear
error for each bad call, and gradients of Functions built on it against central differences (float64)."""
from pathlib import Path

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor

CPP = Path(__file__).resolve().parents[1] / "cpp"
FLOATS = ["float64", "float32", "float16"]
INTS = ["int64", "int32", "int16", "int8", "uint8"]


@pytest.fixture(scope="session")
def aclnn_ops(cache_dir):
    from opbuilder import CustomOpBuilder
    # the header's templates instantiated by a real build must be warning-free
    return CustomOpBuilder("aclnn_host_ops", [str(CPP / "aclnn_host_ops.cpp")],
                           cflags=["-Wall", "-Wextra", "-Werror"]).load()


def launch(ops, name, args, dtype, shape):
    """out = name(*args) into a new out of ``dtype`` and ``shape``; out as numpy."""
    out = Tensor(np.full(shape, 7, dtype))
    ops.launch(name, [Tensor(a) if isinstance(a, np.ndarray) else a for a in args], [out])
    return out.asnumpy()


def data(dtype, shape, seed=0, positive=False):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        a = rng.standard_normal(shape) * 3
        return (np.abs(a) + 0.1 if positive else a).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -100), min(info.max, 100), size=shape, endpoint=True).astype(dtype)


def check(got, want, dtype, exact=False):
    assert got.dtype == np.dtype(dtype) and got.shape == want.shape
    if exact or np.dtype(dtype).kind != "f":
        np.testing.assert_array_equal(got, want)
    else:
        rtol = {"float64": 1e-15, "float32": 1e-6, "float16": 1e-3}[dtype]
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=0)


BINARY = {"aclnnAdd": np.add, "aclnnSub": np.subtract, "aclnnMul": np.multiply, "aclnnDiv": np.divide}


@pytest.mark.parametrize("name,dtype", [(n, d) for n in sorted(BINARY) for d in FLOATS + INTS
                                        if n != "aclnnDiv" or d in FLOATS])  # Div of ints: a float out, below
def test_binary_ops_broadcast_like_numpy(aclnn_ops, name, dtype):
    x, y = data(dtype, (2, 1, 3), 1), data(dtype, (4, 1), 2)
    if name == "aclnnDiv":
        y = np.where(y == 0, 1, y).astype(dtype)
    got = launch(aclnn_ops, name, [x, y], dtype, (2, 4, 3))
    # numpy's float16 and float32 results are correctly rounded for these, as the host's are
    check(got, BINARY[name](x, y).astype(dtype), dtype, exact=dtype in ("float32", "float64") and name != "aclnnDiv")


def test_division_of_integers_into_a_float_out(aclnn_ops):
    x, y = np.array([7, -7, 1], np.int32), np.array([2, 2, 3], np.int64)
    check(launch(aclnn_ops, "aclnnDiv", [x, y], "float64", (3,)), x / y, "float64")


def test_integer_results_wrap_as_the_dtype_does(aclnn_ops):
    x, y = np.array([100, -128, 127], np.int8), np.array([100, 1, 2], np.int8)
    check(launch(aclnn_ops, "aclnnMul", [x, y], "int8", (3,)), x * y, "int8")
    check(launch(aclnn_ops, "aclnnAdd", [x, y], "int8", (3,)), x + y, "int8")
    big = np.array([2**62, -2**63], np.int64)
    check(launch(aclnn_ops, "aclnnAdd", [big, big], "int64", (2,)), big + big, "int64")


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64", "int16"])
@pytest.mark.parametrize("name,fn", [("aclnnAdd", lambda x, y, a: x + a * y), ("aclnnSub", lambda x, y, a: x - a * y)])
def test_alpha_scales_other(aclnn_ops, name, fn, dtype):
    x, y = data(dtype, (3, 4), 3), data(dtype, (4,), 4)
    for alpha in ([3, -2, True] if dtype in INTS else [0.5, -2, 3.25]):
        want = fn(x.astype(np.float64), y.astype(np.float64), float(alpha)).astype(dtype)
        check(launch(aclnn_ops, name, [x, y, alpha], dtype, (3, 4)), want, dtype)


@pytest.mark.parametrize("name,fn", [("aclnnAdds", lambda x, s, a: x + a * s), ("aclnnSubs", lambda x, s, a: x - a * s),
                                     ("aclnnMuls", lambda x, s, a: x * s), ("aclnnDivs", lambda x, s, a: x / s)])
def test_scalar_other_forms(aclnn_ops, name, fn):
    x = data("float64", (2, 3), 5)
    args = [x, 2.5, 3] if name in ("aclnnAdds", "aclnnSubs") else [x, 2.5]
    check(launch(aclnn_ops, name, args, "float64", (2, 3)), fn(x, 2.5, 3), "float64", exact=True)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


UNARY = {"aclnnNeg": np.negative, "aclnnExp": np.exp, "aclnnLog": np.log, "aclnnSqrt": np.sqrt, "aclnnAbs": np.abs,
         "aclnnRelu": lambda x: np.maximum(x, 0), "aclnnSigmoid": _sigmoid, "aclnnTanh": np.tanh}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_ops_match_numpy(aclnn_ops, name, dtype):
    x = data(dtype, (3, 5), 6, positive=name in ("aclnnLog", "aclnnSqrt"))
    want = UNARY[name](x.astype(np.float64)).astype(dtype)  # the exact result, rounded once
    check(launch(aclnn_ops, name, [x], dtype, (3, 5)), want, dtype)


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("name", ["aclnnNeg", "aclnnAbs", "aclnnRelu"])
def test_integer_unary_ops(aclnn_ops, name, dtype):
    x = data(dtype, (7,), 8)
    check(launch(aclnn_ops, name, [x], dtype, (7,)), UNARY[name](x).astype(dtype), dtype)


def test_integer_and_bool_inputs_into_a_float_out(aclnn_ops):
    x = np.array([1, 4, 9], np.int32)
    check(launch(aclnn_ops, "aclnnSqrt", [x], "float32", (3,)), np.array([1, 2, 3], np.float32), "float32", exact=True)
    b = np.array([True, False, True])
    check(launch(aclnn_ops, "aclnnMul", [b, x], "int32", (3,)), b * x, "int32")


def test_strided_views_are_read_through_their_strides(aclnn_ops):
    base = data("float64", (4, 6), 9)
    x = Tensor(base).T  # a transposed view: not C-contiguous
    y = base[::2, ::3]  # a numpy view crosses as it is
    out = Tensor(np.zeros((6, 4)))
    aclnn_ops.launch("aclnnMul", [x, Tensor(np.arange(4.0))], [out])
    np.testing.assert_array_equal(out.asnumpy(), base.T * np.arange(4.0))
    out = Tensor(np.zeros(2))
    aclnn_ops.launch("aclnnReduceSum", [y, [0], False], [out])
    np.testing.assert_array_equal(out.asnumpy(), base[::2, ::3].sum(axis=0))


@pytest.mark.parametrize("dims,keep", [([0], False), ([1, -1], True), ([], False), ([-3, 1], False), ([2], True)])
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "int32", "int64"])
def test_reduce_sum(aclnn_ops, dims, keep, dtype):
    x = data(dtype, (2, 3, 4), 10)
    axes = tuple(dims) if dims else None
    want = x.astype(np.float64 if dtype in FLOATS else np.int64).sum(axis=axes, keepdims=keep).astype(dtype)
    got = launch(aclnn_ops, "aclnnReduceSum", [x, dims, keep, dtype], dtype, want.shape)
    check(got, want, dtype)


def test_reduce_sum_argument_forms_and_a_wider_out(aclnn_ops):
    x = data("int8", (3, 4), 11)
    # dims only (keepDim false); everything; an int8 sum in int64 does not wrap
    check(launch(aclnn_ops, "aclnnReduceSum", [x, [1]], "int64", (3,)), x.astype(np.int64).sum(axis=1), "int64")
    check(launch(aclnn_ops, "aclnnReduceSum", [x], "int64", ()), np.array(x.astype(np.int64).sum()), "int64")
    f = data("float32", (3, 4), 12)
    check(launch(aclnn_ops, "aclnnReduceSum", [f, [0], True, "float64"], "float64", (1, 4)),
          f.astype(np.float64).sum(axis=0, keepdims=True), "float64", exact=True)


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((4,), (4,)), ((2, 3, 4), (4,)), ((4,), (2, 4, 5)),
                                   ((2, 1, 3, 4), (5, 4, 2)), ((1, 0), (0, 3))])
@pytest.mark.parametrize("dtype", ["float64", "float32", "int32"])
def test_matmul_follows_matmul_rules(aclnn_ops, sa, sb, dtype):
    a, b = data(dtype, sa, 13), data(dtype, sb, 14)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(dtype)
    got = launch(aclnn_ops, "aclnnMatmul", [a, b], dtype, want.shape)
    if dtype == "int32":
        check(got, want, dtype)
    else:  # sums in another order than numpy's: within a few roundings of the sum of |products|
        bound = np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64))
        assert got.dtype == np.dtype(dtype) and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=(8 * np.finfo(dtype).eps * bound).max(initial=0))


def test_matmul_takes_cube_math_type_and_strided_operands(aclnn_ops):
    base = data("float64", (4, 3), 15)
    out = Tensor(np.zeros((3, 3)))
    aclnn_ops.launch("aclnnMatmul", [base.T, Tensor(base), 1], [out])
    np.testing.assert_allclose(out.asnumpy(), base.T @ base, rtol=1e-14)


def test_argument_forms_of_mindspore_sources(aclnn_ops):
    x, y = data("float32", (2, 3), 16), data("float32", (2, 3), 17)
    add1, add25, sub3, rsum, mul = [t.asnumpy() for t in aclnn_ops.forms(Tensor(x), Tensor(y))]
    d = np.float64
    check(add1, (x.astype(d) + y).astype(np.float32), "float32", exact=True)
    check(add25, (x.astype(d) + 2.5 * y.astype(d)).astype(np.float32), "float32", exact=True)
    check(sub3, (x.astype(d) - 3 * y.astype(d)).astype(np.float32), "float32", exact=True)
    check(rsum, x.astype(d).sum(axis=0), "float64", exact=True)
    check(mul, x * y, "float32", exact=True)


SUPPORTED = ("aclnnAbs, aclnnAdd, aclnnAdds, aclnnDiv, aclnnDivs, aclnnExp, aclnnLog, aclnnMatmul, aclnnMul, "
             "aclnnMuls, aclnnNeg, aclnnReduceSum, aclnnRelu, aclnnSigmoid, aclnnSqrt, aclnnSub, aclnnSubs, aclnnTanh")


def test_an_unknown_operator_is_named_with_the_supported_ones(aclnn_ops):
    with pytest.raises(ValueError) as e:
        launch(aclnn_ops, "aclnnSoftmax", [np.ones(3)], "float64", (3,))
    assert str(e.value) == f"CustomLaunchAclnn: unknown aclnn operator 'aclnnSoftmax'; supported on the host: {SUPPORTED}"


F, I = np.ones((2, 3)), np.ones((2, 3), np.int32)
BAD_CALLS = [
    ("aclnnMul", [F], "float64", (2, 3), r"^aclnnMul: expected inputs \(self, other\), got 1 inputs$"),
    ("aclnnAdd", [F, F, 1, 2], "float64", (2, 3), r"^aclnnAdd: expected inputs \(self, other, alpha\), got 4 inputs$"),
    ("aclnnAdd", [F, F, [1]], "float64", (2, 3), r"^aclnnAdd: alpha must be a scalar$"),
    ("aclnnAdds", [F, F], "float64", (2, 3), r"^aclnnAdds: other must be a scalar$"),
    ("aclnnMul", [F, 2.0], "float64", (2, 3), r"^aclnnMul: other must be a tensor$"),
    ("aclnnMul", [F, None], "float64", (2, 3), r"^aclnnMul: other is a null tensor$"),
    ("aclnnMul", [np.ones(2), np.ones(3)], "float64", (2,),
     r"^aclnnMul: shapes \[2\] and \[3\] cannot be broadcast together$"),
    ("aclnnMul", [F, F], "float64", (3, 2), r"^aclnnMul: out has shape \[3, 2\], the inputs broadcast to \[2, 3\]$"),
    ("aclnnMul", [F, I], "int32", (2, 3), r"^aclnnMul: a float64 input cannot be written to an int32 out$"),
    ("aclnnAdd", [I, I, 0.5], "int32", (2, 3), r"^aclnnAdd: a float alpha cannot be used with an integer out$"),
    ("aclnnMuls", [I, 0.5], "int32", (2, 3), r"^aclnnMuls: a float other cannot be used with an integer out$"),
    ("aclnnDiv", [I, I], "int32", (2, 3), r"^aclnnDiv: out has dtype int32; it must be float16, float32 or float64$"),
    ("aclnnExp", [I], "int64", (2, 3), r"^aclnnExp: out has dtype int64; it must be float16, float32 or float64$"),
    ("aclnnNeg", [F], "bool", (2, 3), r"^aclnnNeg: out of dtype bool is not supported$"),
    ("aclnnNeg", [F], "float64", (3, 2), r"^aclnnNeg: out has shape \[3, 2\], self has shape \[2, 3\]$"),
    ("aclnnReduceSum", [F, 0], "float64", (3,), r"^aclnnReduceSum: dim must be a list of integers"),
    ("aclnnReduceSum", [F, [2]], "float64", (3,),
     r"^aclnnReduceSum: dim 2 is out of range for a tensor of 2 dimensions$"),
    ("aclnnReduceSum", [F, [1, -1]], "float64", (2,), r"^aclnnReduceSum: dim -1 appears twice$"),
    ("aclnnReduceSum", [F, [0], 1], "float64", (3,), r"^aclnnReduceSum: keepDim must be a bool$"),
    ("aclnnReduceSum", [F, [0], False, "float32"], "float64", (3,),
     r"^aclnnReduceSum: dtype float32 differs from out's dtype float64$"),
    ("aclnnReduceSum", [F, [0], True], "float64", (3,),
     r"^aclnnReduceSum: out has shape \[3\], the sum has shape \[1, 3\]$"),
    ("aclnnMatmul", [F, F], "float64", (2, 3), r"^aclnnMatmul: self \[2, 3\] and mat2 \[2, 3\] cannot be multiplied$"),
    ("aclnnMatmul", [F, F.T.copy(), 0.5], "float64", (2, 2), r"^aclnnMatmul: cubeMathType must be an integer$"),
    ("aclnnMatmul", [np.ones(()), F], "float64", (2, 3),
     r"^aclnnMatmul: self and mat2 must have at least 1 dimension$"),
    ("aclnnMatmul", [F, F.T.copy()], "float64", (2, 3),
     r"^aclnnMatmul: out has shape \[2, 3\], the product has shape \[2, 2\]$"),
]


@pytest.mark.parametrize("name,args,dtype,shape,message", BAD_CALLS, ids=[m[4][1:40] for m in BAD_CALLS])
def test_bad_calls_are_clear_errors(aclnn_ops, name, args, dtype, shape, message):
    with pytest.raises(ValueError, match=message):
        launch(aclnn_ops, name, args, dtype, shape)


def test_output_count_and_a_read_only_out(aclnn_ops):
    x = Tensor(np.ones(3))
    with pytest.raises(ValueError, match=r"^aclnnNeg: expected 1 output tensor, got 2$"):
        aclnn_ops.launch("aclnnNeg", [x], [Tensor(np.ones(3)), Tensor(np.ones(3))])
    ro = np.zeros(3)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"^aclnnNeg: out is read-only$"):
        aclnn_ops.launch("aclnnNeg", [x], [ro])
    np.testing.assert_array_equal(ro, np.zeros(3))


def test_functions_built_on_aclnn_ops_have_numerical_gradients(aclnn_ops):
    rng = np.random.default_rng(18)
    x, y = Tensor(rng.standard_normal((2, 3))), Tensor(rng.standard_normal((3,)))
    assert rt.gradcheck(lambda a, b: aclnn_ops.add_alpha(a, b, -1.5), [x, y])
    assert rt.gradcheck(lambda a: aclnn_ops.exp_sum(a, [1]), [x])
    assert rt.gradcheck(lambda a: aclnn_ops.exp_sum(a, [0, -1]), [x])
    assert rt.gradcheck(aclnn_ops.tanh, [x])

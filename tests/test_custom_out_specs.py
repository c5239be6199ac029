"""ops.Custom's out_dtype given as numpy types, and out_shape/out_dtype functions that return None."""
from pathlib import Path

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, ops
from runtime.ops import CustomRegOp

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

ROOT = Path(__file__).resolve().parents[1]
ADD = str(ROOT / "custom_src" / "aot_add.cpp")
OPS = str(ROOT / "custom_src" / "aot_ops.cpp")


@pytest.mark.parametrize("dtype", [np.float32, np.dtype("float32"), "float32", rt.float32],
                         ids=["np.float32", "np.dtype", "str", "rt.float32"])
def test_out_dtype_as_a_numpy_type_a_numpy_dtype_or_a_name(dtype):
    op = ops.Custom(f"{ADD}:CustomAdd", out_shape=[3], out_dtype=dtype, func_type="aot")
    out = op(Tensor([1.0, 2.0, 3.0]), Tensor([3.0, 2.0, 1.0]))
    assert out.dtype == rt.float32 and out.tolist() == [4.0, 4.0, 4.0]


def test_out_dtype_lists_of_numpy_types_and_a_shape_function_beside_a_numpy_type():
    sincos = ops.Custom(f"{OPS}:SinCos", out_shape=lambda x: [x, x], out_dtype=[np.float64, np.dtype("float64")])
    s, c = sincos(Tensor(np.array([0.0, 1.0])))
    assert s.dtype == c.dtype == rt.float64
    np.testing.assert_allclose(c.asnumpy(), np.cos([0.0, 1.0]))
    leaky = ops.Custom(f"{OPS}:LeakyRelu", out_shape=lambda x: x, out_dtype=np.float64)
    assert leaky(Tensor(np.array([-1.0, 2.0]))).tolist() == [-0.01, 2.0]


def test_a_numpy_type_as_a_pyfunc_out_dtype():
    op = ops.Custom(lambda x: x * 2, out_shape=lambda x: x, out_dtype=np.int64, func_type="pyfunc")
    out = op(Tensor([1, 2], rt.int32))
    assert out.dtype == rt.int64 and out.tolist() == [2, 4]


def test_an_out_shape_function_returning_none_names_the_op():
    op = ops.Custom(f"{ADD}:CustomAdd", out_shape=lambda x, y: None, out_dtype=np.float32)
    with pytest.raises(ValueError, match=r"Custom 'CustomAdd': its out_shape function returned None for input "
                                         r"shapes \[\[3\], \[3\]\]; it must return the output's shape \(a list "
                                         r"of ints, \[\] for a scalar\) or a list of shapes"):
        op(Tensor([1.0, 2.0, 3.0]), Tensor([1.0, 2.0, 3.0]))

    def double(x):
        return x * 2

    py = ops.Custom(double, out_shape=lambda x: None, func_type="pyfunc")
    with pytest.raises(ValueError, match="Custom 'double': its out_shape function returned None"):
        py(Tensor([1.0]))


def test_an_out_dtype_function_returning_none_names_the_op():
    op = ops.Custom(f"{ADD}:CustomAdd", out_shape=[1], out_dtype=lambda x, y: None)
    with pytest.raises(ValueError, match=r"Custom 'CustomAdd': its out_dtype function returned None for input "
                                         r"dtypes \[Float32, Float32\]; it must return the output's dtype"):
        op(Tensor([1.0]), Tensor([2.0]))


def test_a_dtype_that_is_not_one_is_still_a_type_error():
    with pytest.raises(TypeError, match="Custom 'CustomAdd': output 0 dtype: unsupported tensor dtype float128"):
        ops.Custom(f"{ADD}:CustomAdd", out_shape=[1], out_dtype=np.longdouble)  # (complex64 is a dtype now)


_RETURNS = (r"; a pyfunc must return its outputs as Tensors, numpy arrays or numbers \(a tuple or list of them "
            r"for several\)")


@pytest.mark.parametrize("declared", [{}, {"out_shape": lambda x: x, "out_dtype": rt.float32},
                                      {"out_shape": lambda x: [x, x], "out_dtype": [rt.float32, rt.float32]},
                                      {"out_dtype": rt.float32}], ids=["nothing", "one", "two", "dtype"])
def test_a_pyfunc_returning_none_says_so(declared):
    def forgot_return(x):
        x * 2

    op = ops.Custom(forgot_return, func_type="pyfunc", **declared)
    with pytest.raises(TypeError, match=r"^pyfunc 'forgot_return' returned None" + _RETURNS + "$"):
        op(Tensor([1.0, 2.0]))


def test_a_pyfunc_output_that_is_none_or_not_an_array_is_named():
    pair = ops.Custom(lambda x: (x * 2, None), func_type="pyfunc")
    with pytest.raises(TypeError, match=r"^pyfunc '<lambda>' output 1 is None" + _RETURNS):
        pair(Tensor([1.0]))
    odd = ops.Custom(lambda x: [x, {"a": 1}], out_shape=lambda x: [x, x], out_dtype=[rt.float32] * 2,
                     func_type="pyfunc")
    with pytest.raises(TypeError, match=r"^pyfunc '<lambda>' output 1 is a dict \(\{'a': 1\}\)" + _RETURNS):
        odd(Tensor([1.0]))


def test_a_call_with_the_wrong_number_of_inputs_names_the_op_not_its_shape_function():
    """Before, the out_shape callable ran first and its own TypeError spoke: "<lambda>() missing 1 required
    positional argument: 'y'" (and, with a reg_info declaring the inputs, "takes 1 positional argument")."""
    add = ops.Custom(lambda x, y: x + y, out_shape=lambda x, y: x, out_dtype=lambda x, y: x, func_type="pyfunc")
    with pytest.raises(TypeError, match=r"^Custom '<lambda>' was called with 1 input\(s\), which its out_shape "
                                        r"function <lambda>\(x, y\) does not take: pass one tensor per input of the "
                                        r"op$"):
        add(Tensor([1.0]))
    info = CustomRegOp("neg").input(0, "x").output(0, "y").get_op_info()
    neg = ops.Custom(lambda x: -x, out_shape=lambda x: x, out_dtype=lambda x: x, func_type="pyfunc", reg_info=info)
    with pytest.raises(TypeError, match=r"^Custom '<lambda>' takes 1 inputs \(its reg_info\), got 2$"):
        neg(Tensor([1.0]), Tensor([2.0]))
    assert add(Tensor([1.0]), Tensor([2.0])).tolist() == [3.0]


def test_a_decorated_shape_function_keeps_its_own_type_error():
    """The arity check reads the function's own signature: a functools.wraps decorator's (*args) takes any
    count, so a TypeError raised inside the rule is the rule's, not "called with 2 input(s)"."""
    import functools

    def with_rank(fn):  # passes one more argument than the op's inputs: its signature is not fn's
        @functools.wraps(fn)
        def rule(*shapes):
            return fn(*shapes, len(shapes[0]))
        return rule

    @with_rank
    def rule(x, y, rank):
        return x + rank  # a list plus an int: the rule's own bug

    add = ops.Custom(lambda x, y: x + y, out_shape=rule, out_dtype=lambda x, y: x, func_type="pyfunc")
    with pytest.raises(TypeError, match=r'^can only concatenate list \(not "int"\) to list$'):
        add(Tensor([1.0]), Tensor([2.0]))


@pytest.mark.parametrize("fn, dtype, src, dst", [
    (lambda x: x * 1.7, rt.int32, "Float64", "Int32"),                 # 1.7 truncated to 1
    (lambda x: np.array([300, -1]), rt.uint8, "Int64", "UInt8"),        # wrapped to [44, 255]
    (lambda x: x * (1 + 1j), rt.float64, "Complex128", "Float64"),     # the imaginary part dropped
])
def test_a_pyfunc_output_whose_cast_would_change_its_values_is_refused(fn, dtype, src, dst):
    """A wrong shape was a ValueError, but a wrong dtype was cast silently, truncating or wrapping."""
    op = rt.ops.Custom(fn, [2], dtype, func_type="pyfunc")
    with pytest.raises(TypeError) as info:
        op(np.ones(2))
    assert str(info.value) == (f"pyfunc '<lambda>' output 0 is {src}, out_dtype declares {dst}: the cast would change "
                               f"its values (truncate, wrap or drop the imaginary part); return that dtype "
                               f"(result.astype(...)) or declare the result's")


def test_a_pyfunc_output_cast_that_keeps_its_kind_is_made():
    np.testing.assert_array_equal(rt.ops.Custom(lambda x: x + 1e-10, [2], rt.float32, func_type="pyfunc")(
        np.ones(2)).asnumpy(), np.ones(2, np.float32))
    assert rt.ops.Custom(lambda x: np.array([3, 1]), [2], rt.uint8, func_type="pyfunc")(np.ones(2)).tolist() == [3, 1]

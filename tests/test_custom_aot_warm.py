"""Warm calls of an aot ops.Custom: after its first call a host op with fixed output specs is called
through one C function (Tensors in, Tensors out; custom.py ``_fast``), others through ``_host``. Every
check of the first call must hold on the calls after it: results, read-only inputs, inputs that are not
Tensors, gradients, kernel failures, several outputs, and an array of a dtype tensors do not hold."""
from pathlib import Path

import numpy as np
import pytest

import runtime as rt
from runtime import Parameter, Tensor, no_grad, ops

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

ROOT = Path(__file__).resolve().parents[1]
ADD = str(ROOT / "custom_src" / "aot_add.cpp")
OPS = str(ROOT / "custom_src" / "aot_ops.cpp")
INPLACE = str(ROOT / "custom_src" / "aot_inplace.cpp")


def warm(op, *args):
    """``op`` after a first call (so the later ones take the warm path), and that call's result."""
    return op(*args)


def square_bprop(x, out, dout):
    return (dout * x * 2.0,)


@pytest.fixture(scope="module")
def add():
    op = ops.Custom(f"{ADD}:CustomAdd", out_shape=[3], out_dtype=rt.float32, func_type="aot")
    warm(op, Tensor([1.0, 2.0, 3.0]), Tensor([1.0, 1.0, 1.0]))
    assert op._fast is not None  # the path these tests are about
    return op


def test_warm_calls_give_the_sum_for_tensors_arrays_and_parameters(add):
    a, b = np.array([1.0, 2.0, 3.0], np.float32), np.array([0.5, 0.25, 0.125], np.float32)
    for x, y in ((Tensor(a), Tensor(b)), (a, b), (Tensor(a), b), (Parameter(Tensor(a), requires_grad=False), b)):
        res = add(x, y)
        assert type(res) is Tensor and res.dtype == rt.float32
        np.testing.assert_array_equal(res.asnumpy(), a + b)


def test_warm_calls_return_fresh_outputs(add):
    x, y = Tensor([1.0, 2.0, 3.0]), Tensor([1.0, 1.0, 1.0])
    r1, r2 = add(x, y), add(x, y)
    assert r1 is not r2 and not np.shares_memory(r1.asnumpy(), r2.asnumpy())
    assert not np.shares_memory(r1.asnumpy(), x.asnumpy())


def test_a_warm_call_never_writes_a_read_only_input():
    op = ops.Custom(f"{INPLACE}:AssignAdd", out_shape=[3], out_dtype=rt.float32)
    warm(op, Tensor(np.ones(3, np.float32)), Tensor(np.ones(3, np.float32)))
    assert op._fast is not None
    a = np.ones(3, np.float32)
    a.flags.writeable = False
    res = op(Tensor(a), Tensor(np.array([1.0, 2.0, 3.0], np.float32)))
    assert res.tolist() == [2.0, 3.0, 4.0]
    assert a.tolist() == [1.0, 1.0, 1.0]  # the kernel wrote a private copy


def test_a_warm_call_with_an_input_requiring_grad_records_the_bprop():
    op = ops.Custom(f"{OPS}:Square", out_shape=[3], out_dtype=rt.float64, bprop=square_bprop)
    warm(op, Tensor(np.ones(3)))
    x = Tensor(np.array([0.5, -1.5, 2.0]), requires_grad=True)
    y = op(x)
    np.testing.assert_array_equal(y.asnumpy(), [0.25, 2.25, 4.0])
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.asnumpy(), [1.0, -3.0, 4.0])
    # central differences of the op itself (float64)
    x0, h = np.array([0.5, -1.5, 2.0]), 1e-6
    fd = [(op(Tensor(x0 + h * e)).asnumpy().sum() - op(Tensor(x0 - h * e)).asnumpy().sum()) / (2 * h)
          for e in np.eye(3)]
    np.testing.assert_allclose(x.grad.asnumpy(), fd, rtol=1e-6)
    with no_grad():
        z = op(x)
    assert z._node is None and not z.requires_grad


def test_a_warm_call_without_a_bprop_still_refuses_a_backward():
    op = ops.Custom(f"{OPS}:Square", out_shape=[2], out_dtype=rt.float64)
    warm(op, Tensor(np.ones(2)))
    y = op(Tensor(np.ones(2), requires_grad=True))
    with pytest.raises(RuntimeError, match=r"Custom 'Square' has no bprop, so no gradient flows through it"):
        y.sum().backward()


def test_a_warm_call_that_fails_raises_the_kernels_status(add):
    # the seed kernel returns 2 for a dtype other than float32
    with pytest.raises(RuntimeError, match=r"aot operator 'CustomAdd' in .*aot_add.* returned status 2$"):
        add(Tensor([1.0, 2.0, 3.0], rt.float64), Tensor([1.0, 2.0, 3.0], rt.float64))
    np.testing.assert_array_equal(add(Tensor([1.0, 2.0, 3.0]), Tensor([1.0, 2.0, 3.0])).asnumpy(), [2.0, 4.0, 6.0])


def test_a_warm_call_with_two_outputs_returns_both():
    op = ops.Custom(f"{OPS}:SinCos", out_shape=[[4], [4]], out_dtype=[rt.float64, rt.float64])
    x = np.linspace(-2.0, 2.0, 4)
    for _ in range(2):
        s, c = op(Tensor(x))
        assert type(s) is Tensor and type(c) is Tensor
        np.testing.assert_allclose(s.asnumpy(), np.sin(x), rtol=1e-15)
        np.testing.assert_allclose(c.asnumpy(), np.cos(x), rtol=1e-15)


def test_a_warm_call_refuses_an_array_of_a_dtype_tensors_do_not_hold(add):
    # not a Tensor: the warm path hands it to the general one, which checks it as the first call does
    # (uint16, the example here, is a tensor dtype now: issue 23)
    with pytest.raises(TypeError, match=r"unsupported tensor dtype float128; supported: float16, bfloat16, float32"):
        add(np.zeros(3, np.longdouble), Tensor([1.0, 2.0, 3.0]))

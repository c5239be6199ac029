"""Gradients through ops.Custom: bprop=, Cell.bprop, several outputs; pyfunc ops."""
from pathlib import Path

import numpy as np
import pytest

import runtime as rt
from runtime import Parameter, Tensor, nn, ops

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

ROOT = Path(__file__).resolve().parents[1]
ADD = str(ROOT / "custom_src" / "aot_add.cpp")
OPS = str(ROOT / "custom_src" / "aot_ops.cpp")


def square_with_custom_bprop():
    """The seed's pattern: the bprop uses another custom op, defined outside it."""
    square_grad = ops.Custom(f"{OPS}:SquareGrad", lambda x, _: x, lambda x, _: x, func_type="aot")

    def custom_bprop(x, out, dout):
        return (square_grad(x, dout),)

    return ops.Custom(f"{OPS}:Square", lambda x: x, lambda x: x, bprop=custom_bprop, func_type="aot")


class SquareNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.op = square_with_custom_bprop()

    def construct(self, x):
        return self.op(x)


def test_seed_bprop_with_a_custom_op_inside():
    x = np.array([1.0, 4.0, 9.0]).astype(np.float32)
    dx = rt.grad(SquareNet())(Tensor(x))
    np.testing.assert_array_equal(dx.asnumpy(), [2.0, 8.0, 18.0])


def test_bprop_gradients_match_central_differences():
    op = square_with_custom_bprop()
    x = Tensor(np.random.default_rng(0).standard_normal((3, 4)))
    assert rt.gradcheck(lambda t: op(t) * 3.0 + t, [x])


def test_bprop_composes_with_builtin_ops_and_parameters():
    op = square_with_custom_bprop()

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = Parameter(np.array([0.5, -2.0]))

        def construct(self, x):
            return (op(x * self.w) + x).sum()

    net = Net()
    x = Tensor(np.array([3.0, 1.0]))
    out, (gx, gw) = rt.value_and_grad(net, grad_position=0, weights=net.trainable_params())(x)
    w = net.w.asnumpy()
    assert out.item() == pytest.approx(float(np.sum((x.asnumpy() * w) ** 2 + x.asnumpy())))
    np.testing.assert_allclose(gx.asnumpy(), 2 * x.asnumpy() * w * w + 1)
    np.testing.assert_allclose(gw[0].asnumpy(), 2 * x.asnumpy() ** 2 * w)


class Add(nn.Cell):
    """The seed's CUDA-article pattern: a Cell whose bprop stands for the aot op's gradient."""

    def __init__(self, n):
        super().__init__()
        self.custom_add = ops.Custom(f"{ADD}:CustomAdd", out_shape=[n], out_dtype=rt.float32, func_type="aot")

    def bprop(self, x, y, out, dout):
        return (y,)

    def construct(self, x, y):
        return self.custom_add(x, y)


def test_seed_cell_bprop_around_an_aot_op():
    t1 = Tensor([1.0, 2.0, 3.0], rt.float32)
    t2 = Tensor([3.0, 2.0, 1.0], rt.float32)
    custom_add = Add(3)
    np.testing.assert_array_equal(custom_add(t1, t2).asnumpy(), [4.0, 4.0, 4.0])
    res_g = rt.grad(custom_add, grad_position=(0,))(t1, t2)
    np.testing.assert_array_equal(res_g.asnumpy(), [3.0, 2.0, 1.0])
    # (y,) gives no gradient for y: asking for one is an error, not a silent zero
    with pytest.raises(ValueError, match="Add.bprop returned 1 gradients for 2 inputs"):
        rt.grad(custom_add, grad_position=(0, 1))(t1, t2)


def test_several_outputs_with_bprop():
    def sincos_bprop(x, out, dout):
        s, c = out
        ds, dc = dout
        return (ds * c - dc * s,)

    sincos = ops.Custom(f"{OPS}:SinCos", out_shape=lambda x: [x, x], out_dtype=lambda x: [x, x], bprop=sincos_bprop)
    x = Tensor(np.linspace(-2.0, 2.0, 5))
    assert rt.gradcheck(sincos, [x])
    assert rt.gradcheck(lambda t: sincos(t)[1], [x])  # one output unused: its dout arrives as zeros


def test_no_bprop_means_no_gradient_and_says_so():
    op = ops.Custom(f"{OPS}:Square", lambda x: x, lambda x: x)
    x = Tensor([2.0], rt.float32)
    assert op(x).requires_grad is False  # nothing recorded when no input needs grad
    with pytest.raises(RuntimeError, match="Custom 'Square' has no bprop, so no gradient flows through it"):
        rt.grad(lambda t: op(t).sum())(x)


def test_bprop_must_return_one_gradient_per_input_in_a_tuple():
    x = Tensor([2.0])
    op = ops.Custom(f"{OPS}:Square", lambda x: x, lambda x: x, bprop=lambda x, out, dout: dout)
    with pytest.raises(TypeError, match=r"Custom\(Square\) bprop must return a tuple with one gradient per input"):
        rt.grad(op)(x)
    op = ops.Custom(f"{OPS}:Square", lambda x: x, lambda x: x, bprop=lambda x, out, dout: (dout, dout))
    with pytest.raises(ValueError, match=r"Custom\(Square\) bprop returned 2 gradients for 1 inputs"):
        rt.grad(op)(x)
    with pytest.raises(TypeError, match="bprop must be callable"):
        ops.Custom(f"{OPS}:Square", lambda x: x, lambda x: x, bprop=3)


# ---- pyfunc -------------------------------------------------------------------

def test_pyfunc_on_numpy_arrays_with_a_differentiable_bprop():
    seen = []

    def cube(x):
        seen.append(type(x))
        return x ** 3

    op = ops.Custom(cube, out_shape=lambda x: x, out_dtype=lambda x: x, func_type="pyfunc",
                    bprop=lambda x, out, dout: (3 * x * x * dout,))
    x = Tensor(np.array([1.0, -2.0]))
    np.testing.assert_array_equal(op(x).asnumpy(), [1.0, -8.0])
    assert seen[0] is np.ndarray
    assert rt.gradcheck(op, [x])
    # the bprop is built from runtime ops, so a second derivative flows through it
    d2 = rt.grad(rt.grad(lambda t: op(t).sum()))(x)
    np.testing.assert_allclose(d2.asnumpy(), 6 * x.asnumpy())


def test_pyfunc_outputs_follow_out_shape_and_out_dtype():
    halves = ops.Custom(lambda x: (x[: len(x) // 2], x[len(x) // 2:] * 2), out_shape=lambda s: [[s[0] // 2]] * 2,
                        out_dtype=lambda d: [rt.float64, d], func_type="pyfunc")
    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    a, b = halves(Tensor(x))
    assert a.dtype == rt.float64 and b.dtype == rt.float32
    np.testing.assert_array_equal(a.asnumpy(), [1.0, 2.0])
    assert not np.shares_memory(a.asnumpy(), x)  # an output never aliases an input
    bad = ops.Custom(lambda x: x, out_shape=[3], out_dtype=rt.float32, func_type="pyfunc")
    with pytest.raises(ValueError, match=r"pyfunc '<lambda>' output 0 has shape \[4\], out_shape declares \[3\]"):
        bad(Tensor(x))
    with pytest.raises(ValueError, match="pyfunc '<lambda>' returned 2 outputs, out_shape declares 1"):
        ops.Custom(lambda x: (x, x), out_shape=[4], out_dtype=rt.float32, func_type="pyfunc")(Tensor(x))


def test_pyfunc_without_out_shape_takes_its_results_as_they_are():
    ident = ops.Custom(lambda x: x, func_type="pyfunc")
    x = np.arange(3, dtype=np.int32)
    out = ident(Tensor(x))
    assert out.dtype == rt.int32 and out.asnumpy().tolist() == [0, 1, 2]
    assert not np.shares_memory(out.asnumpy(), x)
    with pytest.raises(TypeError, match="pyfunc '<lambda>' output 0: unsupported tensor dtype"):
        ops.Custom(lambda x: np.array(["a"]), func_type="pyfunc")(Tensor(x))
    with pytest.raises(TypeError, match="a pyfunc func must be callable"):
        ops.Custom("x.so:f", func_type="pyfunc")


def test_pyfunc_out_dtype_applies_without_out_shape():
    op = ops.Custom(lambda x: x.astype(np.float32), out_dtype=rt.float64, func_type="pyfunc")
    out = op(Tensor(np.ones(3, np.float32)))
    assert out.dtype == rt.float64 and out.asnumpy().tolist() == [1.0, 1.0, 1.0]
    two = ops.Custom(lambda x: (x, x * 2), out_dtype=lambda d: [rt.float16, d], func_type="pyfunc")
    a, b = two(Tensor(np.ones(2, np.float32)))
    assert (a.dtype, b.dtype) == (rt.float16, rt.float32)


def test_a_bprop_returning_none_for_an_input_that_requires_grad_gives_it_a_zero_gradient():
    # one rule for Function, C++ Function and bprop (PyTorch's): None means no gradient flows
    op = ops.Custom(lambda x, y: x * y, lambda a, b: a, lambda a, b: a, func_type="pyfunc",
                    bprop=lambda x, y, out, dout: (dout * y, None))
    x, y = Tensor(np.array([1.0, 2.0])), Tensor(np.array([3.0, 4.0]))
    gx = rt.grad(lambda a: ops.sum(op(a, y)))(x)  # y needs no gradient: its None is fine
    np.testing.assert_array_equal(gx.asnumpy(), [3.0, 4.0])
    gx, gy = rt.grad(lambda a, b: ops.sum(op(a, b)), (0, 1))(x, y)
    np.testing.assert_array_equal(gx.asnumpy(), [3.0, 4.0])
    np.testing.assert_array_equal(gy.asnumpy(), [0.0, 0.0])
    # through another path the input still gets that path's gradient
    gx, gy = rt.grad(lambda a, b: ops.sum(op(a, b) + b * 2), (0, 1))(x, y)
    np.testing.assert_array_equal(gy.asnumpy(), [2.0, 2.0])
    too_many = ops.Custom(lambda x, y: x * y, lambda a, b: a, lambda a, b: a, func_type="pyfunc",
                          bprop=lambda x, y, out, dout: (dout * y, None, None))
    with pytest.raises(ValueError, match=r"Custom\(.*\) bprop returned 3 gradients for 2 inputs"):
        rt.grad(lambda a, b: ops.sum(too_many(a, b)), (0, 1))(x, y)

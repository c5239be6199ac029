"""runtime.autograd.Function: operators written with numpy, with PyTorch's ctx API."""
import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, ops as F
from runtime.autograd import Function, once_differentiable

rng = np.random.default_rng(2)


def T(*shape, requires_grad=False):
    return Tensor(rng.standard_normal(shape), requires_grad=requires_grad)


class Exp(Function):  # the example of runtime/autograd/function.py's docstring, as written there
    @staticmethod
    def forward(ctx, x):
        out = Tensor(np.exp(x.asnumpy()))
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        out, = ctx.saved_tensors
        return g * out


class MulNp(Function):  # all numpy; saves both inputs; records what it saw
    seen = {}

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        MulNp.seen["needs"] = ctx.needs_input_grad
        return x.asnumpy() * y.asnumpy()  # a numpy array is accepted as an output

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        gx = g.asnumpy() * y.asnumpy() if ctx.needs_input_grad[0] else None
        gy = g.asnumpy() * x.asnumpy() if ctx.needs_input_grad[1] else None
        return gx, gy


class TwoOut(Function):  # (2x, 3x); materialize switch as an argument
    last = None

    @staticmethod
    def forward(ctx, x, materialize):
        ctx.set_materialize_grads(materialize)
        return Tensor(x.asnumpy() * 2), Tensor(x.asnumpy() * 3)

    @staticmethod
    def backward(ctx, ga, gb):
        TwoOut.last = (ga is None, gb is None)
        g = 0
        if ga is not None:
            g = g + ga.asnumpy() * 2
        if gb is not None:
            g = g + gb.asnumpy() * 3
        return g, None


class SquareAndSign(Function):
    @staticmethod
    def forward(ctx, x):
        sign = Tensor(np.sign(x.asnumpy()))
        ctx.mark_non_differentiable(sign)
        ctx.save_for_backward(x)
        return Tensor(x.asnumpy() ** 2), sign

    @staticmethod
    def backward(ctx, g, g_sign):
        x, = ctx.saved_tensors
        return g * x * 2


class AddInplace(Function):
    @staticmethod
    def forward(ctx, x, y):
        x.asnumpy()[...] += y.asnumpy()
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, g


class Sneaky(Function):
    @staticmethod
    def forward(ctx, x, how):
        out = Tensor(x.asnumpy() * 2)
        if how == "write":
            x.asnumpy()[...] *= 2
        elif how == "one":
            x.asnumpy().reshape(-1)[0] += 1
        elif how == "rebind":
            x._data = x._data * 2
        return out

    @staticmethod
    def backward(ctx, g):
        return g * 2, None


def test_numpy_function_gradients_match_numerical():
    assert rt.gradcheck(Exp.apply, [T(2, 3)])
    assert rt.gradcheck(MulNp.apply, [T(3, 4), T(3, 4)])


def test_needs_input_grad_follows_inputs_and_grad_mode():
    x, y = T(2, requires_grad=True), T(2)
    z = MulNp.apply(x, y)
    assert MulNp.seen["needs"] == (True, False) and z._node.name == "MulNp"
    with rt.no_grad():
        z = MulNp.apply(x, y)
    assert MulNp.seen["needs"] == (False, False) and z._node is None and not z.requires_grad


@pytest.mark.parametrize("materialize,use,expect", [(True, 0, (False, False)), (True, 1, (False, False)),
                                                    (False, 0, (False, True)), (False, 1, (True, False))])
def test_unused_output_gradient_is_zeros_or_none(materialize, use, expect):
    x = T(3, requires_grad=True)
    outs = TwoOut.apply(x, materialize)
    assert outs[0]._node is outs[1]._node and outs[1]._out_index == 1
    outs[use].sum().backward()
    assert TwoOut.last == expect
    np.testing.assert_allclose(x.grad.asnumpy(), np.full(3, 2.0 if use == 0 else 3.0))


def test_mark_non_differentiable():
    x = T(4, requires_grad=True)
    sq, sign = SquareAndSign.apply(x)
    assert sq.requires_grad and not sign.requires_grad and sign._node is None
    (sq + sign * 5).sum().backward()
    np.testing.assert_allclose(x.grad.asnumpy(), 2 * x.asnumpy())


def test_mark_dirty_in_place_op():
    w = T(3, requires_grad=True) * 1
    y = T(3)
    before = w.asnumpy().copy()
    r = AddInplace.apply(w, y)
    assert r is w and w._version == 1 and w._node.name == "AddInplace"
    np.testing.assert_allclose(w.asnumpy(), before + y.asnumpy())
    assert rt.gradcheck(lambda a, b: AddInplace.apply(a * 1, b) * a, [T(2, 3), T(2, 3)])


def test_mark_dirty_without_grad_bumps_version():
    x = T(2)
    assert AddInplace.apply(x, T(2)) is x and x._version == 1


def test_mark_dirty_of_a_leaf_that_requires_grad_is_an_error():
    with pytest.raises(RuntimeError, match="AddInplace modifies argument 0 in place .*leaf that requires grad"):
        AddInplace.apply(T(2, requires_grad=True), T(2))


def test_mark_dirty_misuse_is_an_error():
    class NotReturned(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.mark_dirty(x)
            return Tensor(x.asnumpy() * 1)

    class NotAnArgument(Function):
        @staticmethod
        def forward(ctx, x):
            out = Tensor(x.asnumpy() * 1)
            ctx.mark_dirty(out)
            return out

    with pytest.raises(RuntimeError, match="NotReturned: argument 0 was given to mark_dirty but not returned"):
        NotReturned.apply(T(2))
    with pytest.raises(RuntimeError, match="NotAnArgument: mark_dirty was given a tensor that is not an argument"):
        NotAnArgument.apply(T(2))


@pytest.mark.parametrize("shape,how", [((3,), "write"), ((3,), "one"), ((3,), "rebind"), ((500, 500), "write")])
def test_unmarked_change_of_an_argument_is_an_error(shape, how):
    x = T(*shape, requires_grad=True) * 1
    node, version = x._node, x._version
    with pytest.raises(RuntimeError, match="Sneaky.forward modified argument 0 in place without mark_dirty"):
        Sneaky.apply(x, how)
    assert x._node is node and x._version == version + 1


def test_saved_tensor_changed_in_place_is_detected():
    x, y = T(3, requires_grad=True), T(3)
    z = MulNp.apply(x, y)
    AddInplace.apply(y, T(3))
    with pytest.raises(RuntimeError, match=r"saved for backward by MulNp \(saved slot 1\) has been modified by "
                                           r"an in-place operation: it is at version 1, but was saved at version 0"):
        z.sum().backward()
    out = Exp.apply(T(3, requires_grad=True))
    AddInplace.apply(out, T(3))
    with pytest.raises(RuntimeError, match=r"Exp \(saved slot 0\) has been modified by an in-place operation"):
        out.sum().backward()


def test_saved_tensors_are_freed_after_backward():
    x = T(2, requires_grad=True)
    z = Exp.apply(x)
    ctx = z._node._ctx
    z.sum().backward()
    with pytest.raises(RuntimeError, match="Exp: saved tensors were freed after the first backward"):
        ctx.saved_tensors


def test_save_for_backward_takes_tensors_only():
    class SavesInt(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x, 3)
            return x * 2

    with pytest.raises(TypeError, match="SavesInt: save_for_backward takes Tensors .*got int at position 1"):
        SavesInt.apply(T(2))


def test_forward_must_return_tensors():
    class ReturnsFloat(Function):
        @staticmethod
        def forward(ctx, x):
            return 1.0

    with pytest.raises(TypeError, match="ReturnsFloat.forward returned float"):
        ReturnsFloat.apply(T(2))


class Bad(Function):
    @staticmethod
    def forward(ctx, x, y, mode):
        ctx.mode = mode
        return Tensor(x.asnumpy() * y.asnumpy())

    @staticmethod
    def backward(ctx, g):
        g = g.asnumpy()
        return {"too_few": (g,), "too_many": (g, g, None, g), "bad_shape": (np.zeros(7), g, None),
                "broadcast": (np.stack([g, g]) / 2, g, None), "bad_dtype": (g.astype(np.float32), g, None),
                "non_tensor": (g, g, g), "not_a_tensor": ("g", g, None)}[ctx.mode]


@pytest.mark.parametrize("mode,exc,msg", [
    ("too_few", RuntimeError, r"backward of Bad returned 1 gradients, but its forward took 3 arguments and "
                              r"argument 1 needs a gradient \(return one gradient, or None, per argument\)"),
    ("too_many", RuntimeError, "backward of Bad returned 4 gradients, but its forward took 3 arguments"),
    ("bad_shape", RuntimeError, r"backward of Bad returned a gradient of shape \[7\] for argument 0, whose "
                                r"shape is \[2\]"),
    ("bad_dtype", TypeError, "backward of Bad returned a gradient of dtype float32 for argument 0, whose dtype "
                             "is float64"),
    ("non_tensor", RuntimeError, "backward of Bad returned a gradient for argument 2, which is not a tensor"),
    ("not_a_tensor", TypeError, "backward of Bad returned str for argument 0; expected a Tensor or None")])
def test_bad_backward_results_are_errors_naming_the_function(mode, exc, msg):
    x, y = T(2, requires_grad=True), T(2, requires_grad=True)
    with pytest.raises(exc, match=msg):
        Bad.apply(x, y, mode).sum().backward()


def test_broadcast_gradient_is_summed_down():
    x, y = T(2, requires_grad=True), T(2, requires_grad=True)
    Bad.apply(x, y, "broadcast").sum().backward()
    np.testing.assert_allclose(x.grad.asnumpy(), np.ones(2))


def test_forward_exception_records_nothing():
    class Fails(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.mark_dirty(x)
            raise ValueError("Fails: no")

    x = T(2, requires_grad=True) * 1
    node = x._node
    with pytest.raises(ValueError, match="Fails: no"):
        Fails.apply(x)
    assert x._node is node and x._version == 0 and rt.is_grad_enabled()


# ---- higher order ----------------------------------------------------------------------
def test_backward_written_with_runtime_ops_is_differentiable():
    x = Tensor(np.array([0.3, -1.2]))
    d2 = rt.grad(rt.grad(lambda t: Exp.apply(t * t).sum()))(x)  # d2/dx2 exp(x^2) = (2 + 4x^2) exp(x^2)
    a = x.asnumpy()
    np.testing.assert_allclose(d2.asnumpy(), (2 + 4 * a * a) * np.exp(a * a))
    assert rt.gradcheck(rt.grad(lambda t: Exp.apply(F.sin(t)).sum()), [T(3)])


def test_numpy_gradients_are_once_differentiable():
    f = lambda t: MulNp.apply(t, t).sum()  # noqa: E731
    np.testing.assert_allclose(rt.grad(f)(Tensor(np.array([1.0, 2.0]))).asnumpy(), [2.0, 4.0])
    with pytest.raises(RuntimeError, match=r"MulNp \(its gradient [01] is a numpy array\) is once-differentiable"):
        rt.grad(rt.grad(f))(Tensor(np.array([1.0, 2.0])))


def test_once_differentiable_decorator():
    class Square(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        @once_differentiable
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return g * x * 2

    f = lambda t: Square.apply(t).sum()  # noqa: E731
    assert rt.grad(f)(Tensor(3.0, rt.float64)).item() == 6.0
    with pytest.raises(RuntimeError, match="Square is once-differentiable"):
        rt.grad(rt.grad(f))(Tensor(3.0, rt.float64))


class ScaleBy(Function):
    """x * k * w, with defaults: called with keywords as torch users call theirs."""

    @staticmethod
    def forward(ctx, x, k=2.0, w=None):
        ctx.save_for_backward(w)
        ctx.k = k
        return x * k if w is None else x * k * w

    @staticmethod
    def backward(ctx, g):
        (w,) = ctx.saved_tensors
        gx = g * ctx.k if w is None else g * ctx.k * w
        return gx, None, None


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_apply_binds_keywords_to_forward_parameters(jit):
    """torch's Function.apply takes keywords (bound to forward's parameters, defaults filled in)."""
    from inplace_util import central
    x0, w0 = np.array([0.5, -1.0, 2.0]), np.array([3.0, 0.5, -2.0])

    def loss(x):
        return (ScaleBy.apply(x, w=Tensor(w0), k=1.5) * Tensor(x0)).sum()
    run = rt.jit(loss) if jit else loss
    x = Tensor(x0.copy(), requires_grad=True)
    for _ in range(2):  # jit: the trace's call, then a replay
        x.grad = None
        run(x).backward()
        want = central(lambda a: float(np.sum(a * 1.5 * w0 * x0)), x0.copy())
        np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-7)
    assert ScaleBy.apply(Tensor(np.ones(2)), k=3.0).numpy().tolist() == [3.0, 3.0]
    assert ScaleBy.apply(Tensor(np.ones(2))).numpy().tolist() == [2.0, 2.0]


def test_apply_refuses_keywords_forward_cannot_take():
    x = Tensor(np.ones(2), requires_grad=True)
    with pytest.raises(TypeError) as e:
        ScaleBy.apply(x, j=1)
    assert str(e.value) == "ScaleBy.apply: got an unexpected keyword argument 'j'"
    with pytest.raises(TypeError) as e:
        ScaleBy.apply(x, x=x)
    assert str(e.value) == "ScaleBy.apply: multiple values for argument 'x'"

    class KeywordOnly(Function):
        @staticmethod
        def forward(ctx, x, *, k=2.0):
            return x * k

        @staticmethod
        def backward(ctx, g):
            return (g,)
    with pytest.raises(TypeError) as e:
        KeywordOnly.apply(x, k=1.0)
    assert str(e.value) == ("KeywordOnly.apply: forward's keyword-only parameters ['k'] cannot be passed to a "
                            "Function; make them positional")

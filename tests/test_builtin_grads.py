"""Built-in ops: gradients match central differences (float64), broadcasting included."""
import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, ops as F

rng = np.random.default_rng(0)


def T(*shape, positive=False):
    a = rng.standard_normal(shape)
    return Tensor(np.abs(a) + 0.5 if positive else a)


UNARY = {
    "neg": F.neg, "exp": F.exp, "sin": F.sin, "cos": F.cos, "tanh": F.tanh, "sigmoid": F.sigmoid,
    "relu": F.relu, "sum": F.sum, "mean": F.mean,
    "sum_axis": lambda x: F.sum(x, axis=1), "mean_keep": lambda x: F.mean(x, axis=(0,), keepdims=True),
    "reshape": lambda x: F.reshape(x, (4, 3)), "transpose": F.transpose,
    "transpose_axes": lambda x: F.transpose(x, (1, 0)), "broadcast_to": lambda x: F.broadcast_to(x, (2, 3, 4)),
    "getitem": lambda x: x[1:, ::2], "abs": F.abs,
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_ops(name):
    assert rt.gradcheck(UNARY[name], [T(3, 4)])


@pytest.mark.parametrize("name,fn", [("log", F.log), ("sqrt", F.sqrt)])
def test_positive_domain_ops(name, fn):
    assert rt.gradcheck(fn, [T(3, 4, positive=True)])


BINARY = {"add": F.add, "sub": F.sub, "mul": F.mul, "div": F.div}
BROADCAST = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 4), (3, 1)), ((), (3,)), ((5, 1), ())]


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("sx,sy", BROADCAST)
def test_binary_ops_with_broadcasting(name, sx, sy):
    x, y = T(*sx), T(*sy, positive=True)
    assert rt.gradcheck(BINARY[name], [x, y])


@pytest.mark.parametrize("sx,sy", BROADCAST)
def test_pow_with_broadcasting(sx, sy):
    assert rt.gradcheck(F.pow, [T(*sx, positive=True), T(*sy)])


@pytest.mark.parametrize("sx,sy", [((3, 4), (4, 2)), ((4,), (4, 2)), ((3, 4), (4,)), ((4,), (4,)),
                                   ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 1)), ((3, 4), (2, 4, 5))])
def test_matmul_shapes(sx, sy):
    assert rt.gradcheck(F.matmul, [T(*sx), T(*sy)])


def test_where_is_differentiable_in_both_branches():
    c = Tensor(rng.standard_normal((3, 4)) > 0)
    assert rt.gradcheck(lambda x, y: F.where(c, x, y), [T(3, 4), T(4)])


def test_reuse_accumulates_gradients():
    x = Tensor(np.array([1.5, -2.0]), requires_grad=True)
    y = x * x + x * 3 + F.exp(x)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.asnumpy(), 2 * x.asnumpy() + 3 + np.exp(x.asnumpy()))


def test_random_compositions():
    ops1 = [F.tanh, F.sigmoid, F.sin, lambda t: t * t, lambda t: F.exp(t * 0.1)]
    ops2 = [F.add, F.mul, F.sub, lambda a, b: a / (1.5 + b * b)]
    local = np.random.default_rng(42)
    for trial in range(20):
        shapes = [(2, 3), (3,), (2, 1), ()]
        picks = [shapes[i] for i in local.integers(0, len(shapes), 3)]
        xs = [Tensor(local.standard_normal(s)) for s in picks]
        seq = [(local.integers(len(ops1)), local.integers(len(ops2)), local.integers(3)) for _ in range(4)]

        def f(a, b, c, seq=seq):
            vals = [a, b, c]
            h = a
            for u, v, k in seq:
                h = ops2[v](ops1[u](h), vals[k])
            return h.sum(axis=0) if h.ndim else h

        assert rt.gradcheck(f, xs), f"trial {trial}"


def test_gradients_keep_input_dtype():
    x = Tensor(np.ones(3, np.float32), requires_grad=True)
    y = x * Tensor(np.ones(3, np.float64))  # promotes to float64
    y.sum().backward()
    assert x.grad.dtype == rt.float32


def test_no_grad_records_nothing():
    x = Tensor(1.0, requires_grad=True)
    with rt.no_grad():
        y = x * 2
        assert not rt.is_grad_enabled()
    assert rt.is_grad_enabled()
    assert not y.requires_grad and y._node is None


def test_in_place_change_of_saved_tensor_is_detected():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    w = rt.Parameter(np.array([3.0, 4.0]))
    y = (x * w).sum()
    w.set_data([5.0, 6.0])
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        y.backward()


def test_saved_tensors_of_builtin_ops_are_released_after_backward():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = (F.exp(x) * x).sum()
    node = y._node
    y.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), np.exp([1.0, 2.0]) * (1 + np.array([1.0, 2.0])))
    assert node.args is None  # what sum saved is gone
    with pytest.raises(RuntimeError, match="backward through sum a second time"):
        y.backward()
    z = (F.exp(x) * x).sum()
    z.backward(retain_graph=True)
    z.backward()  # kept the first time: a second pass works and accumulates
    np.testing.assert_allclose(x.grad.asnumpy(), 3 * np.exp([1.0, 2.0]) * (1 + np.array([1.0, 2.0])))


@pytest.mark.parametrize("fdt", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("idt", [np.bool_, np.int8, np.int32, np.int64, np.uint8])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "matmul", "maximum"])
def test_a_float_tensor_next_to_an_integer_tensor_keeps_its_dtype(fdt, idt, op):
    """float32 * int32 gave float64 (numpy's rule); MindSpore and PyTorch keep the float's dtype, and a
    bprop written as dout * n with an integer n then failed with 'gradient of dtype float64'."""
    fn = {"matmul": F.matmul, "maximum": F.maximum}.get(op) or getattr(F, op)
    f = Tensor(np.array([0.5, -1.5, 2.0], fdt))
    i = Tensor(np.array([1, 0, 1], idt) if idt is np.bool_ else np.array([3, 1, 2], idt))
    for a, b in ((f, i), (i, f)):
        with np.errstate(divide="ignore"):  # 1 / 0 where the bool divisor is False
            out = fn(a, b)
        assert out.dtype == f.dtype, (op, a.dtype, b.dtype, out.dtype)
        with np.errstate(divide="ignore"):
            want = getattr(np, {"add": "add", "sub": "subtract", "mul": "multiply", "div": "true_divide",
                                "matmul": "matmul", "maximum": "maximum"}[op])(
                a.asnumpy().astype(np.float64), b.asnumpy().astype(np.float64))
        np.testing.assert_allclose(out.asnumpy().astype(np.float64), want, rtol=1e-3 if fdt is np.float16 else 1e-6)


def test_the_float_operand_of_a_mixed_op_gets_its_gradient():
    n = Tensor(np.array([3, 1, 2], np.int32))
    x = Tensor(np.array([0.5, -1.5, 2.0]))
    assert rt.gradcheck(lambda t: F.mul(t, n) + F.div(n, t), [x])
    g = rt.grad(lambda t: F.sum(F.mul(t.astype(rt.float32), n)))(x)
    assert g.dtype == rt.float64
    np.testing.assert_array_equal(g.asnumpy(), [3.0, 1.0, 2.0])


def _central_differences(fn, xs, eps=1e-6):
    """d sum(fn(*xs)) / d xs by central differences in float64: numbers the op's rule never produced."""
    grads = []
    for k, x in enumerate(xs):
        base = x.asnumpy().astype(np.float64)
        g = np.zeros(base.shape)
        for idx in np.ndindex(base.shape):
            vals = []
            for step in (eps, -eps):
                moved = base.copy()
                moved[idx] += step
                args = [Tensor(moved) if j == k else Tensor(xs[j].asnumpy().copy()) for j in range(len(xs))]
                with rt.no_grad():
                    vals.append(float(fn(*args).asnumpy().sum()))
            g[idx] = (vals[0] - vals[1]) / (2 * eps)
        grads.append(g)
    return grads


def _written_after_forward_keeps_grad(fn, *shapes):
    """Each argument that the op's node declares unread (defvjp's reads_inputs) is overwritten in
    place after the forward: the gradients must still match central differences taken (float64) at
    the values the forward saw (a declaration that lies would let the rule read the new values
    silently). Each argument it declares read, overwritten instead, must stop the backward with the
    version error. An op made of several nodes is checked at its last one only when that node takes
    the arguments themselves."""
    xs = [T(*s, positive=True) for s in shapes]
    want = _central_differences(fn, xs)
    for x in xs:
        x.requires_grad_()
    y = fn(*xs)
    node = y._node
    taken = [i for i, (x, e) in enumerate(zip(xs, node.next_edges)) if e is x]
    unread = [i for i in taken if not node.prim.reads_args[i]]
    loss = y.sum()
    with rt.no_grad():
        for i in unread:
            xs[i][...] = 7.25
    loss.backward()
    for x, w in zip(xs, want):
        np.testing.assert_allclose(x.grad.asnumpy(), w, rtol=1e-6, atol=1e-8)
    for i in taken:
        if i in unread:
            continue
        xs = [T(*s, positive=True).requires_grad_() for s in shapes]
        loss = fn(*xs).sum()
        with rt.no_grad():
            xs[i][...] = 7.25
        with pytest.raises(RuntimeError, match=rf"^one of the tensors needed for gradient computation has been "
                                               rf"modified by an in-place operation: argument {i} of "
                                               rf"{node.prim.name} is at version 1; expected version 0$"):
            loss.backward()
    return unread


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_ops_declared_unread_inputs_are_unread(name):
    _written_after_forward_keeps_grad(UNARY[name], (3, 4))


@pytest.mark.parametrize("name", sorted(BINARY) + ["pow", "matmul", "maximum"])
def test_binary_ops_declared_unread_inputs_are_unread(name):
    fn = {**BINARY, "pow": F.pow, "matmul": F.matmul, "maximum": F.maximum}[name]
    _written_after_forward_keeps_grad(fn, (3, 4), (4, 4) if name == "matmul" else (4,))


def test_add_declares_both_inputs_unread():
    assert _written_after_forward_keeps_grad(F.add, (3,), (3,)) == [0, 1]


# ---- every other built-in Primitive (ops/reduce_extra, softmax_extra, array_ops, dense, nn.loss, mint) ----
def _second(f):
    """x -> d(sum(sin(f(x))))/dx, differentiated again: checks the rules of the ops that f's rules use."""
    return lambda x: rt.grad(lambda a: F.sum(F.sin(f(a))))(x)


def _cross_entropy(x):
    return rt.nn.CrossEntropyLoss()(x, Tensor(np.array([0, 2, 1], np.int64)))



def _c(x):
    """x as complex128 (differentiable: a real input of a complex op gets the real part)."""
    return rt.ops.cast(x, rt.complex128)


MORE = {  # op name(s) covered -> (function, input shapes)
    # complex ops through a real input: c = x as complex128, real and imaginary parts taken back to a real
    # loss, so central differences in float64 check them (the runtime's complex gradients are PyTorch's)
    ("real", "imag", "conj"): (lambda x: rt.ops.real(rt.ops.conj(_c(x)) * _c(x) * (1 + 2j))
                               + rt.ops.imag(_c(x) * _c(x) * (2 - 1j)), [(3, 4)]),
    ("amax",): (F.max, [(3, 4)]), ("amin",): (F.min, [(3, 4)]),
    ("max_dim",): (lambda x: F.max(x, 1)[0], [(3, 4)]), ("min_dim",): (lambda x: F.min(x, 0)[0], [(3, 4)]),
    ("maximum",): (F.maximum, [(3, 4), (4,)]), ("minimum",): (F.minimum, [(3, 4), (3, 1)]),
    ("softmax",): (lambda x: F.softmax(x, 1), [(3, 4)]), ("log_softmax",): (F.log_softmax, [(3, 4)]),
    ("logsumexp",): (lambda x: F.logsumexp(x, 1), [(3, 4)]), ("clip",): (lambda x: F.clip(x, -0.5, 0.5), [(3, 4)]),
    ("clamp",): (lambda x, lo, hi: F.clip(x, lo - 1.0, hi + 1.0), [(3, 4), (4,), (3, 1)]),
    ("clamp_min",): (lambda x, lo: F.clip(x, lo, None), [(3, 4), (4,)]),
    ("clamp_max",): (lambda x, hi: F.clip(x, None, hi), [(3, 4), (3, 1)]),
    ("gelu",): (F.gelu, [(3, 4)]), ("dense",): (F.dense, [(3, 4), (2, 4)]),
    # gelu's (exact) second derivative: its rule was numpy, so a gradient of its gradient was 0
    ("normal_cdf",): (_second(F.gelu), [(3, 4)]),
    ("dense'",): (F.dense, [(3, 4), (2, 4), (2,)]),
    ("concat", "slice_axis"): (lambda x, y: F.concat([x, y], 1), [(3, 4), (3, 2)]),
    ("stack",): (lambda x, y: F.stack([x, y], 0), [(3, 4), (3, 4)]),
    ("pad_axis",): (_second(lambda x: F.split(x, 2, 1)[1] ** 2), [(3, 4)]),
    ("gather",): (lambda x: F.gather(x, Tensor(np.array([2, 0, 2])), 1), [(3, 4)]),
    ("gather_grad",): (_second(lambda x: F.gather(x, Tensor(np.array([2, 0, 2])), 1) ** 2), [(3, 4)]),
    ("scatter_add",): (_second(lambda x: x[1:, ::2] ** 2), [(3, 4)]),
    ("relu_grad",): (_second(lambda x: F.relu(x) * x), [(3, 4)]),
    ("cross_entropy",): (_cross_entropy, [(3, 4)]), ("cast",): (lambda x: F.cast(x, rt.float64), [(3, 4)]),
    ("sum_to",): (lambda x: F.sum_to(x, (1, 4)), [(3, 4)]),
    ("div_floor", "div_trunc"): (lambda x, y: rt.mint.div(x, y, rounding_mode="floor")
                                 + rt.mint.div(x, y, rounding_mode="trunc"), [(3, 4), (4,)]),
}


@pytest.mark.parametrize("names", sorted(MORE), ids="+".join)
def test_the_other_builtin_ops(names):
    fn, shapes = MORE[names]
    assert rt.gradcheck(fn, [T(*s) for s in shapes])


def _all_differentiable_primitives():
    import gc
    import runtime.mint  # noqa: F401  (defines its primitives)
    import runtime.nn.loss  # noqa: F401
    from runtime.ops.array_ops import _concat_prim, _stack_prim
    _concat_prim(2), _stack_prim(2)  # made per argument count, on first use
    return {o.name for o in gc.get_objects() if type(o) is rt.ops.Primitive and o.vjps is not None}


def test_every_differentiable_builtin_is_checked_here():
    checked = {n.rstrip("'") for names in MORE for n in names} | set(UNARY) | set(BINARY) | {
        "log", "sqrt", "pow", "matmul", "where"}
    gpu_only = {"to_device"}  # CPU -> CPU returns the tensor itself; tests/test_gpu_runtime.py has it
    assert _all_differentiable_primitives() - checked - gpu_only == set()

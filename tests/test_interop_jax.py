"""opbuilder.to_jax: operator modules as JAX functions (custom_vjp over host callbacks)."""
from __future__ import annotations

import types

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'opbuilder[jax]')")
jnp = pytest.importorskip("jax.numpy")

import opbuilder  # noqa: E402
from opbuilder import Spec  # noqa: E402
from jax_util import x64  # noqa: E402,F401  (module-wide 64-bit arrays)

pytestmark = pytest.mark.build


def _counting(module, names):
    calls = []

    def wrap(fn):
        def f(*a):
            calls.append(a)
            return fn(*a)
        return f
    return types.SimpleNamespace(**{n: wrap(getattr(module, n)) for n in names}), calls


def _central(f, args, argnum, eps=1e-6):
    """d sum(f(args)) / d args[argnum] by central differences, in float64."""
    base = [np.array(a, dtype=np.float64) for a in args]
    g = np.zeros_like(base[argnum])
    for i in np.ndindex(g.shape):
        hi = [b.copy() for b in base]
        lo = [b.copy() for b in base]
        hi[argnum][i] += eps
        lo[argnum][i] -= eps
        g[i] = (float(np.sum(f(*hi))) - float(np.sum(f(*lo)))) / (2 * eps)
    return g


def _data(shape_x=(3, 4), shape_y=(4,), seed=0):
    r = np.random.default_rng(seed)
    return jnp.asarray(r.standard_normal(shape_x)), jnp.asarray(r.standard_normal(shape_y))


def test_eager_and_jit(my_ops):
    j = opbuilder.to_jax(my_ops)
    x, y = _data()
    expect = np.asarray(x) * np.asarray(y)
    np.testing.assert_allclose(np.asarray(j.mul(x, y)), expect)
    np.testing.assert_allclose(np.asarray(jax.jit(j.mul)(x, y)), expect)
    assert j.mul(x, y).dtype == jnp.float64


def test_grad_matches_central_differences(my_ops):
    j = opbuilder.to_jax(my_ops)
    x, y = _data()

    def loss(a, b):
        return (j.mul(a, b) ** 2).sum()

    gx, gy = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, y)

    def plain(a, b):
        return (a * b) ** 2
    np.testing.assert_allclose(np.asarray(gx), _central(plain, (x, y), 0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(gy), _central(plain, (x, y), 1), rtol=1e-6, atol=1e-6)
    # the numbers came from the C++ Backward: check one against the op itself, too
    np.testing.assert_allclose(np.asarray(jax.grad(lambda a: j.mul(a, y).sum())(x)),
                               _central(lambda a, b: np.asarray(j.mul(a, b)), (x, y), 0), rtol=1e-6, atol=1e-6)


def test_vmap_forward_and_grad(my_ops):
    j = opbuilder.to_jax(my_ops)
    x, _ = _data()
    w = jnp.arange(4.0) + 1
    np.testing.assert_allclose(np.asarray(jax.vmap(lambda r: j.mul(r, w))(x)), np.asarray(x) * np.asarray(w))
    g = jax.vmap(jax.grad(lambda r: j.mul(r, r).sum()))(x)
    np.testing.assert_allclose(np.asarray(g), 2 * np.asarray(x))
    np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(j.mul))(x, x)), np.asarray(x) ** 2)


def test_shape_fn_skips_the_probe_run(my_ops):
    """On the callback route. (The XLA FFI route runs the function once at trace time to find its C++
    Function: tests/test_jax_ffi_default.py.)"""
    ns, calls = _counting(my_ops, ["mul"])
    j = opbuilder.to_jax(ns, shape_fn={"mul": lambda a, b: Spec(np.broadcast_shapes(a.shape, b.shape), a.dtype)},
                         ffi=False)
    x, y = _data()
    lowered = jax.jit(j.mul).lower(x, y)  # tracing needs shapes only
    assert calls == []
    lowered.compile()(x, y).block_until_ready()
    assert len(calls) == 1


def test_probe_run_once_per_signature(my_ops):
    """On the callback route (the XLA FFI route's count: tests/test_jax_ffi_default.py)."""
    ns, calls = _counting(my_ops, ["mul"])
    j = opbuilder.to_jax(ns, ffi=False)
    x, y = _data()
    j.mul(x, y).block_until_ready()
    assert len(calls) == 2  # one run on zeros for the output's shape, then the real one
    assert np.count_nonzero(np.asarray(calls[0][0].asnumpy())) == 0
    j.mul(y, x).block_until_ready()
    j.mul(x, y).block_until_ready()
    assert len(calls) == 5  # (y, x): a new signature, probed then run; (x, y) again: run only


def test_static_args_and_multiple_outputs(autograd_ops):
    j = opbuilder.to_jax(autograd_ops)
    x, y = _data((3,), (3,))
    out = jax.jit(lambda a, b: j.mixed_args(0.5, a, [4, 3], b))(x, y)
    np.testing.assert_allclose(np.asarray(out), 2.0 * np.asarray(x) + 3 * np.asarray(y))
    gx, gy = jax.grad(lambda a, b: j.mixed_args(0.5, a, [4, 3], b).sum(), argnums=(0, 1))(x, y)
    np.testing.assert_allclose(np.asarray(gx), np.full(3, 2.0))
    np.testing.assert_allclose(np.asarray(gy), np.full(3, 3.0))
    sq, sign = j.square_and_sign(x)
    np.testing.assert_allclose(np.asarray(sq), np.asarray(x) ** 2)
    np.testing.assert_allclose(np.asarray(sign), np.sign(np.asarray(x)))
    g = jax.grad(lambda a: j.square_and_sign(a)[0].sum())(x)
    np.testing.assert_allclose(np.asarray(g), _central(lambda a: np.asarray(a) ** 2, (x,), 0), rtol=1e-6)


def test_unsupported_dtype(my_ops):
    j = opbuilder.to_jax(my_ops)
    a = jnp.ones(2, jnp.float8_e5m2)  # bfloat16 is taken now (test_interop_dtypes.py)
    with pytest.raises(TypeError, match=r"^mul: argument 0 has dtype float8_e5m2, which opbuilder's runtime does not "
                                        r"support \("):
        j.mul(a, a)


@pytest.mark.parametrize("ffi", [True, False])
def test_none_for_an_optional_tensor(autograd_ops, ffi):
    """None for a std::optional<TensorPtr> argument is a static argument, as on the runtime: values and
    gradients (jit, grad) are the ones without it. On 9658ffc it was a TypeError on both routes."""
    j = opbuilder.to_jax(autograd_ops, ffi=ffi)
    xa, ya = np.random.default_rng(5).standard_normal((2, 3))
    x, y = jnp.asarray(xa), jnp.asarray(ya)
    np.testing.assert_allclose(np.asarray(j.mul_opt_bias(x, y, None)), xa * ya, rtol=1e-12)
    loss = jax.jit(jax.grad(lambda a, b: (j.mul_opt_bias(a, b, None) * jnp.arange(3.0)).sum(), argnums=(0, 1)))
    for _ in range(2):
        gx, gy = loss(x, y)
        np.testing.assert_allclose(np.asarray(gx), ya * np.arange(3.0), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(gy), xa * np.arange(3.0), rtol=1e-12)
        f = lambda a: (j.mul_opt_bias(a, y, None) * jnp.arange(3.0)).sum()  # noqa: E731
        np.testing.assert_allclose(np.asarray(gx), _central(f, [x], 0), rtol=1e-6, atol=1e-8)


def test_unsupported_argument(my_ops):
    j = opbuilder.to_jax(my_ops)
    with pytest.raises(TypeError, match=r"^mul: argument 1 is a dict; a JAX operator takes arrays, None \(an "
                                        r"optional tensor left out\), ints, floats, bools, strings and lists of "
                                        r"them$"):
        j.mul(jnp.ones(2), {})
    with pytest.raises(TypeError, match=r"^mul: a JAX operator needs at least one array argument$"):
        j.mul(1.0, 2.0)
    # a list of arrays was read as "no array argument"
    for box in (list, tuple):
        with pytest.raises(TypeError) as e:
            j.mul(box([jnp.ones(2), jnp.ones(2)]), 2.0)
        assert str(e.value) == (f"mul: argument 0 is a {box.__name__} of arrays; to_jax passes arrays one by one (a "
                                f"list of tensors, TensorPtrList, is not supported): bind a function that takes each "
                                f"tensor as its own argument")


def test_op_errors_reach_the_caller(my_ops):
    j = opbuilder.to_jax(my_ops)
    a = jnp.ones(2, jnp.int8)
    with pytest.raises(ValueError, match=r"^mul: expected two float32 or two float64 tensors, got int8 and int8"):
        j.mul(a, a)


def test_bad_shape_fn(my_ops):
    with pytest.raises(ValueError, match=r"^to_jax: shape_fn names 'add', which the module does not define "
                                         r"\(it has mul\)$"):
        opbuilder.to_jax(my_ops, shape_fn={"add": lambda a, b: a})
    j = opbuilder.to_jax(my_ops, shape_fn={"mul": lambda a, b: "nonsense"})
    with pytest.raises(TypeError, match=r"^mul: the shape rule must return Spec\(shape, dtype\) or a list of them"):
        j.mul(jnp.ones(2), jnp.ones(2))


def test_integer_output_gets_no_gradient():
    import runtime as rt

    def with_index(x):  # a differentiable output and an integer one, from runtime ops
        return [x * 3.0, rt.Tensor(np.arange(x.shape[0], dtype=np.int64))]
    j = opbuilder.to_jax(types.SimpleNamespace(with_index=with_index))
    x = jnp.arange(4.0)
    val, idx = j.with_index(x)
    np.testing.assert_array_equal(np.asarray(idx), np.arange(4))
    g = jax.jit(jax.grad(lambda a: j.with_index(a)[0].sum()))(x)
    np.testing.assert_allclose(np.asarray(g), np.full(4, 3.0))


def test_static_arguments_are_keyed_by_type_and_exact_value():
    """0.0 then -0.0, True then 1 then 1.0 (alone or in a list) are different signatures: each call's
    operator sees its own value, eagerly and under jit (issue 33: == merged them)."""
    import math

    def tag(x, s):  # the static value as the operator sees it: 1 bool, 2 int, 3 float; negative for -0.0
        v = s[0] if isinstance(s, list) else s
        kind = {bool: 1.0, int: 2.0, float: 3.0}[type(v)]
        return x * 0 + (kind * math.copysign(1.0, v) if type(v) is float else kind)
    j = opbuilder.to_jax(types.SimpleNamespace(tag=tag))
    x = jnp.zeros(2)
    cases = [(0.0, 3.0), (-0.0, -3.0), (True, 1.0), (1, 2.0), (1.0, 3.0), ([0.0], 3.0), ([-0.0], -3.0),
             ([True], 1.0), ([1], 2.0)]
    for s, want in cases + cases[::-1]:
        np.testing.assert_array_equal(np.asarray(j.tag(x, s)), np.full(2, want), err_msg=repr(s))
        np.testing.assert_array_equal(np.asarray(jax.jit(lambda a, s=s: j.tag(a, s))(x)), np.full(2, want),
                                      err_msg=repr(s))


def test_output_shapes_are_cached_by_type_and_exact_value():
    """The probe run's output shapes (no shape rule) are kept per exact static value too: True then 1
    get their own shapes."""
    import runtime as rt

    def widen(x, s):  # 3 elements for a bool, 2 for an int, 4 for -0.0, else 1
        n = 3 if type(s) is bool else 2 if type(s) is int else 4 if str(s) == "-0.0" else 1
        return rt.Tensor(np.zeros(n)) + x.sum()
    j = opbuilder.to_jax(types.SimpleNamespace(widen=widen))
    x = jnp.ones(2)
    for s, n in ((True, 3), (1, 2), (0.0, 1), (-0.0, 4), (1, 2), (True, 3)):
        np.testing.assert_array_equal(np.asarray(j.widen(x, s)), np.full(n, 2.0), err_msg=repr(s))


def test_float64_output_with_x64_off_is_float32_with_its_gradient():
    """x64 off (JAX's default): an operator returning float64 (or int64) from float32 inputs gives
    JAX's 32-bit twin, as jnp does; its gradient still flows (cotangents go back as float64)."""
    import runtime as rt

    def widened(x):  # float64 of x squared, and the positions as int64
        return [rt.ops.math.cast(x, np.float64) ** 2, rt.Tensor(np.arange(x.shape[0], dtype=np.int64))]
    j = opbuilder.to_jax(types.SimpleNamespace(widened=widened))
    jax.config.update("jax_enable_x64", False)
    try:
        x = jnp.asarray([1.0, -2.0, 0.5], jnp.float32)
        for fn in (j.widened, jax.jit(j.widened)):
            sq, pos = fn(x)
            assert (sq.dtype, pos.dtype) == (jnp.float32, jnp.int32)
            np.testing.assert_allclose(np.asarray(sq), np.asarray(x) ** 2)
            np.testing.assert_array_equal(np.asarray(pos), np.arange(3))
        g = jax.jit(jax.grad(lambda a: j.widened(a)[0].sum()))(x)
        assert g.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(g), 2 * np.asarray(x), rtol=1e-6)
    finally:
        jax.config.update("jax_enable_x64", True)


def test_numpy_scalars_are_static_arguments_as_their_python_values():
    """A numpy bool, integer or float scalar (alone or in a list) is the Python value it holds: keyed
    and passed as that value, eagerly and under jit (issue 33: np.int64 was refused, np.float64 taken)."""
    import math

    def tag(x, s):  # the static value as the operator sees it: 1 bool, 2 int, 3 float; negative for -0.0
        v = s[0] if isinstance(s, list) else s
        kind = {bool: 1.0, int: 2.0, float: 3.0}[type(v)]
        return x * 0 + (kind * math.copysign(1.0, v) if type(v) is float else kind) * (abs(v) or 1)
    j = opbuilder.to_jax(types.SimpleNamespace(tag=tag))
    x = jnp.zeros(2)
    cases = [(np.int64(2), 4.0), (np.int32(3), 6.0), (np.uint8(5), 10.0), (np.bool_(True), 1.0),
             (np.float64(-0.0), -3.0), (np.float64(0.0), 3.0), (np.float32(0.5), 1.5), (2, 4.0),
             ([np.int64(2)], 4.0), ([np.float64(-0.0)], -3.0), ([np.bool_(True)], 1.0)]
    for s, want in cases + cases[::-1]:
        np.testing.assert_array_equal(np.asarray(j.tag(x, s)), np.full(2, want), err_msg=repr(s))
        np.testing.assert_array_equal(np.asarray(jax.jit(lambda a, s=s: j.tag(a, s))(x)), np.full(2, want),
                                      err_msg=repr(s))
    with pytest.raises(TypeError, match=r"^tag: argument 1 is a complex128; a JAX operator takes arrays, None "
                                        r"\(an optional tensor left out\), ints, floats, bools, strings and lists "
                                        r"of them$"):
        j.tag(x, np.complex128(1))

"""A module function that returns a Tensor it built over its argument's memory (a C++ slice on
x->storage(), no Function around it) returns a view of that argument on every route, as torch's x[:2] in
a Python function does: runtime eager, runtime.jit, the JAX callback and XLA FFI (its backward running
the function again, and its tape) give the argument the gradient of the elements the result views.
to_torch's routes are checked in tests/test_route_parity.py. Before, the runtime and both JAX routes gave
the argument a zero gradient, with no error (an attack on e61014b)."""
from __future__ import annotations

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor

from numeric_util import central
from op_util import CPP, load_op

import opbuilder

pytestmark = pytest.mark.build

X = np.random.default_rng(7).standard_normal(6)
# each function, and what it is in numpy: (x, y) -> the elements it returns
REFS = {
    "head_alias": (1, lambda x: x[:2]),  # a Tensor over x's first two elements
    "reversed_alias": (1, lambda x: x[::-1]),  # negative strides
    "second_mid": (2, lambda x, y: y[1:3]),  # over the second argument
    "scale_then_head": (1, lambda x: (3 * x)[:2]),  # over x after a Function wrote it (MarkDirty)
    # overlapping pairs (strides (1, 1)): an element read at two places gets both gradients
    "windows": (1, lambda x: np.lib.stride_tricks.sliding_window_view(x, 2)),
}


@pytest.fixture(scope="session")
def parity_ops(cache_dir):
    return load_op("parity_ops", [CPP / "parity_ops.cpp"])


def _args(name, x):
    return (x, 2 * x) if REFS[name][0] == 2 else (x,)


def _weights(name, x):
    shape = np.shape(REFS[name][1](*_args(name, x)))
    return np.linspace(0.5, 2.0, int(np.prod(shape))).reshape(shape)


def _runtime_loss_grads(fn, name, x):
    """The gradient of sum(w * fn(args)) for each argument (each the product of a leaf, so the call may
    write it), on the runtime."""
    leaves = [Tensor(a.copy(), requires_grad=True) for a in _args(name, x)]
    out = fn(*[leaf * 1.0 for leaf in leaves])
    (out * Tensor(_weights(name, x))).sum().backward()
    # (no gradient: an argument the result does not depend on, second_mid's x)
    return [np.zeros_like(X) if leaf.grad is None else leaf.grad.asnumpy() for leaf in leaves]


def _numerical(parity_ops, name, x):
    """Central differences of the same loss, the op run on plain values (no gradient recorded)."""
    fn = getattr(parity_ops, name)
    w = _weights(name, x)
    out = []
    for k in range(REFS[name][0]):
        def loss(a, k=k):
            args = [Tensor(b.copy()) for b in _args(name, x)]
            args[k] = Tensor(a.copy())
            with rt.no_grad():
                return float((fn(*args).asnumpy() * w).sum())
        out.append(central(loss, _args(name, x)[k]))
    return out


@pytest.mark.parametrize("name", sorted(REFS))
def test_runtime_eager_gradient_reaches_the_argument(parity_ops, name):
    got = _runtime_loss_grads(getattr(parity_ops, name), name, X)
    want = _numerical(parity_ops, name, X)
    assert np.abs(want[-1]).max() > 0.1  # (the loss does depend on the argument the result views)
    for g, n in zip(got, want):
        np.testing.assert_allclose(g, n, rtol=1e-6, atol=1e-8)


@pytest.mark.filterwarnings("ignore:jit.scale_then_head.. scale_then_head wrote an input")
@pytest.mark.parametrize("name", sorted(REFS))
def test_runtime_jit_first_call_and_replay(parity_ops, name):
    jitted = rt.jit(getattr(parity_ops, name))
    want = _numerical(parity_ops, name, X)
    for _ in range(2):  # trace, then replay
        for g, n in zip(_runtime_loss_grads(jitted, name, X), want):
            np.testing.assert_allclose(g, n, rtol=1e-6, atol=1e-8)


def test_the_result_is_a_view_as_the_runtimes_own_slice(parity_ops):
    """Its base, its counter, and torch's rules for writes through it: refused into a view of a leaf that
    requires grad; into a view of a non-leaf, the base's history becomes the write; a write through it
    fails the check of a product that saved the base. Each as the runtime's own x[:2]."""
    own = lambda x: x[:2]  # noqa: E731
    for head in (parity_ops.head_alias, own):
        x = Tensor(X.copy(), requires_grad=True)
        y = head(x)
        assert y._base is x and y._version == x._version
        with pytest.raises(RuntimeError, match=r"^ParityScale modifies argument 0 in place \(MarkDirty\), but it is "
                                               r"a view of a leaf that requires grad; in-place changes of such "
                                               r"views are not allowed"):
            parity_ops.scale_(y)
        a = Tensor(X.copy(), requires_grad=True)
        b = a * 2.0
        parity_ops.scale_(head(b))
        assert b._version == 1
        b.sum().backward()
        np.testing.assert_allclose(a.grad.asnumpy(), [6.0, 6.0, 2.0, 2.0, 2.0, 2.0])
        a = Tensor(X.copy(), requires_grad=True)
        b = a * 2.0
        product = b * b
        parity_ops.scale_(head(b))
        with pytest.raises(RuntimeError, match=r"^one of the tensors needed for gradient computation has been "
                                               r"modified by an in-place operation"):
            product.sum().backward()
        with rt.no_grad():
            z = head(x)
        assert not z.requires_grad and z._node is None and z._version == x._version


# ---- JAX ----------------------------------------------------------------------------------------
@pytest.fixture(params=["ffi", "callback"])
def jax_route(request, parity_ops):
    jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'opbuilder[jax]')")
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield opbuilder.to_jax(parity_ops, ffi=request.param == "ffi"), request.param
    jax.config.update("jax_enable_x64", old)


# 6 elements: the FFI backward runs the function again; 16384 float64 (128 KiB): it runs the forward's tape
@pytest.mark.parametrize("n", [6, 16384])
@pytest.mark.parametrize("name", sorted(REFS))
def test_jax_gradient_reaches_the_argument(parity_ops, jax_route, name, n):
    import jax
    import jax.numpy as jnp
    ops, route = jax_route
    x = np.resize(X, n) + np.arange(n) * 1e-3
    w = jnp.asarray(_weights(name, x))
    fn = getattr(ops, name)
    args = [jnp.asarray(a) for a in _args(name, x)]
    assert fn.route(*args) == "xla_ffi" if route == "ffi" else fn.route(*args).startswith("callback")
    argnums = tuple(range(len(args)))
    ref = (lambda a: jnp.stack([a[:-1], a[1:]], axis=1)) if name == "windows" else REFS[name][1]
    want = jax.grad(lambda *a: (ref(*a) * w).sum(), argnums)(*args)
    if n == 6:  # the reference itself, against central differences of the op
        for w_k, n_k in zip(want, _numerical(parity_ops, name, x)):
            np.testing.assert_allclose(np.asarray(w_k), n_k, rtol=1e-6, atol=1e-8)
    loss = lambda *a: (fn(*a) * w).sum()  # noqa: E731
    for grad in (jax.grad(loss, argnums), jax.jit(jax.grad(loss, argnums)), jax.jit(jax.value_and_grad(loss, argnums))):
        got = grad(*args)
        got = got[1] if isinstance(got[0], jax.Array) and got[0].ndim == 0 else got
        for g, r in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-12, atol=1e-12)
    for a, b in zip(args, _args(name, x)):
        np.testing.assert_array_equal(np.asarray(a), b)  # (the caller's arrays keep their values)


def test_the_argument_whose_storage_it_is_not_another_over_the_same_array(parity_ops):
    """second_mid(x, y) returns y[1:3]; with x = b.detach() and y = b (one array, two arguments) the result
    is b's view and takes b's gradient, and with them the other way it is the detached tensor's view, with
    no gradient. The first fix took the first argument over the result's array (an attack on 04fb84c)."""
    w = Tensor(np.array([1.0, 3.0]))
    a = Tensor(X.copy(), requires_grad=True)
    b = a * 1.0
    r = parity_ops.second_mid(b.detach(), b)
    assert r._base is b
    (r * w).sum().backward()
    np.testing.assert_array_equal(a.grad.asnumpy(), [0.0, 1.0, 3.0, 0.0, 0.0, 0.0])
    b = Tensor(X.copy(), requires_grad=True) * 1.0
    d = b.detach()
    r = parity_ops.second_mid(b, d)
    assert not r.requires_grad and r._node is None and r._base is d


def test_a_view_of_a_list_arguments_tensor(parity_ops):
    """head_of_first([b]) returns b[:2]: b's view, with b's gradient (an attack on 04fb84c: a list
    argument's tensors were not looked at)."""
    a = Tensor(X[:4].copy(), requires_grad=True)
    b = a * 2.0
    r = parity_ops.head_of_first([b])
    assert r._base is b and r._version == b._version
    (r * Tensor(np.array([1.0, 3.0]))).sum().backward()
    np.testing.assert_array_equal(a.grad.asnumpy(), [2.0, 6.0, 0.0, 0.0])


@pytest.mark.parametrize("base", ["leaf", "non-leaf"])
def test_a_view_made_under_no_grad_is_refused_a_write_with_grad_on(parity_ops, base):
    """As the runtime's own x[:2] made under no_grad: a recorded write into it later is refused, for a
    leaf base and a non-leaf one (an attack on 04fb84c: the write went through, unrecorded)."""
    own = lambda x: x[:2]  # noqa: E731
    for head in (parity_ops.head_alias, own):
        a = Tensor(X.copy(), requires_grad=True)
        b = a if base == "leaf" else a * 2.0
        with rt.no_grad():
            v = head(b)
        with pytest.raises(RuntimeError, match=r"^ParityScale modifies argument 0 in place \(MarkDirty\): a view "
                                               r"was created in no_grad mode and is being modified in place"):
            parity_ops.scale_(v)
        np.testing.assert_array_equal(b.asnumpy(), X * (1.0 if base == "leaf" else 2.0))


def test_runtime_jit_replays_which_results_have_a_history(parity_ops):
    """second_mid(x, y) is y's view: with only x requiring grad it has no history, on a replay as eagerly
    (a replay made every float result of a C++ function require grad when any argument did, with no
    gradient behind it); traced so, then called with y requiring grad, it takes y's gradient. With y =
    x.detach() its base is y, on a replay too (it was the first argument on y's counter)."""
    f = rt.jit(parity_ops.second_mid)
    w = Tensor(np.array([1.0, 3.0]))
    for _ in range(3):  # trace, replay, replay
        x = Tensor(X.copy(), requires_grad=True)
        r = f(x, Tensor(X.copy()))
        assert not r.requires_grad and r._node is None
    y = Tensor(X.copy(), requires_grad=True)
    r = f(Tensor(X.copy()), y * 1.0)
    (r * w).sum().backward()
    np.testing.assert_array_equal(y.grad.asnumpy(), [0.0, 1.0, 3.0, 0.0, 0.0, 0.0])
    for _ in range(3):
        a = Tensor(X.copy(), requires_grad=True)
        b = a * 1.0
        d = b.detach()
        r = f(b, d)
        assert not r.requires_grad and r._base is d
        r = f(d, b)
        assert r.requires_grad and r._base is b


@pytest.mark.parametrize("first", ["positive", "negative"])
def test_runtime_jit_replays_a_history_a_value_picks(parity_ops, first):
    """square_if_positive gives x * x (a Function's history) or new zeros (none) by x's first element:
    each replay's result has the history that call's run gave, whichever the trace saw first."""
    f = rt.jit(parity_ops.square_if_positive)
    signs = [1.0, -1.0, 1.0, -1.0] if first == "positive" else [-1.0, 1.0, -1.0, 1.0]
    for sign in signs:
        x = Tensor(np.abs(X) * sign, requires_grad=True)
        r = f(x)
        assert r.requires_grad == (sign > 0)
        if sign > 0:
            (r * Tensor(np.ones(6))).sum().backward()
            np.testing.assert_allclose(x.grad.asnumpy(), 2 * np.abs(X), rtol=1e-12)


def test_a_view_of_an_argument_that_is_itself_strided(parity_ops):
    """head_alias of x[::2] (an argument that is not C-contiguous): its two elements are x's 0 and 2, so
    the gradient lands there (the placement by indices, not the offset and strides of a C-contiguous one)."""
    x = Tensor(np.arange(8.0), requires_grad=True)
    r = parity_ops.head_alias(x[::2])
    np.testing.assert_array_equal(r.asnumpy(), [0.0, 2.0])
    (r * Tensor(np.array([1.0, 3.0]))).sum().backward()
    np.testing.assert_array_equal(x.grad.asnumpy(), [1.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    with rt.no_grad():
        v = x[::2]
        r = parity_ops.head_alias(v)
    assert r._base is x and r._version == x._version  # (x[::2]'s base is x: a view of a view)

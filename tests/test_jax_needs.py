"""to_jax under jax.grad with respect to some inputs: the backward asks for those gradients only, on
every route (the generic XLA FFI handlers, a module's OB_XLA_FFI handlers, the callback): Forward and
Backward see NeedsInputGrad(i) false for an input JAX does not differentiate, as the runtime does for an
input that does not require grad, and no gradient is computed for it (nor a buffer written)."""
from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'opbuilder[jax]')")
jnp = pytest.importorskip("jax.numpy")

import opbuilder  # noqa: E402

from op_util import CPP, load_op  # noqa: E402
from jax_util import x64  # noqa: E402,F401  (module-wide 64-bit arrays)

pytestmark = pytest.mark.build


@pytest.fixture(scope="module")
def needs_ops(cache_dir):
    """tests/cpp/ffi_needs_ops.cpp: x * y counting the gradients its Backward computed."""
    return load_op("ffi_needs_ops", [CPP / "ffi_needs_ops.cpp"], include_paths=[jax.ffi.include_dir()],
                   cflags=["-Wall", "-Wextra", "-Werror"])


def _routes(m):
    """(label, the to_jax function, the route it must take)."""
    j, cb = opbuilder.to_jax(m), opbuilder.to_jax(m, ffi=False)
    return [("generic", j.mul, "xla_ffi"), ("OB_XLA_FFI", j.mul_own, "xla_ffi: the module's OB_XLA_FFI handlers"),
            ("callback", cb.mul, "callback: to_jax(..., ffi=False)")]


def _counts(m):
    return [m._count(k) for k in range(4)]


@pytest.mark.parametrize("argnums", [0, 1, (0, 1)])
def test_only_the_differentiated_inputs_gradients_are_computed(needs_ops, argnums):
    x = jnp.asarray([1.0, 2.0, 3.0])
    y = jnp.asarray([4.0, 5.0, 6.0])
    wanted = (argnums,) if isinstance(argnums, int) else argnums
    for label, f, route in _routes(needs_ops):
        assert f.route(x, y) == route, label
        g = jax.jit(jax.grad(lambda a, b, f=f: (f(a, b) ** 2).sum(), argnums=argnums))
        before = _counts(needs_ops)
        got = g(x, y)
        after = _counts(needs_ops)
        got = (got,) if isinstance(argnums, int) else got
        expect = {0: 2 * x * y * y, 1: 2 * x * x * y}
        for k, v in zip(wanted, got):
            np.testing.assert_allclose(np.asarray(v), np.asarray(expect[k]), rtol=1e-14, err_msg=label)
        computed = [after[k] - before[k] for k in range(2)]
        assert computed == [1 if k in wanted else 0 for k in range(2)], label
        # the backward's run of Forward saw the same flags Backward did
        assert after[2:] == [1 if k in wanted else 0 for k in range(2)], label


def test_an_unused_output_and_vmap_keep_the_gradients(needs_ops):
    """A cotangent JAX knows is zero (an output the loss does not use) arrives as zeros; under vmap each
    row's backward asks for the same gradients."""
    x = jnp.asarray([[1.0, 2.0], [3.0, 4.0]])
    y = jnp.asarray([[5.0, 6.0], [7.0, 8.0]])
    for label, f, _ in _routes(needs_ops):
        g = jax.grad(lambda a, b, f=f: f(a, b)[0].sum() + 0.0 * f(b, a)[1].sum(), argnums=1)(x, y)
        np.testing.assert_allclose(np.asarray(g), np.asarray(jnp.zeros_like(y).at[0].set(x[0])), err_msg=label)
        before = _counts(needs_ops)
        gv = jax.jit(jax.vmap(jax.grad(lambda a, b, f=f: f(a, b).sum())))(x, y)
        after = _counts(needs_ops)
        np.testing.assert_allclose(np.asarray(gv), np.asarray(y), err_msg=label)
        assert [after[k] - before[k] for k in range(2)] == [2, 0], label


def test_the_needs_mask_reaches_past_the_first_inputs():
    from opbuilder.bridges.interop_jax_ffi import Needs
    assert int(Needs([True, False, True]).mask()) == 0b101
    flags = [False] * 63 + [True]
    assert int(Needs(flags).mask()) == -(1 << 63)  # bit 63, as the signed attribute XLA carries
    assert Needs([True, False]) == Needs((1, 0)) and hash(Needs([True])) == hash(Needs((True,)))


def test_nine_outputs_through_the_generic_handlers(needs_ops):
    """More results than the handlers keep inline: values and gradient as on the callback path."""
    x = jnp.asarray([1.0, 2.0, 3.0])
    j, cb = opbuilder.to_jax(needs_ops), opbuilder.to_jax(needs_ops, ffi=False)
    assert j.nine.route(x) == "xla_ffi"
    got, ref = jax.jit(j.nine)(x), jax.jit(cb.nine)(x)
    assert len(got) == 9
    for k, (a, b) in enumerate(zip(got, ref)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(x) + k)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    w = jnp.arange(9.0)
    loss = {n: (lambda v, f=f: sum(w[k] * o.sum() for k, o in enumerate(f.nine(v))))
            for n, f in (("ffi", j), ("cb", cb))}
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.grad(loss["ffi"]))(x)), np.full(3, float(w.sum())))
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.grad(loss["cb"]))(x)), np.full(3, float(w.sum())))

"""to_jax's default route: every C++ Function runs as an XLA custom call through the generic handlers
(src/jax_ffi.cpp), with no OB_XLA_FFI line and no XLA headers in the operator's build; pure_callback is
the named fallback (``ffi=False``, or a reason ``f.route`` gives). Same values and gradients on both."""
from __future__ import annotations

import types

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'opbuilder[jax]')")
jnp = pytest.importorskip("jax.numpy")

import opbuilder  # noqa: E402

from jax_util import x64  # noqa: E402,F401  (module-wide 64-bit arrays)
from numeric_util import central  # noqa: E402

pytestmark = pytest.mark.build


def _data(shape=(3, 4), seed=0):
    r = np.random.default_rng(seed)
    return jnp.asarray(r.standard_normal(shape)), jnp.asarray(r.standard_normal(shape))


def test_a_function_op_runs_as_the_generic_custom_call(my_ops):
    """custom_src/function_ops.cpp has no OB_XLA_FFI and was built without XLA's headers."""
    assert not hasattr(my_ops, "mul_xla_fwd")
    j = opbuilder.to_jax(my_ops)
    x, y = _data()
    assert j.mul.route(x, y) == "xla_ffi"
    text = jax.jit(j.mul).lower(x, y).as_text()
    assert "opbuilder.ffi.forward" in text and "callback" not in text
    grad_text = jax.jit(jax.grad(lambda a, b: j.mul(a, b).sum())).lower(x, y).as_text()
    assert "opbuilder.ffi.backward" in grad_text and "callback" not in grad_text


def test_ffi_false_is_the_callback_and_says_so(my_ops):
    cb = opbuilder.to_jax(my_ops, ffi=False)
    x, y = _data()
    assert cb.mul.route(x, y) == "callback: to_jax(..., ffi=False)"
    assert "callback" in jax.jit(cb.mul).lower(x, y).as_text()


def test_values_and_gradients_match_the_callback(my_ops):
    """Including a broadcast: Backward returns y's gradient in x's shape, summed down to y's as the
    runtime's engine does (the callback path goes through it)."""
    j, cb = opbuilder.to_jax(my_ops), opbuilder.to_jax(my_ops, ffi=False)
    x, _ = _data((3, 4))
    y = jnp.asarray(np.random.default_rng(1).standard_normal(4))
    assert j.mul.route(x, y) == "xla_ffi"
    np.testing.assert_array_equal(np.asarray(jax.jit(j.mul)(x, y)), np.asarray(jax.jit(cb.mul)(x, y)))
    loss = {k: (lambda a, b, f=f: (f.mul(a, b) ** 2).sum()) for k, f in (("ffi", j), ("cb", cb))}
    g = jax.jit(jax.grad(loss["ffi"], argnums=(0, 1)))(x, y)
    gc = jax.jit(jax.grad(loss["cb"], argnums=(0, 1)))(x, y)
    assert g[1].shape == (4,)
    for a, b in zip(g, gc):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-13)
    np.testing.assert_allclose(np.asarray(g[1]), central(lambda b: float(loss["cb"](x, jnp.asarray(b))),
                                                         np.asarray(y)), rtol=1e-6)


def test_vmap_and_float32(my_ops):
    j, cb = opbuilder.to_jax(my_ops), opbuilder.to_jax(my_ops, ffi=False)
    x, y = (a.astype(jnp.float32) for a in _data((5, 3)))
    assert j.mul.route(x[0], y[0]) == "xla_ffi"
    got = jax.jit(jax.vmap(j.mul))(x, y)
    assert got.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.vmap(cb.mul)(x, y)))


def test_a_plain_bound_function_runs_as_the_host_custom_call_and_names_why(api_ops):
    """tests/cpp/tensor_api_ops.cpp's contiguous is a plain kernel, not a Function: no entry to run in
    C++, so the custom call runs to_jax's callback code (host Python), not jax.pure_callback."""
    j = opbuilder.to_jax(types.SimpleNamespace(contiguous=api_ops.contiguous))
    x, _ = _data((2, 3))
    assert j.contiguous.route(x) == "xla_ffi (host Python): it is not one C++ Function's Apply (it ran no op)"
    text = jax.jit(j.contiguous).lower(x).as_text()
    assert "opbuilder.ffi.host" in text and "callback" not in text
    np.testing.assert_array_equal(np.asarray(jax.jit(j.contiguous)(x)), np.asarray(x))
    np.testing.assert_array_equal(np.asarray(jax.vmap(j.contiguous)(jnp.stack([x, 2 * x]))),
                                  np.stack([np.asarray(x), 2 * np.asarray(x)]))


def test_several_ops_and_static_arguments_run_as_the_host_custom_call(my_ops):
    """A function of two C++ Function calls, and a call with a static argument: the host custom call,
    with the callback's values and gradients."""
    def twice(a, b):
        return my_ops.mul(my_ops.mul(a, b), b)

    def scaled(a, k):
        return my_ops.mul(a, a) * k
    ns = types.SimpleNamespace(twice=twice, scaled=scaled)
    j, cb = opbuilder.to_jax(ns), opbuilder.to_jax(ns, ffi=False)
    x, y = _data()
    assert j.twice.route(x, y) == ("xla_ffi (host Python): it is not one C++ Function's Apply (it ran cpp "
                                   "CustomMul, cpp CustomMul)")
    assert j.scaled.route(x, 2.0) == ("xla_ffi (host Python): the call has non-array arguments (XLA passes "
                                      "buffers only)")
    for name, args in (("twice", (x, y)), ("scaled", (x,))):
        f = {k: (lambda *a, g=getattr(v, name): g(*a, 2.0) if name == "scaled" else g(*a)) for k, v in
             (("ffi", j), ("cb", cb))}
        np.testing.assert_array_equal(np.asarray(jax.jit(f["ffi"])(*args)), np.asarray(jax.jit(f["cb"])(*args)))
        g = jax.jit(jax.grad(lambda *a: f["ffi"](*a).sum(), argnums=0))(*args)
        np.testing.assert_allclose(np.asarray(g), np.asarray(jax.grad(lambda *a: f["cb"](*a).sum())(*args)),
                                   rtol=1e-13)
    assert "opbuilder.ffi.host" in jax.jit(jax.grad(lambda a: j.scaled(a, 2.0).sum())).lower(x).as_text()


def test_an_error_in_the_host_custom_call_reaches_the_caller(api_ops):
    """A lying shape rule: the host custom call refuses to write a result of another shape."""
    j = opbuilder.to_jax(types.SimpleNamespace(contiguous=api_ops.contiguous),
                         shape_fn={"contiguous": lambda a: opbuilder.Spec((7,), a.dtype)})
    x, _ = _data((2, 3))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"RuntimeError: result 0 has shape \(2, 3\) and dtype "
                                                         r"float64, but XLA expects shape \(7,\) and dtype float64"):
        jax.jit(j.contiguous)(x).block_until_ready()


def test_the_function_runs_once_per_signature_at_trace_time_and_never_from_python_after(my_ops):
    """The probe: three calls of the module function per signature, on positive values, negative values
    and zeros (a Python wrapper over the C++ function is seen through: the probe finds the Apply
    inside), shape rule or not; every later call, eager or jitted, forward or backward, runs the custom
    call without calling Python."""
    calls = []

    def mul(*a):
        calls.append(a)
        return my_ops.mul(*a)
    for rule in (None, {"mul": lambda a, b: opbuilder.Spec(a.shape, a.dtype)}):
        calls.clear()
        j = opbuilder.to_jax(types.SimpleNamespace(mul=mul), shape_fn=rule)
        x, y = _data()
        np.testing.assert_array_equal(np.asarray(j.mul(x, y)), np.asarray(x) * np.asarray(y))
        assert len(calls) == 3
        values = [np.concatenate([np.asarray(a.asnumpy()).ravel() for a in c]) for c in calls]
        assert (values[0] > 0).all() and (values[1] < 0).all() and (values[2] == 0).all()
        assert j.mul.route(x, y) == "xla_ffi"
        jax.jit(jax.grad(lambda a, b: j.mul(a, b).sum()))(y, x).block_until_ready()
        j.mul(y, x).block_until_ready()
        assert len(calls) == 3


def test_ffi_must_be_a_bool(my_ops):
    with pytest.raises(TypeError, match=r"^to_jax: ffi must be True or False, got str$"):
        opbuilder.to_jax(my_ops, ffi="no")


# ---- the probe keeps a function that is more than one Apply off the C++ route (attack on 7d7ce5e) ----
@pytest.fixture(scope="module")
def probe_ops(cache_dir):
    from op_util import CPP, load_op
    return load_op("jax_probe_ops", [CPP / "jax_probe_ops.cpp"])


@pytest.mark.parametrize("name, args, why", [
    ("pick", ([1.0, -2.0], [0.0]), "it runs another C++ Function for other values of its arguments"),
    ("pick", ([1.0, -2.0], [1.0]), "it runs another C++ Function for other values of its arguments"),
    ("post", ([1.0, -2.0], [1.0, 1.0]), "it does not return the outputs of the C++ Function ScaleBy<1> as it "
                                        "left them"),
    ("pre", ([1.0, -2.0], [1.0, 1.0]), "it changes its arrays before the C++ Function ScaleBy<1> reads them"),
])
def test_work_outside_apply_keeps_the_function_off_the_cpp_route(probe_ops, name, args, why):
    """The C++ custom call runs the Function alone; a bound function that picks it by a value, or does
    work before or after Apply, must run as itself (the host route) with the callback's values and
    gradients. (Probed on zeros only, these gave [2, -4] for pick(x, [0]), x for post, and a clamp lost.)"""
    j, cb = opbuilder.to_jax(probe_ops), opbuilder.to_jax(probe_ops, ffi=False)
    xs = [jnp.asarray(np.array(a, np.float64)) for a in args]
    assert getattr(j, name).route(*xs) == f"xla_ffi (host Python): {why}"
    for f in (getattr(j, name), jax.jit(getattr(j, name))):
        np.testing.assert_array_equal(np.asarray(f(*xs)), np.asarray(getattr(cb, name)(*xs)))
    g = jax.grad(lambda a: getattr(j, name)(a, xs[1]).sum())(xs[0])
    gc = jax.grad(lambda a: getattr(cb, name)(a, xs[1]).sum())(xs[0])
    np.testing.assert_array_equal(np.asarray(g), np.asarray(gc))
    assert probe_ops.plain is not None and j.plain.route(*xs) == "xla_ffi"  # one Apply: the C++ route

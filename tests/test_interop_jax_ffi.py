"""to_jax's XLA FFI path: Functions bound with OB_XLA_FFI (include/opbuilder/xla_ffi.h) run as XLA
custom calls; same results and gradients as the pure_callback path, checked against central
differences in float64."""
from __future__ import annotations

import types

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'opbuilder[jax]')")
jnp = pytest.importorskip("jax.numpy")

import opbuilder  # noqa: E402
from opbuilder import Spec  # noqa: E402

from op_util import BINDINGS, CPP, load_op  # noqa: E402
from numeric_util import central  # noqa: E402
from jax_util import x64  # noqa: E402,F401  (module-wide 64-bit arrays)

pytestmark = pytest.mark.build

_SQUARE_RULE = {"square": lambda x: Spec(x.shape, x.dtype)}


@pytest.fixture(scope="session", params=BINDINGS)
def xla_ffi_ops(cache_dir, request):
    """tests/cpp/xla_ffi_ops.cpp with XLA's FFI headers, bound with each layer."""
    return load_op("xla_ffi_ops", [CPP / "xla_ffi_ops.cpp"], include_paths=[jax.ffi.include_dir()],
                 cflags=["-Wall", "-Wextra", "-Werror"], binding=request.param)


def _callback_twin(module):
    """The same functions and shape rules without the capsules: to_jax's pure_callback path."""
    names = ["mul", "mul_infer_shape", "sin_cube", "sin_cube_infer_shape"]
    return types.SimpleNamespace(**{n: getattr(module, n) for n in names})


def _data(shape=(3, 4), seed=0):
    r = np.random.default_rng(seed)
    return jnp.asarray(r.standard_normal(shape)), jnp.asarray(r.standard_normal(shape))


def test_the_module_exports_capsules(xla_ffi_ops):
    for name in ("mul", "sin_cube", "square"):
        for stage in ("fwd", "bwd"):
            assert type(getattr(xla_ffi_ops, f"{name}_xla_{stage}")).__name__ == "PyCapsule"


def test_jit_lowers_to_the_custom_call_not_a_callback(xla_ffi_ops):
    j = opbuilder.to_jax(xla_ffi_ops, shape_fn=_SQUARE_RULE)
    x, y = _data()
    text = jax.jit(j.mul).lower(x, y).as_text()
    assert ".mul.fwd" in text and "callback" not in text
    grad_text = jax.jit(jax.grad(lambda a, b: j.mul(a, b).sum())).lower(x, y).as_text()
    assert ".mul.bwd" in grad_text and "callback" not in grad_text
    # the callback twin really is the other path
    assert "callback" in jax.jit(opbuilder.to_jax(_callback_twin(xla_ffi_ops)).mul).lower(x, y).as_text()


def test_forward_eager_jit_and_float32(xla_ffi_ops):
    j = opbuilder.to_jax(xla_ffi_ops, shape_fn=_SQUARE_RULE)
    cb = opbuilder.to_jax(_callback_twin(xla_ffi_ops))
    x, y = _data()
    expect = np.asarray(x) * np.asarray(y)
    np.testing.assert_array_equal(np.asarray(j.mul(x, y)), expect)
    np.testing.assert_array_equal(np.asarray(jax.jit(j.mul)(x, y)), np.asarray(jax.jit(cb.mul)(x, y)))
    x32, y32 = x.astype(jnp.float32), y.astype(jnp.float32)
    out = jax.jit(j.mul)(x32, y32)
    assert out.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x32) * np.asarray(y32))
    np.testing.assert_array_equal(np.asarray(j.square(x)), np.asarray(x) ** 2)


def test_grad_matches_central_differences_and_the_callback_path(xla_ffi_ops):
    j = opbuilder.to_jax(xla_ffi_ops, shape_fn=_SQUARE_RULE)
    cb = opbuilder.to_jax(_callback_twin(xla_ffi_ops))
    x, y = _data()

    def loss(ops):
        return lambda a, b: (ops.mul(a, b) ** 2).sum() + ops.sin_cube(a)[0].sum() + 0.5 * ops.sin_cube(b)[1].sum()

    gx, gy = jax.jit(jax.grad(loss(j), argnums=(0, 1)))(x, y)

    def plain(a, b):
        return np.sum((a * b) ** 2) + np.sum(np.sin(a)) + 0.5 * np.sum(b ** 3)
    xn, yn = np.asarray(x), np.asarray(y)
    np.testing.assert_allclose(np.asarray(gx), central(lambda a: plain(a, yn), xn), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(gy), central(lambda b: plain(xn, b), yn), rtol=1e-6, atol=1e-6)
    cx, cy = jax.jit(jax.grad(loss(cb), argnums=(0, 1)))(x, y)
    np.testing.assert_allclose(np.asarray(gx), np.asarray(cx), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(gy), np.asarray(cy), rtol=1e-12)


def test_outputs_built_in_each_others_result_buffers(xla_ffi_ops):
    j = opbuilder.to_jax(xla_ffi_ops, shape_fn=_SQUARE_RULE)
    x, _ = _data((257,))
    twice, plus_one = jax.jit(j.swapped)(x)
    np.testing.assert_array_equal(np.asarray(twice), 2 * np.asarray(x))
    np.testing.assert_array_equal(np.asarray(plus_one), np.asarray(x) + 1)
    g = jax.jit(jax.grad(lambda a: (j.swapped(a)[0] * j.swapped(a)[1]).sum()))(x)
    np.testing.assert_allclose(np.asarray(g), central(lambda a: np.sum(2 * a * (a + 1)), np.asarray(x)),
                               rtol=1e-6, atol=1e-6)


def test_the_handler_runs_without_the_gil(xla_ffi_ops):
    j = opbuilder.to_jax(xla_ffi_ops, shape_fn=_SQUARE_RULE)
    x, _ = _data((4,))
    np.testing.assert_array_equal(np.asarray(xla_ffi_ops.gil_held(x).asnumpy()), np.ones(4))  # a direct call holds it
    np.testing.assert_array_equal(np.asarray(jax.jit(j.gil_held)(x)), np.zeros(4))
    np.testing.assert_array_equal(np.asarray(j.gil_held(x)), np.zeros(4))


def test_vmap_forward_and_grad(xla_ffi_ops):
    j = opbuilder.to_jax(xla_ffi_ops, shape_fn=_SQUARE_RULE)
    x, y = _data((5, 3))
    np.testing.assert_array_equal(np.asarray(jax.vmap(j.mul)(x, y)), np.asarray(x) * np.asarray(y))
    g = jax.jit(jax.vmap(jax.grad(lambda r: j.sin_cube(r)[1].sum())))(x)
    np.testing.assert_allclose(np.asarray(g), central(lambda a: np.sum(a ** 3), np.asarray(x)), rtol=1e-6, atol=1e-6)


def test_a_handler_without_a_shape_rule_is_refused(xla_ffi_ops):
    with pytest.raises(ValueError, match=r"^to_jax: square has XLA FFI handlers \(square_xla_fwd\) but no shape "
                                         r"rule: the custom call needs its result shapes before it runs; declare "
                                         r"a static InferShape in the Function and bind it as 'square_infer_shape'"):
        opbuilder.to_jax(xla_ffi_ops)


def test_an_error_in_forward_names_the_function(xla_ffi_ops):
    j = opbuilder.to_jax(xla_ffi_ops, shape_fn=_SQUARE_RULE)
    x, _ = _data()
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=r"Mul \(XLA FFI forward\): mul: x and y must have one shape and dtype"):
        jax.jit(j.mul)(x, x.astype(jnp.float32)).block_until_ready()


def test_a_lying_shape_rule_is_an_error_not_a_bad_write(xla_ffi_ops):
    j = opbuilder.to_jax(xla_ffi_ops, shape_fn={**_SQUARE_RULE, "mul": lambda a, b: Spec((a.shape[0] + 1,)
                                                                                         + a.shape[1:], a.dtype)})
    x, y = _data()
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=r"Mul: output 0 has shape \[3, 4\] and dtype float64, but XLA expects shape "
                             r"\[4, 4\] and dtype float64"):
        jax.jit(j.mul)(x, y).block_until_ready()

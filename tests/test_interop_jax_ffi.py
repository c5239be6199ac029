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
from runtime import Tensor  # noqa: E402
from opbuilder import Spec  # noqa: E402

from op_util import BINDINGS, CPP, load_op  # noqa: E402
from numeric_util import central  # noqa: E402
from jax_util import x64  # noqa: E402,F401  (module-wide 64-bit arrays)

pytestmark = pytest.mark.build

# shape rules of the functions without an InferShape companion (positions' int64 output is not its
# input's dtype, which is all a C++ InferShape can declare)
_RULES = {"square": lambda x: Spec(x.shape, x.dtype), "positions": lambda x: Spec(x.shape, np.int64)}


@pytest.fixture(scope="session", params=BINDINGS)
def xla_ffi_ops(cache_dir, request):
    """tests/cpp/xla_ffi_ops.cpp with XLA's FFI headers, bound with each layer."""
    return load_op("xla_ffi_ops", [CPP / "xla_ffi_ops.cpp"], include_paths=[jax.ffi.include_dir()],
                 cflags=["-Wall", "-Wextra", "-Werror"], binding=request.param)


def _callback_twin(module):
    """The same functions and shape rules without the capsules, for to_jax(..., ffi=False): the
    pure_callback path (without ffi=False, to_jax's generic handlers would run them as custom calls)."""
    names = ["mul", "sin_cube", "add_one_", "triple_scratch", "conj_mul", "saved_data", "add_one_views",
             "dirty_not_returned", "scale_views", "scale_views_when_grad", "scale_views_if_negative"]
    return types.SimpleNamespace(**{n: getattr(module, x) for m in names for n, x in ((m, m),
                                                                                        (m + "_infer_shape",) * 2)},
                                 positions=module.positions)


def _both(module):
    """{"ffi": the XLA FFI path, "callback": the pure_callback path} of ``module``'s functions."""
    return {"ffi": opbuilder.to_jax(module, shape_fn=_RULES),
            "callback": opbuilder.to_jax(_callback_twin(module), shape_fn={"positions": _RULES["positions"]},
                                         ffi=False)}


def _data(shape=(3, 4), seed=0):
    r = np.random.default_rng(seed)
    return jnp.asarray(r.standard_normal(shape)), jnp.asarray(r.standard_normal(shape))


def test_the_module_exports_capsules(xla_ffi_ops):
    for name in ("mul", "sin_cube", "square"):
        for stage in ("fwd", "bwd"):
            assert type(getattr(xla_ffi_ops, f"{name}_xla_{stage}")).__name__ == "PyCapsule"


def test_jit_lowers_to_the_custom_call_not_a_callback(xla_ffi_ops):
    j = opbuilder.to_jax(xla_ffi_ops, shape_fn=_RULES)
    x, y = _data()
    text = jax.jit(j.mul).lower(x, y).as_text()
    assert ".mul.fwd" in text and "callback" not in text
    grad_text = jax.jit(jax.grad(lambda a, b: j.mul(a, b).sum())).lower(x, y).as_text()
    assert ".mul.bwd" in grad_text and "callback" not in grad_text
    # the callback twin really is the other path
    assert "callback" in jax.jit(opbuilder.to_jax(_callback_twin(xla_ffi_ops), ffi=False).mul).lower(x, y).as_text()


def test_forward_eager_jit_and_float32(xla_ffi_ops):
    j = opbuilder.to_jax(xla_ffi_ops, shape_fn=_RULES)
    cb = opbuilder.to_jax(_callback_twin(xla_ffi_ops), ffi=False)
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
    j = opbuilder.to_jax(xla_ffi_ops, shape_fn=_RULES)
    cb = opbuilder.to_jax(_callback_twin(xla_ffi_ops), ffi=False)
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
    j = opbuilder.to_jax(xla_ffi_ops, shape_fn=_RULES)
    x, _ = _data((257,))
    twice, plus_one = jax.jit(j.swapped)(x)
    np.testing.assert_array_equal(np.asarray(twice), 2 * np.asarray(x))
    np.testing.assert_array_equal(np.asarray(plus_one), np.asarray(x) + 1)
    g = jax.jit(jax.grad(lambda a: (j.swapped(a)[0] * j.swapped(a)[1]).sum()))(x)
    np.testing.assert_allclose(np.asarray(g), central(lambda a: np.sum(2 * a * (a + 1)), np.asarray(x)),
                               rtol=1e-6, atol=1e-6)


def test_the_handler_runs_without_the_gil(xla_ffi_ops):
    j = opbuilder.to_jax(xla_ffi_ops, shape_fn=_RULES)
    x, _ = _data((4,))
    np.testing.assert_array_equal(np.asarray(xla_ffi_ops.gil_held(x).asnumpy()), np.ones(4))  # a direct call holds it
    np.testing.assert_array_equal(np.asarray(jax.jit(j.gil_held)(x)), np.zeros(4))
    np.testing.assert_array_equal(np.asarray(j.gil_held(x)), np.zeros(4))


def test_vmap_forward_and_grad(xla_ffi_ops):
    j = opbuilder.to_jax(xla_ffi_ops, shape_fn=_RULES)
    x, y = _data((5, 3))
    np.testing.assert_array_equal(np.asarray(jax.vmap(j.mul)(x, y)), np.asarray(x) * np.asarray(y))
    g = jax.jit(jax.vmap(jax.grad(lambda r: j.sin_cube(r)[1].sum())))(x)
    np.testing.assert_allclose(np.asarray(g), central(lambda a: np.sum(a ** 3), np.asarray(x)), rtol=1e-6, atol=1e-6)


def test_a_handler_without_a_shape_rule_is_refused(xla_ffi_ops):
    with pytest.raises(ValueError, match=r"^to_jax: square has XLA FFI handlers \(square_xla_fwd\) but no shape "
                                         r"rule: the custom call needs its result shapes before it runs; declare "
                                         r"a static InferShape in the Function and bind it as 'square_infer_shape'"):
        opbuilder.to_jax(xla_ffi_ops, shape_fn={"positions": _RULES["positions"]})


def test_an_error_in_forward_names_the_function(xla_ffi_ops):
    j = opbuilder.to_jax(xla_ffi_ops, shape_fn=_RULES)
    x, _ = _data()
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=r"Mul \(XLA FFI forward\): mul: x and y must have one shape and dtype"):
        jax.jit(j.mul)(x, x.astype(jnp.float32)).block_until_ready()


def test_a_lying_shape_rule_is_an_error_not_a_bad_write(xla_ffi_ops):
    j = opbuilder.to_jax(xla_ffi_ops, shape_fn={**_RULES, "mul": lambda a, b: Spec((a.shape[0] + 1,)
                                                                                         + a.shape[1:], a.dtype)})
    x, y = _data()
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=r"Mul: output 0 has shape \[3, 4\] and dtype float64, but XLA expects shape "
                             r"\[4, 4\] and dtype float64"):
        jax.jit(j.mul)(x, y).block_until_ready()


# ---- issue 33: one semantics on the FFI and callback paths -------------------------------------

def test_an_in_place_op_never_writes_the_callers_array(xla_ffi_ops):
    """JAX arrays are immutable: a MarkDirty op runs on a copy, eagerly and under jit, on both paths,
    and a later use of the input inside the same jitted function sees the original values."""
    assert ".add_one_.fwd" in jax.jit(_both(xla_ffi_ops)["ffi"].add_one_).lower(jnp.zeros(3)).as_text()
    for path, ops in _both(xla_ffi_ops).items():
        x = jnp.arange(4.0)
        np.testing.assert_array_equal(np.asarray(ops.add_one_(x)), np.arange(4.0) + 1, err_msg=path)
        np.testing.assert_array_equal(np.asarray(x), np.arange(4.0), err_msg=path)
        out, later = jax.jit(lambda a: (ops.add_one_(a), a * 10))(x)
        np.testing.assert_array_equal(np.asarray(out), np.arange(4.0) + 1, err_msg=path)
        np.testing.assert_array_equal(np.asarray(later), 10 * np.arange(4.0), err_msg=path)
        np.testing.assert_array_equal(np.asarray(x), np.arange(4.0), err_msg=path)
        twice = jax.jit(lambda a: ops.add_one_(ops.add_one_(a)) + a)(x)  # a is still x after two in-place ops
        np.testing.assert_array_equal(np.asarray(twice), 2 * np.arange(4.0) + 2, err_msg=path)
        np.testing.assert_array_equal(np.asarray(x), np.arange(4.0), err_msg=path)


def test_an_op_that_writes_an_input_never_writes_the_callers_array(xla_ffi_ops):
    for path, ops in _both(xla_ffi_ops).items():
        x = jnp.arange(1.0, 5.0)
        np.testing.assert_array_equal(np.asarray(ops.triple_scratch(x)), 3 * np.arange(1.0, 5.0), err_msg=path)
        np.testing.assert_array_equal(np.asarray(x), np.arange(1.0, 5.0), err_msg=path)
        out, same = jax.jit(lambda a: (ops.triple_scratch(a), a + 0))(x)
        np.testing.assert_array_equal(np.asarray(out), 3 * np.arange(1.0, 5.0), err_msg=path)
        np.testing.assert_array_equal(np.asarray(same), np.arange(1.0, 5.0), err_msg=path)
        np.testing.assert_array_equal(np.asarray(x), np.arange(1.0, 5.0), err_msg=path)
        # a gradient records, and a recorded Forward that writes an input without MarkDirty is refused
        # (the runtime's rule), on both paths; the caller's array is still untouched
        with pytest.raises(jax.errors.JaxRuntimeError,
                           match=r"TripleScratch::Forward modified argument 0 in place without MarkDirty; mark it "
                                 r"\(ctx->MarkDirty\(\{tensor\}\)\) and return it, or write the result to a new "
                                 r"tensor"):
            jax.jit(jax.grad(lambda a: (ops.triple_scratch(a) * a).sum()))(x).block_until_ready()
        np.testing.assert_array_equal(np.asarray(x), np.arange(1.0, 5.0), err_msg=path)


def test_marking_dirty_an_argument_not_returned_is_refused_on_both_paths(xla_ffi_ops):
    """The runtime's rule (an argument modified in place must be returned), on the FFI path too."""
    x = jnp.arange(3.0)
    for path, ops in _both(xla_ffi_ops).items():
        with pytest.raises((jax.errors.JaxRuntimeError, RuntimeError),
                           match=r"DirtyNotReturned(::Forward)?( \(XLA FFI forward\))?: argument 0 was given to "
                                 r"MarkDirty but not returned by Forward; an argument modified in place must be "
                                 r"returned as an output"):
            jax.jit(ops.dirty_not_returned)(x).block_until_ready()
        np.testing.assert_array_equal(np.asarray(x), np.arange(3.0), err_msg=path)


def test_grad_through_an_in_place_op_matches_central_differences(xla_ffi_ops):
    """Under JAX a MarkDirty op is differentiable like any other: its input is a copy, not a leaf."""
    x = jnp.asarray(np.random.default_rng(3).standard_normal(5))
    expect = central(lambda a: float(np.sum((a + 1) ** 2 * a)), np.asarray(x))
    for path, ops in _both(xla_ffi_ops).items():
        def loss(a):
            return (ops.add_one_(a) ** 2 * a).sum()
        np.testing.assert_allclose(np.asarray(jax.grad(loss)(x)), expect, rtol=1e-6, atol=1e-6, err_msg=path)
        np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(loss))(x)), expect, rtol=1e-6, atol=1e-6,
                                   err_msg=path)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(jnp.asarray(np.random.default_rng(3)
                                                                            .standard_normal(5))), err_msg=path)


def test_a_function_taking_views_that_writes_gets_writable_private_copies(xla_ffi_ops):
    """A kAcceptsViews type not known to write nothing gets writable private copies of XLA's buffers
    (issue 33: it got read-only ones and its MarkDirty was refused, while the callback path ran it):
    it writes the copy, the copy's values are the output, and the caller's array keeps its values."""
    j = opbuilder.to_jax(xla_ffi_ops, shape_fn=_RULES)
    empty, writable = jax.jit(j.add_one_views)(jnp.zeros((0,)))  # no MarkDirty for an empty x
    assert empty.shape == (0,) and float(writable) == 1.0  # a private copy, writable
    x = jnp.arange(3.0)
    for path, ops in _both(xla_ffi_ops).items():
        for f in (ops.add_one_views, jax.jit(ops.add_one_views)):
            for _ in range(2):
                out, writable = f(x)
                np.testing.assert_array_equal(np.asarray(out), np.arange(3.0) + 1, err_msg=path)
                assert float(writable) == 1.0, path
                np.testing.assert_array_equal(np.asarray(x), np.arange(3.0), err_msg=path)
        out, later = jax.jit(lambda a, ops=ops: (ops.add_one_views(a)[0], a * 10))(x)
        np.testing.assert_array_equal(np.asarray(out), np.arange(3.0) + 1, err_msg=path)
        np.testing.assert_array_equal(np.asarray(later), 10 * np.arange(3.0), err_msg=path)
        np.testing.assert_array_equal(np.asarray(x), np.arange(3.0), err_msg=path)


def test_a_declared_write_is_aliased_to_its_output_by_xla(xla_ffi_ops):
    """to_jax(mutates=...): the written argument is declared to XLA (input_output_aliases); XLA copies
    it into the output's buffer (or takes a donated one) and Forward writes that buffer, with no copy
    of its own; the caller's array is unchanged unless donated."""
    j = opbuilder.to_jax(xla_ffi_ops, shape_fn=_RULES, mutates={"add_one_views": [0], "add_one_": [0]})
    text = jax.jit(j.add_one_views).lower(jnp.zeros(3)).as_text()
    assert ".add_one_views.fwd" in text and "output_operand_alias<output_tuple_indices = [0], operand_index = 0" in text
    for name in ("add_one_views", "add_one_"):
        x = jnp.arange(4.0)
        for fn in (getattr(j, name), jax.jit(getattr(j, name)), jax.jit(lambda a, name=name: getattr(j, name)(a))):
            out = fn(x)
            out = out[0] if name == "add_one_views" else out
            np.testing.assert_array_equal(np.asarray(out), np.arange(4.0) + 1, err_msg=name)
            np.testing.assert_array_equal(np.asarray(x), np.arange(4.0), err_msg=name)
        later = jax.jit(lambda a, name=name: getattr(j, name)(a)[0] * 0 + a)(x) if name == "add_one_views" else \
            jax.jit(lambda a: j.add_one_(a) * 0 + a)(x)
        np.testing.assert_array_equal(np.asarray(later), np.arange(4.0), err_msg=name)
    _, writable = jax.jit(j.add_one_views)(jnp.arange(4.0))
    assert float(writable) == 1.0  # the aliased buffer, writable
    donated = jax.jit(j.add_one_, donate_argnums=0)(jnp.arange(4.0))
    np.testing.assert_array_equal(np.asarray(donated), np.arange(4.0) + 1)
    g = jax.jit(jax.grad(lambda a: (j.add_one_views(a)[0] ** 2).sum()))(jnp.arange(4.0))
    np.testing.assert_allclose(np.asarray(g), central(lambda a: float(np.sum((a + 1) ** 2)), np.arange(4.0)),
                               rtol=1e-6, atol=1e-6)


def test_bad_mutates_declarations(xla_ffi_ops):
    with pytest.raises(ValueError, match=r"^to_jax: mutates names 'nope', which the module does not define "
                                         r"\(it has "):
        opbuilder.to_jax(xla_ffi_ops, shape_fn=_RULES, mutates={"nope": [0]})
    with pytest.raises(TypeError, match=r"^to_jax: mutates\['mul'\] must be a non-empty list of argument "
                                        r"positions \(ints >= 0\), got \[True\]$"):
        opbuilder.to_jax(xla_ffi_ops, shape_fn=_RULES, mutates={"mul": [True]})
    j = opbuilder.to_jax(xla_ffi_ops, shape_fn=_RULES, mutates={"mul": [2], "positions": [0]})
    with pytest.raises(TypeError, match=r"^mul: mutates names argument 2, but in this call it is missing; declare "
                                        r"the positions of arrays the function writes$"):
        j.mul(jnp.ones(2), jnp.ones(2))
    with pytest.raises(ValueError, match=r"^positions: mutates names argument 0 \(shape \(2,\), float64\), but no "
                                         r"output has its shape and dtype; JAX arrays are immutable, so a function "
                                         r"that writes an argument must return it \(an in-place op\) for JAX to "
                                         r"see the write"):
        jax.jit(j.positions)(jnp.ones(2))


def _complex_data(seed=5):
    r = np.random.default_rng(seed)
    z = r.standard_normal((2, 3)) + 1j * r.standard_normal((2, 3))
    w = r.standard_normal((2, 3)) + 1j * r.standard_normal((2, 3))
    return jnp.asarray(z), jnp.asarray(w)


def _conj_mul_jnp(a, b):
    return a * jnp.conj(b) + a * a


def test_complex_gradients_follow_jaxs_convention_on_every_path(xla_ffi_ops):
    """x * conj(y) + x * x: jax.vjp and jax.grad of a real loss agree on the FFI path, the callback path
    and the jnp expression, and jax.grad equals dL/dRe - i dL/dIm (JAX's convention) by central
    differences in float64."""
    ops = _both(xla_ffi_ops)
    assert ".conj_mul.bwd" in jax.jit(jax.grad(lambda a, b: jnp.abs(ops["ffi"].conj_mul(a, b)).sum())).lower(
        *_complex_data()).as_text()
    z, w = _complex_data()
    ct = jnp.asarray(np.random.default_rng(9).standard_normal((2, 3)) + 1j * np.random.default_rng(10)
                     .standard_normal((2, 3)))
    want_vjp = jax.vjp(_conj_mul_jnp, z, w)[1](ct)

    def real_loss(f):
        return lambda a, b: (jnp.abs(f(a, b)) ** 2).sum() + jnp.real(f(a, b) * (1 + 2j)).sum()
    want_grad = jax.grad(real_loss(_conj_mul_jnp), argnums=(0, 1))(z, w)

    zn, wn = np.asarray(z), np.asarray(w)

    def plain(a, b):
        v = a * np.conj(b) + a * a
        return float(np.sum(np.abs(v) ** 2) + np.sum(np.real(v * (1 + 2j))))
    by_re = central(lambda re: plain(re + 1j * zn.imag, wn), zn.real)
    by_im = central(lambda im: plain(zn.real + 1j * im, wn), zn.imag)
    np.testing.assert_allclose(np.asarray(want_grad[0]), by_re - 1j * by_im, rtol=1e-6, atol=1e-6)
    wy_re = central(lambda re: plain(zn, re + 1j * wn.imag), wn.real)
    wy_im = central(lambda im: plain(zn, wn.real + 1j * im), wn.imag)
    np.testing.assert_allclose(np.asarray(want_grad[1]), wy_re - 1j * wy_im, rtol=1e-6, atol=1e-6)
    for path, o in ops.items():
        np.testing.assert_allclose(np.asarray(o.conj_mul(z, w)), np.asarray(_conj_mul_jnp(z, w)), rtol=1e-14,
                                   err_msg=path)
        for how, fn in (("eager", lambda f: f), ("jit", jax.jit)):
            got_vjp = fn(lambda a, b, c: jax.vjp(o.conj_mul, a, b)[1](c))(z, w, ct)
            for g, want in zip(got_vjp, want_vjp):
                np.testing.assert_allclose(np.asarray(g), np.asarray(want), rtol=1e-12, err_msg=f"{path} {how}")
            got = fn(jax.grad(real_loss(o.conj_mul), argnums=(0, 1)))(z, w)
            for g, want in zip(got, want_grad):
                np.testing.assert_allclose(np.asarray(g), np.asarray(want), rtol=1e-12, err_msg=f"{path} {how}")


def test_a_read_only_complex128_argument_is_copied_whole(xla_ffi_ops):
    """The runtime's private copy of read-only complex128 memory (16-byte elements) has every element."""
    z, w = (np.array(a) for a in _complex_data())
    for a in (z, w):
        a.flags.writeable = False
    np.testing.assert_allclose(np.asarray(xla_ffi_ops.conj_mul(z, w).asnumpy()), z * np.conj(w) + z * z,
                               rtol=1e-14)
    strided = np.asarray(_complex_data(7)[0])[:, ::2]  # a strided view: copied row by row
    np.testing.assert_allclose(np.asarray(xla_ffi_ops.conj_mul(strided, strided).asnumpy()),
                               strided * np.conj(strided) + strided * strided, rtol=1e-14)


def _takes_the_host_route(fn, function: str, factor: float):
    """to_jax of ``fn`` (factor * x, by a Function that uses ctx->saved_data) says it takes the host custom
    call, naming ``function``, and gives its values and gradient under jit and grad."""
    x = jnp.arange(3.0)
    j = opbuilder.to_jax(types.SimpleNamespace(f=fn))
    assert j.f.route(x) == (f"xla_ffi (host Python): its C++ Function {function} uses ctx->saved_data, "
                            "which holds Python objects; the custom call runs without Python")
    np.testing.assert_array_equal(np.asarray(jax.jit(j.f)(x)), factor * np.arange(3.0))
    np.testing.assert_array_equal(np.asarray(jax.grad(lambda a: j.f(a).sum())(x)), np.full(3, factor))
    return j


def test_saved_data_kept_only_for_a_gradient_takes_the_host_route(xla_ffi_ops):
    """A Function that keeps ctx->saved_data only when NeedGrad says so: the probe runs it as a
    gradient's run does (differentiable inputs require grad), so it sees the use and the call takes the
    host custom call. (The probe ran without grad: the route was xla_ffi, and every gradient raised.)"""
    x = jnp.arange(3.0)
    j = _takes_the_host_route(xla_ffi_ops.saved_data_if_grad, "SavedDataIfGrad", 3.0)
    g = jax.jit(jax.grad(lambda a: j.f(a).sum()))(x)
    np.testing.assert_allclose(np.asarray(g), central(lambda a: float(np.sum(np.asarray(j.f(jnp.asarray(a))))),
                                                      np.arange(3.0)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name, factor", [("saved_data_if_nonzero", 4.0), ("saved_data_in_backward", 5.0)])
def test_saved_data_the_probe_does_not_see_takes_the_gil(xla_ffi_ops, name, factor):
    """A Function that uses ctx->saved_data where to_jax's probe does not look (for non-zero values only:
    the probe runs on zeros; or in Backward only: the probe runs Forward) takes the XLA FFI route. There
    saved_data takes the GIL for each value it converts: jit, grad, value_and_grad and a vjp run twice
    give eager's values, and the gradient matches central differences. (Every such call raised.)"""
    fn = getattr(xla_ffi_ops, name)
    x = jnp.asarray(np.random.default_rng(3).standard_normal((2, 3)))
    w = jnp.asarray(np.random.default_rng(4).standard_normal((2, 3)))
    j = opbuilder.to_jax(types.SimpleNamespace(f=fn))
    assert j.f.route(x) == "xla_ffi"
    eager = np.asarray(fn(np.asarray(x)).asnumpy())
    np.testing.assert_allclose(eager, factor * np.asarray(x), rtol=1e-15)
    np.testing.assert_array_equal(np.asarray(jax.jit(j.f)(x)), eager)
    np.testing.assert_array_equal(np.asarray(j.f(x)), eager)

    def loss(a):
        return (j.f(a) * w).sum()

    want = central(lambda a: float(np.sum(np.asarray(j.f(jnp.asarray(a))) * np.asarray(w))), np.asarray(x))
    for how, g in (("grad", jax.grad(loss)(x)), ("jit(grad)", jax.jit(jax.grad(loss))(x)),
                   ("value_and_grad", jax.jit(jax.value_and_grad(loss))(x)[1])):
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-6, atol=1e-8, err_msg=how)
    out, vjp = jax.vjp(j.f, x)
    np.testing.assert_array_equal(np.asarray(out), eager)
    for _ in range(2):
        np.testing.assert_allclose(np.asarray(vjp(w)[0]), factor * np.asarray(w), rtol=1e-15)


@pytest.mark.parametrize("use", [(1.0, 0.0), (0.0, 1.0), (1.0, 1.0)])
def test_one_tensor_returned_as_two_outputs_gets_two_cotangents(xla_ffi_ops, use):
    """A Forward returning one tensor as two outputs: its Backward gets each output's cotangent in its own
    slot on every route, as in the runtime and torch. (The XLA FFI tape told values apart by object, gave
    both cotangents to the second slot, and Backward's g0 + 10 g1 was silently 10x too large.)"""
    x = jnp.asarray(np.random.default_rng(8).standard_normal(5))
    w = np.random.default_rng(9).standard_normal(5)
    c0, c1 = use
    want = c0 * w + 10 * c1 * w

    def loss(f):
        return lambda a: (c0 * (f(a)[0] * w) + c1 * (f(a)[1] * w)).sum()

    ffi = opbuilder.to_jax(types.SimpleNamespace(f=xla_ffi_ops.dup_out))
    assert ffi.f.route(x) == "xla_ffi"
    cb = opbuilder.to_jax(types.SimpleNamespace(f=xla_ffi_ops.dup_out), ffi=False)
    big = jnp.asarray(np.random.default_rng(10).standard_normal(20000))  # a tape kept by the forward
    wb = np.random.default_rng(11).standard_normal(20000)
    for name, f in (("ffi", ffi.f), ("callback", cb.f)):
        for how, g in (("grad", jax.grad(loss(f))(x)), ("jit(grad)", jax.jit(jax.grad(loss(f)))(x))):
            np.testing.assert_allclose(np.asarray(g), want, rtol=1e-14, err_msg=f"{name} {how}")
        gb = jax.jit(jax.grad(lambda a: (c0 * (f(a)[0] * wb) + c1 * (f(a)[1] * wb) + f(a)[0] ** 2).sum()))(big)
        np.testing.assert_allclose(np.asarray(gb), c0 * wb + 10 * c1 * wb + 2 * np.asarray(big), rtol=1e-12,
                                   err_msg=f"{name} tape")
    t = Tensor(np.asarray(x), requires_grad=True)
    outs = xla_ffi_ops.dup_out(t)
    (outs[0] * Tensor(c0 * w) + outs[1] * Tensor(c1 * w)).sum().backward()
    np.testing.assert_allclose(t.grad.asnumpy(), want, rtol=1e-14, err_msg="runtime")


@pytest.mark.parametrize("n", [6, 20000])
@pytest.mark.parametrize("name", ["saved_data_object_in_backward", "saved_data_handle_in_forward",
                                  "saved_data_object_kept"])
def test_a_saved_tensor_read_as_a_python_object_on_the_ffi_route(xla_ffi_ops, name, n):
    """A tensor kept in saved_data, read back as a Python object (py::object, a borrowed py::handle, or
    stored again as an object) on the XLA FFI route: the object stands for a copy of the tensor (XLA's
    result buffer does not outlive the call), the GIL is kept while the run may still use it, and a
    handle stays valid. (A NaN or garbage gradient at 64 KiB, or a crash.)"""
    rng = np.random.default_rng(13)
    _exp_gives_its_gradient(getattr(xla_ffi_ops, name), jnp.asarray(rng.standard_normal(n)) * 0.5,
                            jnp.asarray(rng.standard_normal(n)))


def _exp_gives_its_gradient(fn, x, w):
    """``fn`` (exp, by a Function keeping its output in saved_data) takes the XLA FFI route, and grad,
    jit(grad) and a vjp run after other XLA work (which reuses XLA's buffers) give exp(x) * w. Returns
    the function as to_jax gives it, the vjp's output and the gradient."""
    want = np.exp(np.asarray(x)) * np.asarray(w)
    j = opbuilder.to_jax(types.SimpleNamespace(f=fn))
    assert j.f.route(x) == "xla_ffi"

    def loss(a):
        return (j.f(a) * w).sum()

    np.testing.assert_allclose(np.asarray(jax.grad(loss)(x)), want, rtol=1e-13)
    np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(loss))(x)), want, rtol=1e-13)
    out, vjp = jax.vjp(j.f, x)
    other = (jnp.ones(x.shape) * 3.0 + w).block_until_ready()  # XLA work between the forward and the backward
    np.testing.assert_allclose(np.asarray(vjp(w)[0]), want, rtol=1e-13)
    assert other.shape == x.shape
    return j, out, want


@pytest.mark.parametrize("n", [6, 20000])  # the function run again for the backward; a tape kept
def test_a_tensor_kept_in_saved_data_outlives_xlas_buffers(xla_ffi_ops, n):
    """A Forward keeping its output in ctx->saved_data (alone, in a list, as an optional; stored before it
    is filled) on the XLA FFI route: the output is built in XLA's result buffer, which XLA reuses after
    the call, while the tape's context lives on. saved_data holds the tensors there, and the handler
    copies them out after the run. (The context read XLA's reused buffer: NaN or another array's values,
    silently; then a copy taken when stored missed what Forward wrote after.)"""
    rng = np.random.default_rng(12)
    x = jnp.asarray(rng.standard_normal(n)) + 0.1
    w = jnp.asarray(rng.standard_normal(n))
    j, out, want = _exp_gives_its_gradient(xla_ffi_ops.saved_data_output, x, w)
    np.testing.assert_allclose(np.asarray(out), np.exp(np.asarray(x)), rtol=1e-15)
    if n == 6:
        np.testing.assert_allclose(want, central(lambda a: float(np.sum(np.asarray(j.f(jnp.asarray(a))) *
                                                                      np.asarray(w))), np.asarray(x)),
                                   rtol=1e-6)


GIL_THREADS = """
import sys
import numpy as np
import jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
import opbuilder
import types
m = opbuilder.CustomOpBuilder("xla_ffi_ops", [sys.argv[1]], include_paths=[jax.ffi.include_dir()],
                              cflags=["-Wall", "-Wextra", "-Werror"], binding=sys.argv[2]).load()
x = jnp.asarray([0.5, -1.5, 2.0])
j = opbuilder.to_jax(types.SimpleNamespace(f=m.saved_data_then_gil_threads))
print(j.f.route(x))
print(np.asarray(jax.jit(j.f)(x)).tolist(), np.asarray(jax.jit(jax.grad(lambda a: j.f(a).sum()))(x)).tolist())
"""


def test_saved_data_gives_the_gil_back_before_threads_apply(xla_ffi_ops, request):
    """A bound function that releases the GIL, keeps a value in saved_data, then joins two threads that
    take the GIL: on the XLA FFI route saved_data kept the GIL to the run's end, and the call waited for
    ever. It takes it for each value now. (Run in a new process: a hang is a timeout, not a stuck test
    session.)"""
    import subprocess
    import sys
    binding = request.node.callspec.params["xla_ffi_ops"]
    res = subprocess.run([sys.executable, "-c", GIL_THREADS, str(CPP / "xla_ffi_ops.cpp"), binding],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.splitlines()
    assert lines[0] == "xla_ffi"
    x = np.array([0.5, -1.5, 2.0])
    assert lines[1] == f"{(4 * x).tolist()} {[4.0, 4.0, 4.0]}"


def test_applies_on_other_threads_take_the_host_route(xla_ffi_ops):
    """A bound function whose Applies run on threads it starts: an XLA FFI handler runs and records only
    its own thread's Applies, so the others' gradients were lost (zero, silently). to_jax's probe sees
    Applies from other threads now, and the call takes the host route, whose gradient is eager's."""
    x = jnp.asarray([0.5, -1.5, 2.0])
    j = opbuilder.to_jax(types.SimpleNamespace(f=xla_ffi_ops.apply_on_threads))
    assert j.f.route(x) == ("xla_ffi (host Python): its C++ function runs SavedDataInBackward on another "
                            "thread, whose Applies no XLA FFI handler records")
    xs = np.asarray(x)
    np.testing.assert_allclose(np.asarray(jax.jit(j.f)(x)), 25 * xs * xs, rtol=1e-15)
    want = central(lambda a: float(np.sum(np.asarray(j.f(jnp.asarray(a))))), xs)
    np.testing.assert_allclose(want, 50 * xs, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(lambda a: j.f(a).sum()))(x)), 50 * xs, rtol=1e-14)
    t = Tensor(xs, requires_grad=True)
    xla_ffi_ops.apply_on_threads(t).sum().backward()
    np.testing.assert_allclose(t.grad.asnumpy(), 50 * xs, rtol=1e-14)


def test_saved_data_on_the_ffi_route_from_threads(xla_ffi_ops):
    """saved_data taking the GIL on XLA's thread while other Python threads run the same jitted gradient:
    every thread gets the right gradient, and none waits for ever."""
    import threading
    j = opbuilder.to_jax(types.SimpleNamespace(f=xla_ffi_ops.saved_data_if_nonzero))
    step = jax.jit(jax.grad(lambda a: (j.f(a) * a).sum()))
    x = jnp.asarray(np.random.default_rng(5).standard_normal(7))
    want = 8.0 * np.asarray(x)
    results, errors = [], []

    def run():
        try:
            for _ in range(25):
                results.append(np.asarray(step(x)))
        except Exception as e:  # reported below, with the thread's error
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread is still waiting"
    assert errors == []
    assert len(results) == 100
    for r in results:
        np.testing.assert_allclose(r, want, rtol=1e-14)


def _saved_data_gives_its_values(f, factor: float) -> None:
    """``f`` (factor * x, by a Function that uses ctx->saved_data), under jit, grad and jit(grad): its
    values, and a gradient that matches central differences."""
    x = jnp.asarray(np.random.default_rng(6).standard_normal(4))
    w = jnp.asarray(np.random.default_rng(7).standard_normal(4))
    np.testing.assert_allclose(np.asarray(jax.jit(f)(x)), factor * np.asarray(x), rtol=1e-15)

    def loss(a):
        return (f(a) * w).sum()

    want = central(lambda a: float(np.sum(np.asarray(f(jnp.asarray(a))) * np.asarray(w))), np.asarray(x))
    np.testing.assert_allclose(want, factor * np.asarray(w), rtol=1e-6)
    for g in (jax.grad(loss)(x), jax.jit(jax.grad(loss))(x)):
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-6, atol=1e-8)


def test_saved_data_on_the_generic_route(xla_ffi_ops):
    """Without its capsules (to_jax's generic handlers): a Function that uses ctx->saved_data is found in
    the probe's run (no shape rule: the run is made anyway) and takes the host custom call (the
    callback's code, with Python), saying why. With a shape rule the probe does not run it: the call
    takes the XLA FFI route, where saved_data takes the GIL, with the same values. (It raised there.)"""
    x = jnp.arange(3.0)
    _takes_the_host_route(xla_ffi_ops.saved_data, "SavedData", 2.0)
    ruled = opbuilder.to_jax(_callback_twin(xla_ffi_ops))
    assert ruled.saved_data.route(x) == "xla_ffi"
    _saved_data_gives_its_values(ruled.saved_data, 2.0)


def test_saved_data_in_an_xla_handler_takes_the_gil(xla_ffi_ops):
    """ctx->saved_data holds Python objects; an OB_XLA_FFI handler runs without the GIL, so saved_data takes
    it for each value: the same values as the callback path. (It was a named error.)"""
    j = _both(xla_ffi_ops)
    assert j["ffi"].saved_data.route(jnp.arange(3.0)) == "xla_ffi: the module's OB_XLA_FFI handlers"
    _saved_data_gives_its_values(j["ffi"].saved_data, 2.0)
    _saved_data_gives_its_values(j["callback"].saved_data, 2.0)


def test_int64_outputs_with_x64_off_are_int32_as_jnp_gives(xla_ffi_ops):
    """JAX's default (x64 off): a 64-bit output comes back as its 32-bit twin on both paths."""
    ops = _both(xla_ffi_ops)
    jax.config.update("jax_enable_x64", False)
    try:
        x = jnp.ones((2, 3), jnp.float32)
        want = jnp.arange(6).reshape(2, 3)
        assert want.dtype == jnp.int32
        for path, o in ops.items():
            for how, fn in (("eager", o.positions), ("jit", jax.jit(o.positions))):
                got = fn(x)
                assert got.dtype == jnp.int32, (path, how)
                np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=f"{path} {how}")
    finally:
        jax.config.update("jax_enable_x64", True)
    # with x64 on, the FFI path keeps int64 and runs the custom call
    got = jax.jit(ops["ffi"].positions)(jnp.ones(3))
    assert got.dtype == jnp.int64
    assert ".positions.fwd" in jax.jit(ops["ffi"].positions).lower(jnp.ones(3)).as_text()


# ---- issue 33 #2: a Function taking views never writes XLA's buffers -------------------------------

def test_an_in_place_write_by_a_function_taking_views_gives_one_answer_on_both_paths(xla_ffi_ops):
    """A kAcceptsViews Function whose kernel writes its input through data_ptr() and marks it dirty,
    without to_jax's mutates: on both paths it writes a private copy and returns its values (issue 33:
    the FFI path refused it, the callback path ran it), and the caller's jax.Array keeps its values,
    eagerly, under jit, under jax.grad and jax.vjp, and in the gradient's rerun of Forward."""
    x0 = np.arange(1.0, 5.0)
    x = jnp.asarray(x0)
    for path, j in _both(xla_ffi_ops).items():
        for _ in range(2):  # the first call of the type and a later one
            for f in (j.scale_views, jax.jit(j.scale_views), j.scale_views_when_grad,
                      jax.jit(j.scale_views_when_grad)):
                np.testing.assert_array_equal(np.asarray(f(x)), 3 * x0, err_msg=path)
                np.testing.assert_array_equal(np.asarray(x), x0, err_msg=path)
            out, same = jax.jit(lambda a, j=j: (j.scale_views(a), a * 1))(x)
            np.testing.assert_array_equal(np.asarray(out), 3 * x0, err_msg=path)
            np.testing.assert_array_equal(np.asarray(same), x0, err_msg=path)
            for name in ("scale_views", "scale_views_when_grad"):  # the latter writes only in the rerun
                op = getattr(j, name)
                for g in (jax.grad(lambda a, op=op: (op(a) * a).sum()), jax.jit(jax.grad(lambda a, op=op: (op(a) * a).sum()))):
                    np.testing.assert_allclose(np.asarray(g(x)), central(lambda a: float(np.sum(3 * a * a)), x0),
                                               rtol=1e-6, atol=1e-6, err_msg=f"{path} {name}")
                    np.testing.assert_array_equal(np.asarray(x), x0, err_msg=path)
                out, vjp = jax.vjp(op, x)
                np.testing.assert_array_equal(np.asarray(vjp(jnp.ones(4))[0]), np.full(4, 3.0), err_msg=path)
                np.testing.assert_array_equal(np.asarray(out), 3 * x0, err_msg=path)
                np.testing.assert_array_equal(np.asarray(x), x0, err_msg=path)
    # declared, the same write is XLA's aliasing (no copy of the handler's own): still not the caller's array
    m = opbuilder.to_jax(xla_ffi_ops, shape_fn=_RULES, mutates={"scale_views": [0]})
    for f in (m.scale_views, jax.jit(m.scale_views)):
        np.testing.assert_array_equal(np.asarray(f(x)), 3 * x0)
        np.testing.assert_array_equal(np.asarray(x), x0)


def test_a_function_taking_views_that_writes_only_for_some_values_runs_again_on_a_copy(xla_ffi_ops):
    """A kAcceptsViews type seen writing nothing gets XLA's read-only buffer; when a later call marks it
    dirty (it writes only for some values, honouring is_writable()), the handler runs it again on a
    private copy: the answer of the callback path, and the caller's array untouched, eagerly, under
    jit and in the gradient's rerun (this test must be the op's first user in the session)."""
    pos0, neg0 = np.arange(1.0, 5.0), -np.arange(1.0, 5.0)
    pos, neg = jnp.asarray(pos0), jnp.asarray(neg0)
    for path, j in _both(xla_ffi_ops).items():
        op = j.scale_views_if_negative
        for f in (op, jax.jit(op)):
            np.testing.assert_array_equal(np.asarray(f(pos)), 3 * pos0, err_msg=path)  # writes nothing
            np.testing.assert_array_equal(np.asarray(f(neg)), 3 * neg0, err_msg=path)  # marks x dirty
            np.testing.assert_array_equal(np.asarray(neg), neg0, err_msg=path)
            np.testing.assert_array_equal(np.asarray(f(pos)), 3 * pos0, err_msg=path)
        g = jax.jit(jax.grad(lambda a, op=op: (op(a) * a).sum()))
        np.testing.assert_allclose(np.asarray(g(neg)), central(lambda a: float(np.sum(3 * a * a)), neg0),
                                   rtol=1e-6, atol=1e-6, err_msg=path)
        np.testing.assert_array_equal(np.asarray(neg), neg0, err_msg=path)


def test_a_write_without_mark_dirty_by_a_function_taking_views_leaves_the_callers_array(xla_ffi_ops):
    """A kAcceptsViews Function that overwrites its input without MarkDirty writes a private copy, on
    every call after the first too (the type was seen to write; an empty call before shows nothing
    either way); a gradient (which records) refuses it
    with the runtime's message. The caller's array keeps its values, in and out of jit."""
    j = opbuilder.to_jax(xla_ffi_ops, shape_fn=_RULES)
    # its first call (this test is the op's first user) writes nothing, being empty: that shows nothing
    assert j.triple_scratch_views(jnp.zeros((0,))).shape == (0,)
    x0 = np.arange(1.0, 5.0)
    x = jnp.asarray(x0)
    for f in (j.triple_scratch_views, jax.jit(j.triple_scratch_views)):
        for _ in range(3):
            np.testing.assert_array_equal(np.asarray(f(x)), 3 * x0)
            np.testing.assert_array_equal(np.asarray(x), x0)
    out, same = jax.jit(lambda a: (j.triple_scratch_views(a), a + 0))(x)
    np.testing.assert_array_equal(np.asarray(out), 3 * x0)
    np.testing.assert_array_equal(np.asarray(same), x0)
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=r"TripleScratchViews::Forward modified argument 0 in place without MarkDirty; mark it "
                             r"\(ctx->MarkDirty\(\{tensor\}\)\) and return it, or write the result to a new tensor"):
        jax.jit(jax.grad(lambda a: (j.triple_scratch_views(a) * a).sum()))(x).block_until_ready()
    np.testing.assert_array_equal(np.asarray(x), x0)


def test_a_function_taking_views_that_writes_nothing_gets_xlas_buffer_after_its_first_call(xla_ffi_ops):
    """The copies cost only while the type may write: its first call (this test must be the op's first
    user in the session) reads a private copy; having written nothing, later calls read XLA's buffer
    itself (here the caller's array, passed through), eagerly and under jit."""
    j = opbuilder.to_jax(xla_ffi_ops, shape_fn=_RULES)
    x = jnp.arange(4.0)
    where = float(x.unsafe_buffer_pointer())
    assert float(j.input_address(x)) != where  # a copy: the type is not yet known to write nothing
    for f in (j.input_address, jax.jit(j.input_address)):
        for _ in range(2):
            assert float(f(x)) == where


def test_a_backward_taking_views_that_writes_its_cotangent_leaves_xlas_cotangent(xla_ffi_ops):
    """A kAcceptsViews Function whose Backward triples the cotangent in place and returns it: it gets a
    private copy (its type writes), so the caller's cotangent array, and a cotangent XLA builds inside
    a jitted gradient (a constant of ones), keep their values from call to call."""
    j = opbuilder.to_jax(xla_ffi_ops, shape_fn=_RULES)
    x = jnp.arange(1.0, 5.0)
    ct0 = np.array([1.0, -2.0, 0.5, 4.0])
    ct = jnp.asarray(ct0)
    out, vjp = jax.vjp(j.triple_grad_in_place, x)
    np.testing.assert_array_equal(np.asarray(out), 3 * np.arange(1.0, 5.0))
    for _ in range(3):
        (gx,) = vjp(ct)
        np.testing.assert_array_equal(np.asarray(gx), 3 * ct0)
        np.testing.assert_array_equal(np.asarray(ct), ct0)
    g = jax.jit(jax.grad(lambda a: j.triple_grad_in_place(a).sum()))
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(g(x)), np.full(4, 3.0))
    np.testing.assert_array_equal(np.asarray(x), np.arange(1.0, 5.0))

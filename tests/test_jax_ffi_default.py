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
import runtime as rt  # noqa: E402

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
    assert "opbuilder.ffi.bound_forward" in text and "callback" not in text
    grad_text = jax.jit(jax.grad(lambda a, b: j.mul(a, b).sum())).lower(x, y).as_text()
    assert "opbuilder.ffi.bound_backward" in grad_text and "callback" not in grad_text


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


def test_a_plain_bound_function_runs_as_the_generic_custom_call(api_ops):
    """tests/cpp/tensor_api_ops.cpp's contiguous is a plain kernel, not a Function: the generic custom
    call runs it whole, in C++, as any C++ module function of tensors; an output that is its input
    unchanged passes the gradient through, as in eager and on the callback."""
    j = opbuilder.to_jax(types.SimpleNamespace(contiguous=api_ops.contiguous))
    x, _ = _data((2, 3))
    assert j.contiguous.route(x) == "xla_ffi"
    text = jax.jit(j.contiguous).lower(x).as_text()
    assert "opbuilder.ffi.bound_forward" in text and "callback" not in text
    np.testing.assert_array_equal(np.asarray(jax.jit(j.contiguous)(x)), np.asarray(x))
    np.testing.assert_array_equal(np.asarray(jax.vmap(j.contiguous)(jnp.stack([x, 2 * x]))),
                                  np.stack([np.asarray(x), 2 * np.asarray(x)]))
    cb = opbuilder.to_jax(types.SimpleNamespace(contiguous=api_ops.contiguous), ffi=False)
    for f in (jax.grad(lambda a: j.contiguous(a).sum()), jax.jit(jax.grad(lambda a: j.contiguous(a).sum()))):
        np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(jax.grad(lambda a: cb.contiguous(a).sum())(x)))


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
    assert j.twice.route(x, y) == ("xla_ffi (host Python): it is not one C++ module function (it ran bound mul, "
                                   "bound mul)")
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


def test_an_error_in_the_custom_call_reaches_the_caller(api_ops):
    """A lying shape rule: the custom call refuses to write a result of another shape, on the host route
    (a Python function over the C++ one) and on the C++ one, naming the function."""
    rule = {"contiguous": lambda a: opbuilder.Spec((7,), a.dtype)}
    j = opbuilder.to_jax(types.SimpleNamespace(contiguous=lambda a: api_ops.contiguous(a)), shape_fn=rule)
    x, _ = _data((2, 3))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"RuntimeError: result 0 has shape \(2, 3\) and dtype "
                                                         r"float64, but XLA expects shape \(7,\) and dtype float64"):
        jax.jit(j.contiguous)(x).block_until_ready()
    j = opbuilder.to_jax(types.SimpleNamespace(contiguous=api_ops.contiguous), shape_fn=rule)
    assert j.contiguous.route(x) == "xla_ffi"
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"^INTERNAL: to_jax \(XLA FFI forward\): contiguous: output "
                                                         r"0 has shape \[2, 3\] and dtype float64, but XLA expects "
                                                         r"shape \[7\] and dtype float64 \(from its shape rule, "
                                                         r"InferShape or to_jax's shape_fn;"):
        jax.jit(j.contiguous)(x).block_until_ready()


def test_the_function_runs_once_per_signature_at_trace_time_and_never_from_python_after(my_ops):
    """The probe: one call of the module function per signature, on zeros, shape rule or not (as a
    tracer, which sees the C++ function's call); every later call, eager or jitted, forward or
    backward, runs the custom call without calling Python. A Python function over the C++ one could
    pick what it runs by a value where no handler sees it: it runs as itself (the host route)."""
    calls = []

    def mul(*a):
        calls.append(a)
        return my_ops.mul(*a)
    for rule in (None, {"mul": lambda a, b: opbuilder.Spec(a.shape, a.dtype)}):
        calls.clear()
        j = opbuilder.to_jax(types.SimpleNamespace(mul=mul, cmul=my_ops.mul),
                             shape_fn=rule and {"mul": rule["mul"], "cmul": rule["mul"]})
        x, y = _data()
        np.testing.assert_array_equal(np.asarray(j.cmul(x, y)), np.asarray(x) * np.asarray(y))
        assert j.cmul.route(x, y) == "xla_ffi"
        assert j.mul.route(x, y) == ("xla_ffi (host Python): it is a Python function over the C++ function mul, "
                                     "which could pick what it runs by a value; pass the module's function itself")
        n = len(calls)
        jax.jit(jax.grad(lambda a, b: j.cmul(a, b).sum()))(y, x).block_until_ready()
        j.cmul(y, x).block_until_ready()
        assert len(calls) == n
        jax.jit(j.mul)(y, x).block_until_ready()
        assert len(calls) == n + 1


def test_ffi_must_be_a_bool(my_ops):
    with pytest.raises(TypeError, match=r"^to_jax: ffi must be True or False, got str$"):
        opbuilder.to_jax(my_ops, ffi="no")


# ---- a bound function that does more than one Apply runs whole in C++ (attack on 7d7ce5e) -----------
@pytest.fixture(scope="module")
def probe_ops(cache_dir):
    from op_util import CPP, load_op
    return load_op("jax_probe_ops", [CPP / "jax_probe_ops.cpp"])


@pytest.mark.parametrize("name, args", [
    ("pick", ([1.0, -2.0], [0.0])),
    ("pick", ([1.0, -2.0], [1.0])),
    ("post", ([1.0, -2.0], [1.0, 1.0])),
    ("pre", ([1.0, -2.0], [1.0, 1.0])),
])
def test_work_outside_apply_runs_with_the_function(probe_ops, name, args):
    """The C++ custom call runs the whole bound function: one that picks its Function by a value, or
    does work before or after Apply, has the callback's values and gradients. (Had the custom call run
    the Function alone, these gave [2, -4] for pick(x, [0]), x for post, and a clamp lost; 7d7ce5e kept
    them on the host route.)"""
    j, cb = opbuilder.to_jax(probe_ops), opbuilder.to_jax(probe_ops, ffi=False)
    xs = [jnp.asarray(np.array(a, np.float64)) for a in args]
    assert getattr(j, name).route(*xs) == "xla_ffi"
    for f in (getattr(j, name), jax.jit(getattr(j, name))):
        np.testing.assert_array_equal(np.asarray(f(*xs)), np.asarray(getattr(cb, name)(*xs)))
    g = jax.grad(lambda a: getattr(j, name)(a, xs[1]).sum())(xs[0])
    gc = jax.grad(lambda a: getattr(cb, name)(a, xs[1]).sum())(xs[0])
    np.testing.assert_array_equal(np.asarray(g), np.asarray(gc))
    assert probe_ops.plain is not None and j.plain.route(*xs) == "xla_ffi"


# ---- a Function picked by the call's values: the generic custom call runs the whole function ----------
def _sq(x):
    return x * x


_PICKS = {
    # name: (arguments, value, gradient of sum(value) for each argument)
    "over_100": ([[200.0, 1.0, -2.0]], lambda x: x * x, lambda x: [2 * x]),
    "over_100 low": ([[3.0, 1.0, -2.0]], lambda x: 3 * x, lambda x: [3 + 0 * x]),
    "by_product_sign": ([[2.0, 1.0, -2.0], [-1.0, 4.0, 0.5]], lambda x, y: x * y, lambda x, y: [y, x]),
    "by_product_sign same": ([[2.0, 1.0, -2.0], [1.0, 4.0, 0.5]], lambda x, y: x + y,
                             lambda x, y: [1 + 0 * x, 1 + 0 * y]),
    "by_mean": ([[5.0, 1.0, -2.0]], lambda x: x * x, lambda x: [2 * x]),
    "by_mean low": ([[-5.0, 1.0, -2.0]], lambda x: 3 * x, lambda x: [3 + 0 * x]),
    "chain_pick": ([[200.0, 1.0, -2.0]], lambda x: 3 * x * x, lambda x: [6 * x]),
    "inplace_pick": ([[200.0, 1.0, -2.0]], lambda x: 4 * x * x, lambda x: [8 * x]),
}


@pytest.fixture(params=["tape", "rerun"])
def tape_mode(request, monkeypatch):
    """The backward with the forward's tape (inputs from _TAPE_FROM bytes on; 0 here), or, for smaller
    inputs, running the function again."""
    from opbuilder.bridges import interop_jax_ffi
    monkeypatch.setattr(interop_jax_ffi, "_TAPE_FROM", 0 if request.param == "tape" else 1 << 40)
    return request.param


@pytest.mark.parametrize("case", sorted(_PICKS))
def test_a_function_picked_by_a_value_gives_eagers_values_and_gradients(probe_ops, case, tape_mode):
    """A bound function that picks its Function by the call's values (one no probe value reaches, the
    sign of a product, a threshold on the mean; one Apply or two; an in-place one) has the value and
    gradient eager and the callback give, eager and under jax.jit, and the caller's arrays are never
    written. (On 90b029d the custom call ran the Function the probe's values picked: over_100 gave 3x
    for x[0] = 200, by_product_sign x + y for a negative product.)"""
    name = case.split()[0]
    args, value, grads = _PICKS[case]
    j, cb = opbuilder.to_jax(probe_ops), opbuilder.to_jax(probe_ops, ffi=False)
    xs = [jnp.asarray(np.array(a, np.float64)) for a in args]
    keep = [np.array(x) for x in xs]
    want = value(*[np.array(a, np.float64) for a in args])
    want_g = grads(*[np.array(a, np.float64) for a in args])
    f, fc = getattr(j, name), getattr(cb, name)
    argnums = tuple(range(len(xs)))
    for wrap in (lambda g: g, jax.jit):
        np.testing.assert_array_equal(np.asarray(wrap(f)(*xs)), want)
        np.testing.assert_array_equal(np.asarray(wrap(fc)(*xs)), want)
        g = wrap(jax.grad(lambda *a: f(*a).sum(), argnums=argnums))(*xs)
        gc = wrap(jax.grad(lambda *a: fc(*a).sum(), argnums=argnums))(*xs)
        for a, b, w in zip(g, gc, want_g):
            np.testing.assert_array_equal(np.asarray(a), w)
            np.testing.assert_array_equal(np.asarray(b), w)
    for x, k in zip(xs, keep):
        np.testing.assert_array_equal(np.asarray(x), k)
    assert f.route(*xs) == "xla_ffi"


def test_the_backward_uses_the_forwards_tape_and_the_table_stays_bounded(probe_ops, monkeypatch):
    """The forward JAX differentiates keeps its Applies' contexts (a tape) for the backward, named by a
    token result; each backward takes its tape, so a gradient step leaves none. A pullback never
    called leaves its tape until the table's bound (1024) drops the oldest; a pullback whose tape is
    gone, or that runs twice, runs the function again, with the same gradient."""
    from opbuilder.bridges import interop_jax_ffi
    monkeypatch.setattr(interop_jax_ffi, "_TAPE_FROM", 0)  # a tape for 3 elements too
    j = opbuilder.to_jax(probe_ops)
    x = jnp.asarray(np.array([200.0, 1.0, -2.0]))
    pending = interop_jax_ffi._generic["module"].pending_tapes
    before = pending()
    for f in (jax.grad(lambda a: j.chain_pick(a).sum()), jax.jit(jax.grad(lambda a: j.chain_pick(a).sum()))):
        np.testing.assert_array_equal(np.asarray(f(x)), 6 * np.asarray(x))
    assert pending() == before
    for _ in range(1100):
        _, pull = jax.vjp(j.chain_pick, x)
    assert pending() == 1024
    for _ in range(2):  # the tape, then a run of the function again
        np.testing.assert_array_equal(np.asarray(pull(jnp.ones(3))[0]), 6 * np.asarray(x))
    assert pending() == 1023
    np.testing.assert_array_equal(np.asarray(jax.jacrev(j.chain_pick)(x)), np.diag(6 * np.asarray(x)))


def test_vmap_of_grad_and_remat_pick_per_element(probe_ops, tape_mode):
    """vmap runs the custom calls once per element (each with its own token), so each element picks its
    own Function; jax.checkpoint runs the forward again for its tape."""
    j, cb = opbuilder.to_jax(probe_ops), opbuilder.to_jax(probe_ops, ffi=False)
    x = jnp.asarray(np.array([200.0, 1.0, -2.0]))
    xs = jnp.stack([x, -x, 2 * x])
    for name in ("over_100", "chain_pick", "inplace_pick"):
        loss = {k: (lambda a, f=getattr(v, name): f(a).sum()) for k, v in (("ffi", j), ("cb", cb))}
        want = jax.vmap(jax.grad(loss["cb"]))(xs)
        np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(jax.grad(loss["ffi"])))(xs)), np.asarray(want))
        np.testing.assert_array_equal(np.asarray(jax.jit(jax.grad(jax.checkpoint(loss["ffi"])))(x)),
                                      np.asarray(want[0]))


def test_complex_gradients_follow_jaxs_convention_on_the_whole_function_route(probe_ops):
    """MulC's Backward is torch's (g * conj(y)); the handlers conjugate the cotangent in and the
    gradients out, so jax.grad equals jnp's."""
    j = opbuilder.to_jax(probe_ops)
    r = np.random.default_rng(0)
    z, w = (jnp.asarray(r.standard_normal(3) + 1j * r.standard_normal(3)) for _ in range(2))
    assert j.cmul.route(z, w) == "xla_ffi"
    got = jax.jit(jax.grad(lambda a, b: jnp.abs(j.cmul(a, b) * (1 + 2j)).sum(), argnums=(0, 1)))(z, w)
    want = jax.grad(lambda a, b: jnp.abs(a * b * (1 + 2j)).sum(), argnums=(0, 1))(z, w)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-13)


def test_an_error_in_the_function_is_the_callers_error(probe_ops):
    """The function throws inside the handler (no Python): the call fails with its message, forward and
    backward, eager and jitted; nothing is left in the tape table."""
    from opbuilder.bridges import interop_jax_ffi
    j = opbuilder.to_jax(probe_ops)
    x = -jnp.asarray(np.array([200.0, 1.0, -2.0]))
    assert interop_jax_ffi.generic_targets()[0] is not None  # built (a test run alone had not built it yet)
    pending = interop_jax_ffi._generic["module"].pending_tapes
    before = pending()
    # (the backward's run of the function where XLA dropped the forward custom call, the loss not reading
    # its output: named forward, as the error is Forward's)
    msg = r"^INTERNAL: to_jax \(XLA FFI forward\): raises: x\[0\] must not be negative"
    for f in (j.raises, jax.jit(j.raises), jax.grad(lambda a: j.raises(a).sum()),
              jax.jit(jax.grad(lambda a: j.raises(a).sum()))):
        with pytest.raises(jax.errors.JaxRuntimeError, match=msg):
            jax.block_until_ready(f(x))
    assert pending() == before
    np.testing.assert_array_equal(np.asarray(jax.jit(j.raises)(-x)), -3 * np.asarray(x))


def test_an_error_in_backward_names_the_function(probe_ops):
    """A Backward that throws inside the backward handler: the message names its Function, as a Forward's
    error does (it gave the bare message)."""
    j = opbuilder.to_jax(probe_ops)
    x = jnp.asarray(np.array([1.0, 2.0]))
    for g in (jax.grad(lambda a: (j.refusing_big(a) * 1000.0).sum()),
              jax.jit(jax.grad(lambda a: (j.refusing_big(a) * 1000.0).sum()))):
        with pytest.raises(jax.errors.JaxRuntimeError, match=r"^INTERNAL: to_jax \(XLA FFI backward\): "
                                                             r"TripleRefusingBig: the cotangent is over 100"):
            jax.block_until_ready(g(x))
    g = jax.jit(jax.grad(lambda a: j.refusing_big(a).sum()))
    np.testing.assert_array_equal(np.asarray(g(x)), np.full(2, 3.0))


def test_a_write_after_calls_that_wrote_nothing_runs_on_copies(probe_ops, tape_mode):
    """After calls that wrote nothing, a call whose Function marks its argument dirty (here one whose
    result is not used: the function reads the argument itself after) still writes a private copy:
    eager's value, and the caller's array unchanged."""
    j, cb = opbuilder.to_jax(probe_ops), opbuilder.to_jax(probe_ops, ffi=False)
    low, high = (jnp.asarray(np.array(a, np.float64)) for a in ([3.0, 1.0, -2.0], [200.0, 1.0, -2.0]))
    f = jax.jit(j.inplace_late)
    for _ in range(2):
        np.testing.assert_array_equal(np.asarray(f(low)), 3 * np.asarray(low))
    for g in (f, j.inplace_late, cb.inplace_late):
        np.testing.assert_array_equal(np.asarray(g(high)), 4 * np.asarray(high) ** 2)
    np.testing.assert_array_equal(np.asarray(high), [200.0, 1.0, -2.0])
    gj = jax.jit(jax.grad(lambda a: j.inplace_late(a).sum()))
    np.testing.assert_array_equal(np.asarray(gj(high)), 8 * np.asarray(high))
    np.testing.assert_array_equal(np.asarray(gj(low)), np.full(3, 3.0))


@pytest.mark.parametrize("jit", [False, True])
def test_a_prologue_writing_on_some_values_never_writes_the_callers_array(probe_ops, jit):
    """pre clamps negatives in place before its Apply. Calls on positives write nothing; a later call on
    a negative still writes a private copy: the caller's jax.Array is immutable (attack on 4ab5842,
    which handed XLA's memory to a function once its calls had written nothing)."""
    j, cb = opbuilder.to_jax(probe_ops), opbuilder.to_jax(probe_ops, ffi=False)
    f = jax.jit(j.pre) if jit else j.pre
    y = jnp.asarray(np.ones(2))
    for k in range(3):
        x = jnp.asarray(np.array([1.0 + k, 2.0]))
        np.testing.assert_array_equal(np.asarray(f(x, y)), [1.0 + k, 2.0])
    x = jnp.asarray(np.array([-1.0, 2.0]))
    np.testing.assert_array_equal(np.asarray(f(x, y)), np.asarray(cb.pre(x, y)))
    np.testing.assert_array_equal(np.asarray(f(x, y)), [0.0, 2.0])
    np.testing.assert_array_equal(np.asarray(x), [-1.0, 2.0])
    np.testing.assert_array_equal(np.asarray(x * 10.0), [-10.0, 20.0])


@pytest.mark.parametrize("ffi", [True, False])
def test_an_output_shape_that_depends_on_the_values_is_a_named_error(probe_ops, ffi):
    """positives keeps x's positive elements: no shape JAX could be given. A run on zeros gave an empty
    output, which XLA skips, so the call returned [] (attack on c9aaa0f, both routes); now each call
    is a named error, under jax.jit too."""
    f = getattr(opbuilder.to_jax(probe_ops, ffi=ffi), "positives")
    x = jnp.asarray(np.array([1.0, -2.0, 3.0]))
    want = (r"to_jax: positives's output shapes depend on its inputs' values \(\[[03]\] on one run, \[[03]\] on "
            r"another, for inputs of shapes \[3\]\); JAX needs them fixed by the input shapes: give to_jax a "
            r"shape_fn for 'positives', or call it outside jax")
    for g in (f, jax.jit(f), f):
        with pytest.raises(ValueError, match=want):
            g(x)
    np.testing.assert_array_equal(np.asarray(probe_ops.positives(rt.Tensor(np.asarray(x))).asnumpy()), [3.0, 9.0])


@pytest.mark.parametrize("ffi", [True, False])
def test_only_empty_outputs_from_non_empty_inputs_are_refused_without_a_shape_rule(probe_ops, ffi):
    """above_ten keeps x's elements over 10: every stand-in value to_jax runs it on is below, so each run
    gave [0], and XLA skips a call whose results are all empty: [60, 90] came back [] on both routes,
    eager and jitted (attack on 30a3d5f). Now a named error; with a shape rule its shapes are trusted."""
    x = jnp.asarray(np.array([1.0, 20.0, 30.0, 2.0]))
    f = opbuilder.to_jax(probe_ops, ffi=ffi).above_ten
    want = (r"^to_jax: above_ten returned only empty outputs \(\[0\]\) for non-empty inputs of shapes \[4\] on "
            r"every run on stand-in values; XLA skips a call whose results are all empty, so an output shape "
            r"that depends on the values would come back empty: give to_jax a shape_fn for 'above_ten' \(its "
            r"shapes are trusted\)")
    for g in (f, jax.jit(f), f):
        with pytest.raises(ValueError, match=want):
            g(x)
    np.testing.assert_array_equal(np.asarray(probe_ops.above_ten(rt.Tensor(np.asarray(x))).asnumpy()), [60.0, 90.0])
    two = opbuilder.to_jax(probe_ops, ffi=ffi, shape_fn={"above_ten": lambda a: opbuilder.Spec((2,), a.dtype)})
    np.testing.assert_array_equal(np.asarray(jax.jit(two.above_ten)(x)), [60.0, 90.0])


def test_an_output_shape_the_run_on_zeros_gave_is_not_blamed_on_a_shape_rule(probe_ops):
    """distinct has one element on zeros and three on these values, and no shape rule: the custom call
    refused to write it, blaming "InferShape or to_jax's shape_fn", neither of which was given (attack on
    30a3d5f); the message names the run on zeros and what to give."""
    x = jnp.asarray(np.array([1.0, 2.0, 2.0, 3.0]))
    f = opbuilder.to_jax(probe_ops).distinct
    assert f.route(x) == "xla_ffi"
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"distinct: output 0 has shape \[3\] and dtype float64, but "
                                                         r"XLA expects shape \[1\] and dtype float64 \(from its shape "
                                                         r"rule, InferShape or to_jax's shape_fn; without one, from its "
                                                         r"run on zeros of these input shapes: an output shape that "
                                                         r"depends on the input values needs a shape rule\)"):
        jax.jit(f)(x).block_until_ready()


def test_inputs_from_64_kib_get_a_tape_and_smaller_ones_run_again(probe_ops):
    """The forward JAX differentiates returns a token (one more result) from _TAPE_FROM bytes of inputs;
    below, it is the plain forward (XLA may drop it) and the backward runs the function again."""
    j = opbuilder.to_jax(probe_ops)
    for n, token in ((3, False), (1 << 13, True)):
        x = jnp.asarray(np.linspace(1.0, 2.0, n))
        text = jax.jit(jax.grad(lambda a: (j.chain_pick(a) ** 2).sum())).lower(x).as_text()
        assert ("record = 1" in text) == token
        np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(lambda a: (j.chain_pick(a) ** 2).sum()))(x)),
                                   18 * np.asarray(x), rtol=1e-14)


DOUBLE = ("mul: double backward through an opbuilder operator is not supported: its Backward is "
          "once-differentiable (create_graph=True, then a gradient of the gradient)")


@pytest.mark.parametrize("ffi", [True, False], ids=["xla_ffi", "callback"])
@pytest.mark.parametrize("shape", [(3, 4), (96, 96)], ids=["rerun", "taped"])  # 96*96*8 B: over _TAPE_FROM
def test_a_gradient_of_a_gradient_is_the_runtimes_named_error_on_every_jax_route(my_ops, ffi, shape):
    """As eager and to_torch raise it (its Backward records no graph); JAX's own errors differed by route."""
    j = opbuilder.to_jax(my_ops, ffi=ffi)
    x, y = _data(shape)
    first = lambda a: jax.grad(lambda b: (j.mul(b, y) ** 2).sum())(a)
    np.testing.assert_allclose(np.asarray(first(x)), 2 * np.asarray(x) * np.asarray(y) ** 2, rtol=1e-13)
    for second in (jax.grad(lambda a: first(a).sum()), jax.jit(jax.grad(lambda a: first(a).sum())),
                   jax.jacrev(jax.grad(lambda a: (j.mul(a, y) ** 2).sum()))):
        with pytest.raises(RuntimeError) as e:
            second(x)
        assert str(e.value).splitlines()[0] == DOUBLE  # (JAX adds a note on its filtered traceback below)


# ---- the generic custom call lends the function XLA's input memory (tensor_details.h LentScope) ------
def test_a_function_that_declares_it_writes_no_argument_reads_the_callers_array_in_place(probe_ops):
    """A kConstArgs Function's Forward gets the jax.Array's own memory, read-only: no copy, from the
    first call. A body that reads x itself first gets its own private copy, which Forward then gets."""
    j = opbuilder.to_jax(probe_ops)
    x = jnp.asarray(np.arange(4.0))
    f = jax.jit(j.address)
    for _ in range(3):
        assert np.asarray(f(x)).tolist() == [x.unsafe_buffer_pointer(), 0]
    after_read = np.asarray(jax.jit(j.address_after_read)(x)).tolist()
    assert after_read[0] != x.unsafe_buffer_pointer() and after_read[1] == 1


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("name, expect", [
    ("write_through_alias", lambda x: 3 * np.concatenate([[7.0], x[1:]])),
    ("write_on_thread", lambda x: 3 * np.concatenate([[5.0], x[1:]])),
    ("triple_overwrites", lambda x: 3 * x),
    ("sum_on_threads", lambda x: np.full(4, x.sum())),
])
def test_writes_and_reads_of_lent_memory_outside_a_function_land_in_a_private_copy(probe_ops, name, expect, jit):
    """The body writes x through another Tensor object over its memory, or on another thread; a
    kAcceptsViews Forward overwrites x without asking is_writable(); a Forward reads x on 4 threads at
    once. Each gives the callback's values, on every call, and the caller's array keeps its own."""
    j, cb = opbuilder.to_jax(probe_ops), opbuilder.to_jax(probe_ops, ffi=False)
    x0 = np.arange(1.0, 6.0)
    x = jnp.asarray(x0)
    f = jax.jit(getattr(j, name)) if jit else getattr(j, name)
    assert getattr(j, name).route(x) == "xla_ffi"
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(f(x)), expect(x0))
        np.testing.assert_array_equal(np.asarray(x), x0)
    np.testing.assert_array_equal(np.asarray(getattr(cb, name)(x)), expect(x0))


@pytest.mark.parametrize("jit", [False, True])
def test_copy_from_into_a_lent_argument_writes_a_private_copy(probe_ops, jit):
    j, cb = opbuilder.to_jax(probe_ops), opbuilder.to_jax(probe_ops, ffi=False)
    x0, y0 = np.arange(1.0, 4.0), np.array([-1.0, -2.0, -3.0])
    x, y = jnp.asarray(x0), jnp.asarray(y0)
    f = jax.jit(j.copy_into) if jit else j.copy_into
    for _ in range(2):
        np.testing.assert_array_equal(np.asarray(f(x, y)), 3 * y0)
    np.testing.assert_array_equal(np.asarray(cb.copy_into(x, y)), 3 * y0)
    np.testing.assert_array_equal(np.asarray(x), x0)
    g = jax.grad(lambda b: f(x, b).sum())(y)
    np.testing.assert_array_equal(np.asarray(g), np.asarray(jax.grad(lambda b: cb.copy_into(x, b).sum())(y)))


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("name, expect", [
    ("nine_then_triple", lambda x: 3 * np.concatenate([[9.0], x[1:]])),
    ("nine_list_then_triple", lambda x: 3 * np.concatenate([[9.0], x[1:]])),
    ("view_write", lambda x: 3 * np.concatenate([[42.0], x[1:]])),
    ("list_view_write", lambda x: 3 * np.concatenate([[42.0], x[1:]])),
    ("const_view_write", lambda x: 3 * np.concatenate([[42.0], x[1:]])),
    ("copy_from_in_place", lambda x: 3 * x + 1),
    ("fail_after_write", lambda x: (3 * x) ** 2),
    ("zero_if_writable_then_double", lambda x: 2 * np.maximum(x, 0)),
    ("clamp_view_then_double", lambda x: 2 * np.maximum(x, 0)),
])
def test_a_functions_write_into_a_lent_argument_is_the_functions_to_see(probe_ops, name, expect, jit):
    """A Function writes x without MarkDirty (no gradient recorded: eager allows it), directly or in a
    list; a kConstArgs Forward returns a view of x (or of a list holding x) that the body writes through;
    a kAcceptsViews Forward
    writes x only when it is writable, or clamps it through a view in a nested Apply. The body then
    reads x: it sees the write, as eagerly and on the callback, on the first call and after (attacks on
    the lent-memory change: the write was lost, the view reached the caller's array, or a read-only
    view made the nested in-place Apply an error)."""
    j, cb = opbuilder.to_jax(probe_ops), opbuilder.to_jax(probe_ops, ffi=False)
    x0 = np.array([1.0, -2.0, 3.0, -4.0])
    x = jnp.asarray(x0)
    f = jax.jit(getattr(j, name)) if jit else getattr(j, name)
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(f(x)), expect(x0))
        np.testing.assert_array_equal(np.asarray(x), x0)
    np.testing.assert_array_equal(np.asarray(getattr(cb, name)(x)), expect(x0))
    np.testing.assert_array_equal(getattr(probe_ops, name)(rt.Tensor(x0.copy())).asnumpy(), expect(x0))


def test_a_lent_argument_the_function_keeps_past_the_call_is_its_own_copy(probe_ops):
    """keep stores x in a static, untouched; XLA frees the temporary a * 2 after the call. kept() reads
    the values it had (a use after free gave garbage)."""
    j = opbuilder.to_jax(probe_ops)
    x0 = np.arange(1.0, 5.0)
    f = jax.jit(lambda a: j.keep(a * 2))
    for k in range(3):
        np.testing.assert_array_equal(np.asarray(f(jnp.asarray(x0 + k))), np.zeros(4))
        junk = jax.jit(lambda a: a * 7 + 1)(jnp.asarray(np.full(4, -5.0)))  # reuses the freed memory
        jax.block_until_ready(junk)
        np.testing.assert_array_equal(probe_ops.kept(rt.Tensor(np.zeros(1))).asnumpy(), 2 * (x0 + k))
    g = jax.jit(lambda a: j.keep_then_raise(a * 3)).lower(jnp.asarray(x0)).compile()
    probe_ops.arm(True)  # kept, then an error: still its own copy
    try:
        with pytest.raises(Exception, match="keep_then_raise: refused"):
            jax.block_until_ready(g(jnp.asarray(x0)))
    finally:
        probe_ops.arm(False)
    jax.block_until_ready(jax.jit(lambda a: a * 7 + 1)(jnp.asarray(np.full(4, -5.0))))
    np.testing.assert_array_equal(probe_ops.kept(rt.Tensor(np.zeros(1))).asnumpy(), 3 * x0)


def test_a_forward_error_under_a_gradient_is_named_the_forwards(probe_ops):
    """jit(grad(f)) runs no forward custom call (JAX needs no primal): the backward runs the function
    again for its tape. An error there is the function's own, and the message says forward, as the
    forward custom call's does (it said backward)."""
    j = opbuilder.to_jax(probe_ops)
    x0 = np.arange(1.0, 5.0)
    g = jax.jit(jax.grad(lambda a: j.keep_then_raise(a * 3).sum()))
    np.testing.assert_array_equal(np.asarray(g(jnp.asarray(x0))), np.zeros(4))  # traced and compiled unarmed
    probe_ops.arm(True)
    try:
        # (a ValueError, as the same error is without the gradient)
        with pytest.raises(ValueError, match=r"^INTERNAL: to_jax \(XLA FFI forward\): keep_then_raise: refused$"):
            jax.block_until_ready(g(jnp.asarray(x0)))
    finally:
        probe_ops.arm(False)
    np.testing.assert_array_equal(np.asarray(g(jnp.asarray(x0))), np.zeros(4))


def test_an_in_place_apply_on_a_lent_argument_runs_the_function_once(probe_ops):
    """A kConstArgs type reads x in place; on a negative x it marks x dirty all the same: its Forward
    runs again on x's private copy, not the whole function, so the function's own work (a counter)
    happens once per call, and a catch-all in it changes nothing (attack on the lent-memory change: the
    function ran twice, or its write was skipped forever)."""
    j, cb = opbuilder.to_jax(probe_ops), opbuilder.to_jax(probe_ops, ffi=False)
    pos, neg = (jnp.asarray(np.array(a)) for a in ([1.0, 2.0], [-1.0, 2.0]))
    f = jax.jit(j.counted)
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(f(pos)), [2.0, 3.0])
    for _ in range(2):
        before = probe_ops.runs()
        np.testing.assert_array_equal(np.asarray(f(neg)), [-2.0, 7.0])
        assert probe_ops.runs() == before + 1
    np.testing.assert_array_equal(np.asarray(neg), [-1.0, 2.0])
    np.testing.assert_array_equal(np.asarray(cb.counted(neg)), [-2.0, 7.0])


def test_read_only_memory_reaches_a_const_function_that_takes_no_views_as_a_copy(probe_ops):
    """kConstArgs changes only what to_jax lends: eagerly a type that takes no views still gets a private
    copy of read-only memory, so a view it returns is of the copy (attack on kConstArgs: the body wrote
    an immutable bytes object through it)."""
    x0 = np.array([1.0, -2.0, 3.0, -4.0])
    read_only = np.frombuffer(x0.tobytes())
    np.testing.assert_array_equal(probe_ops.const_view_write(read_only).asnumpy(), 3 * x0)
    np.testing.assert_array_equal(read_only, x0)


@pytest.mark.parametrize("jit", [False, True])
def test_a_const_forward_that_fails_after_marking_a_lent_argument_dirty_runs_again_on_its_copy(probe_ops, jit):
    """TripleThenFail declares kConstArgs, yet marks x dirty, writes it when writable and then fails:
    the run on XLA's read-only memory wrote nothing, so its Forward runs again on x's private copy,
    which it writes before the error the function catches, as eagerly (attack on fa1fd81: only a
    Forward that returned ran again, so the function saw x unwritten)."""
    j, cb = opbuilder.to_jax(probe_ops), opbuilder.to_jax(probe_ops, ffi=False)
    x0 = np.array([200.0, 1.0, 2.0, 3.0])
    x = jnp.asarray(x0)
    f = jax.jit(j.fail_after_write) if jit else j.fail_after_write
    for _ in range(2):
        np.testing.assert_array_equal(np.asarray(f(x)), (3 * x0) ** 2)
    np.testing.assert_array_equal(np.asarray(cb.fail_after_write(x)), (3 * x0) ** 2)
    np.testing.assert_array_equal(probe_ops.fail_after_write(rt.Tensor(x0.copy())).asnumpy(), (3 * x0) ** 2)
    np.testing.assert_array_equal(np.asarray(x), x0)

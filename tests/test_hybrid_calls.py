"""A hybrid kernel calling other DSL functions (@kernel ones, plain ones of its module, and ones of another
module): inlined into the caller, the compiled kernel agrees with the Python target; the callee's errors
name its own file and line; recursion, direct or mutual, is an error naming the cycle."""
import inspect
import re

import numpy as np
import pytest

import hybrid_callees
from hybrid_callees import bad_rank, scaled, shifted
from runtime import Tensor, ops
from runtime.hybrid import HybridSyntaxError, HybridTypeError, kernel

HERE = __file__
SCALE = 100  # not the SCALE scaled() sees


def _line(func, marker="# <-"):
    lines, start = inspect.getsourcelines(func)
    return start + next(k for k, text in enumerate(lines) if marker in text)


def stats(x):  # a plain DSL function of this module, with two outputs
    lo = output_tensor(x.shape, x.dtype)
    hi = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        acc = x[i] - 1
        lo[i] = min(acc, x[i])
        hi[i] = max(acc + 2, x[i])
    return lo, hi


@kernel
def spread(x):  # calls a @kernel of another module and a plain function of its own
    s = scaled(x)
    t = allocate(x.shape, x.dtype)
    for i in range(x.shape[0]):
        acc = s[i] + 1  # the same scalar name as in scaled(): each keeps its own
        t[i] = acc
    lo, hi = stats(t)
    return hi, lo


@kernel
def chain(x, w):  # calls spread, which calls scaled and stats; returns a callee's output as its own
    hi, lo = spread(x)
    out = output_tensor((x.shape[0],), x.dtype)
    for i in range(x.shape[0]):
        out[i] = hi[i] * w[i] + lo[i] * SCALE
    return out, hi


@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.build
def test_calls_are_inlined_and_agree_with_the_python_target(dtype):
    rng = np.random.default_rng(7)
    x = rng.integers(-5, 6, 9).astype(dtype)
    w = rng.integers(-3, 4, 9).astype(dtype)
    want_hi = np.maximum(x * 3 + 2, x * 3 + 1)
    want_lo = np.minimum(x * 3, x * 3 + 1)
    out, hi = ops.Custom(chain)(Tensor(x), Tensor(w))
    py_out, py_hi = chain(x, w)  # the Python target, calling the callees as functions
    np.testing.assert_array_equal(hi.asnumpy(), want_hi)
    np.testing.assert_array_equal(out.asnumpy(), want_hi * w + want_lo * 100)
    np.testing.assert_array_equal(py_hi, want_hi)
    np.testing.assert_array_equal(py_out, out.asnumpy())
    assert out.asnumpy().dtype == py_out.dtype == np.dtype(dtype)
    assert chain.output_specs([(9,), (9,)], [dtype, dtype]) == [((9,), dtype), ((9,), dtype)]


def test_the_key_covers_every_called_function():
    sig = (("float32", 1), ("float32", 1))
    src = chain.source(*sig)
    # each module's SCALE, baked in
    assert "* static_cast<float>(INT64_C(3))" in src and "* static_cast<float>(INT64_C(100))" in src
    assert chain._expanded.sources == (spread.parsed.normalized, scaled.parsed.normalized,
                                       kernel(stats).parsed.normalized)
    assert "stats" in chain.parsed.normalized and chain.symbol(sig) != spread.symbol(sig[:1])


def k_callee_syntax(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        continue  # <-
    return y


def k_calls_bad_syntax(x):
    y = k_callee_syntax(x)
    return y


def k_calls_bad_rank(x):
    y = bad_rank(x)
    return y


def k_in_expression(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = stats(x)[i]  # <-
    return y


def k_in_loop(x):
    for i in range(2):
        y = scaled(x)  # <-
    return y


def k_wrong_count(x):
    y = scaled(x, x)  # <-
    return y


def k_scalar_argument(x):
    s = 2.0
    y = scaled(s)  # <-
    return y


def k_wrong_targets(x):
    y = stats(x)  # <-
    return y


def k_redefined(x):
    y = output_tensor(x.shape, x.dtype)
    y = scaled(x)  # <-
    return y


def k_ping(x):
    y = k_pong(x)  # <-
    return y


def k_pong(x):
    y = k_ping(x)  # <-
    return y


def k_starts_cycle(x):
    y = k_ping(x)
    return y


CALL_ERRORS = [
    (k_calls_bad_syntax, k_callee_syntax, r"'continue' are not supported.*\(in hybrid kernel 'k_callee_syntax'\)"),
    (k_in_expression, k_in_expression, r"a call to DSL function 'stats' is a statement of its own at the top level"),
    (k_in_loop, k_in_loop, r"a call to DSL function 'scaled' is a statement of its own at the top level"),
    (k_wrong_count, k_wrong_count, r"'scaled' takes 1 tensor argument\(s\) \(x\), given by position; got 2"),
    (k_scalar_argument, k_scalar_argument, r"the arguments of DSL function 'scaled' are tensors of the kernel "
                                           r"\(inputs, or declared above\); got s"),
    (k_wrong_targets, k_wrong_targets, r"'stats' returns 2 tensor\(s\) \(lo, hi\); assign them to as many names"),
    (k_redefined, k_redefined, r"'y' is already defined; a tensor is declared once"),
    (k_ping, k_pong, r"recursion: k_ping -> k_pong -> k_ping; hybrid kernels cannot recurse"),
    (k_starts_cycle, k_pong, r"recursion: k_ping -> k_pong -> k_ping"),
]


@pytest.mark.parametrize("caller,where,message", CALL_ERRORS, ids=[c.__name__ for c, _, _ in CALL_ERRORS])
def test_call_errors_name_the_file_and_line(caller, where, message):
    with pytest.raises(HybridSyntaxError, match=re.escape(f"{HERE}:{_line(where)}: ") + message):
        ops.Custom(caller, func_type="hybrid")


def test_a_callee_type_error_names_the_callee_file_and_line():
    with pytest.raises(HybridTypeError, match=re.escape(f"{hybrid_callees.__file__}:{_line(bad_rank.func)}: ") +
                       r"'x' has rank 1 but is indexed with 2 index\(es\) \(in hybrid kernel 'bad_rank'\)"):
        ops.Custom(k_calls_bad_rank, func_type="hybrid")(Tensor(np.ones(3, np.float32)))


def k_callee_scalar_error(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = x[i] + undefined_later  # <-  # noqa: F821
        undefined_later = 1.0
    return y


def k_calls_scalar_error(x):
    y = k_callee_scalar_error(x)
    return y


def test_a_callee_error_uses_the_callee_names_not_the_inlined_ones():
    with pytest.raises(HybridTypeError, match=re.escape(f"{HERE}:{_line(k_callee_scalar_error)}: ") +
                       r"scalar 'undefined_later' is used before it is assigned \(in hybrid kernel "
                       r"'k_callee_scalar_error'\)"):
        ops.Custom(k_calls_scalar_error, func_type="hybrid")(Tensor(np.ones(3, np.float32)))


def k_calls_shifted(x):
    y = shifted(x)
    return y


@pytest.mark.build
def test_a_debug_index_check_in_a_callee_names_its_line_and_text():
    x = Tensor(np.array([1.0, 2.0, 3.0], np.float32))
    with pytest.raises(RuntimeError, match=re.escape(f"{hybrid_callees.__file__}:{_line(shifted.func)}: x[i + 1]: ") +
                       r"index 3 is out of range for a dimension of size 3"):
        ops.Custom(kernel(k_calls_shifted, debug=True))(x)

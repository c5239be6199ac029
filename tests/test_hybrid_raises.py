"""Where numpy or Python raise, a compiled hybrid kernel raises the same exception, naming the kernel, the DSL
file:line and the operation: a negative integer power (ValueError), int() of NaN (ValueError) or of an
infinity (OverflowError), an element assignment out of an integer dtype's range (OverflowError) or of NaN
(ValueError), a Python int out of the range of the integer dtype it meets (OverflowError; refused when the
kernel is generated if the int is a constant). The value-by-value agreement of both targets over every dtype is
tests/test_hybrid_differential.py; this file pins the mechanism: messages, inlined callees, debug builds,
concurrent calls, a call after a failed one, and what the checker refuses."""
import inspect
import re
import threading

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, ops
from runtime.hybrid import HybridOverflowError, HybridTypeError, build_together, kernel

from thread_util import in_the_gap, run_in_threads, stopped_after_its_kernel_call

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

HERE = __file__
SHIFT = 3


def _line(func, marker="# <-"):
    lines, start = inspect.getsourcelines(func.func if hasattr(func, "func") else func)
    return start + next(k for k, text in enumerate(lines) if marker in text)


@kernel
def k_pow(a, b):
    y = output_tensor(a.shape, a.dtype)
    for i in range(a.shape[0]):
        y[i] = a[i] ** b[i]  # <-
    return y


@kernel
def k_int(x):
    y = output_tensor(x.shape, "int64")
    for i in range(x.shape[0]):
        y[i] = int(x[i]) * 2  # <-
    return y


@kernel
def k_store(x):
    y = output_tensor(x.shape, "int8")
    for i in range(x.shape[0]):
        y[i] = x[i]  # <-
    return y


def scaled_index(x):  # a DSL function inlined into k_calls_scaled: its errors name its own line
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = x[i] + i  # <-
    return y


@kernel
def k_calls_scaled(x):
    y = scaled_index(x)
    return y


@kernel
def k_shift(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = x[i] + SHIFT  # <-
    return y


@kernel
def k_square(x):
    y = output_tensor(x.shape, x.dtype)
    for i in vectorize(x.shape[0]):
        y[i] = x[i] * x[i]
    return y


@kernel
def k_weak_pow(x):
    y = output_tensor(x.shape, "int64")
    for i in range(x.shape[0]):
        y[i] = int(x[i]) ** -1  # <-
    return y


SIG_I8 = (("int8", 1), ("int8", 1))


@pytest.fixture(scope="module")
def built(cache_dir):
    """Every kernel here, for the dtypes the tests call it with, as one library (one compiler run)."""
    build_together([(k_pow, SIG_I8), (k_pow, (("int64", 1), ("int64", 1))), (k_int, (("float32", 1),)),
                    (k_store, (("float64", 1),)), (k_store, (("int16", 1),)), (k_calls_scaled, (("int8", 1),)),
                    (k_shift, (("int8", 1),)), (k_weak_pow, (("int64", 1),))])
    return True


def _both(k, *arrays):
    """The compiled target's exception and the Python target's (numpy's) exception, for the same inputs."""
    with pytest.raises(Exception) as cpp:
        ops.Custom(k)(*[Tensor(a) for a in arrays])
    with pytest.raises(Exception) as py:
        with np.errstate(all="ignore"):
            k(*arrays)
    return cpp.value, py.value


def test_a_negative_integer_power_is_numpys_value_error_naming_kernel_line_and_operation(built):
    a, b = np.array([2, 3, 4], np.int8), np.array([1, -1, 2], np.int8)
    cpp, py = _both(k_pow, a, b)
    assert type(cpp) is type(py) is ValueError
    assert str(cpp) == (f"{HERE}:{_line(k_pow)}: a[i] ** b[i]: Integers to negative integer powers are not "
                        f"allowed (in hybrid kernel 'k_pow')")
    op = ops.Custom(k_pow)  # the op is usable after a failed call, with nothing left of the error
    with pytest.raises(ValueError):
        op(Tensor(a), Tensor(b))
    good = np.array([1, 0, 2], np.int8)
    assert np.array_equal(op(Tensor(a), Tensor(good)).asnumpy(), k_pow(a, good))


def test_int_of_nan_and_infinity_raise_as_pythons_int(built):
    cpp, py = _both(k_int, np.array([1.5, np.nan], np.float32))
    assert type(cpp) is type(py) is ValueError
    assert re.fullmatch(re.escape(f"{HERE}:{_line(k_int)}: int(x[i]): cannot convert float NaN to integer ") +
                        r"\(in hybrid kernel 'k_int'\)", str(cpp))
    cpp, py = _both(k_int, np.array([1.5, -np.inf], np.float32))
    assert type(cpp) is type(py) is OverflowError and "cannot convert float infinity to integer" in str(cpp)
    cpp, py = _both(k_int, np.array([3e38], np.float32))  # past int64, the DSL's int: both refuse
    assert type(cpp) is type(py) is OverflowError and "out of int64's range" in str(cpp)
    x = np.array([1.5, -2.5, 1e18], np.float32)
    assert np.array_equal(ops.Custom(k_int)(Tensor(x)).asnumpy(), k_int(x))


def test_an_element_assignment_out_of_the_dtypes_range_raises_as_numpys(built):
    for x, exc in [(np.array([1.0, 300.0]), OverflowError), (np.array([1.0, np.nan]), ValueError),
                   (np.array([np.inf]), OverflowError), (np.array([1, -129], np.int16), OverflowError)]:
        cpp, py = _both(k_store, x)
        assert type(cpp) is type(py) is exc, x
        assert str(cpp).startswith(f"{HERE}:{_line(k_store)}: y[i] = x[i]: ")
    x = np.array([127.9, -128.9, -0.5])  # truncated, then in range: stored, as numpy does
    assert np.array_equal(ops.Custom(k_store)(Tensor(x)).asnumpy(), k_store(x))
    assert k_store(x).tolist() == [127, -128, 0]


def test_an_inlined_callee_names_its_own_line(built):
    x = np.zeros(200, np.int8)  # i reaches 128: int8 + 128 is numpy's OverflowError
    cpp, py = _both(k_calls_scaled, x)
    assert type(cpp) is type(py) is OverflowError
    assert str(cpp) == (f"{HERE}:{_line(scaled_index)}: x[i] + i: a Python integer (here i) out of bounds for "
                        f"int8 (in hybrid kernel 'scaled_index')")
    x = np.zeros(128, np.int8)
    assert np.array_equal(ops.Custom(k_calls_scaled)(Tensor(x)).asnumpy(), k_calls_scaled(x))


def test_debug_builds_raise_the_same(cache_dir):
    dk = kernel(k_pow.func, debug=True)
    cpp, py = _both(dk, np.array([2], np.int8), np.array([-3], np.int8))
    assert type(cpp) is type(py) is ValueError and "Integers to negative integer powers" in str(cpp)
    with pytest.raises(RuntimeError, match=r"index 5 is out of range"):  # the index check still reports
        ops.Custom(kernel(_reads_past_end, debug=True))(Tensor(np.zeros(3, np.float32)))


def _reads_past_end(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = x[5]
    return y


def test_concurrent_calls_of_one_op_each_get_their_own_outcome(built):
    """The kernel runs without the GIL; its error is its return status, never state shared by the op's calls."""
    op = ops.Custom(k_pow)
    a = np.full(20000, 2, np.int8)
    good, bad = np.ones(20000, np.int8), np.ones(20000, np.int8)
    bad[-1] = -1
    want = k_pow(a, good)
    errors = []

    def run(b, expect_error):
        for _ in range(200):
            try:
                out = op(Tensor(a), Tensor(b)).asnumpy()
                if expect_error or not np.array_equal(out, want):
                    errors.append("no error" if expect_error else "wrong values")
            except ValueError:
                if not expect_error:
                    errors.append("a good call raised")

    threads = [threading.Thread(target=run, args=(b, e)) for b, e in [(good, False), (bad, True)] * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def gather_pow(x, idx):
    y = output_tensor(idx.shape, x.dtype)
    for i in range(idx.shape[0]):
        y[i] = x[idx[i]] ** idx[i]  # <-
    return y


def sized_pow(x):
    n = int(x[0])
    y = output_tensor((n,), x.dtype)  # <-
    for i in range(n):
        y[i] = x[i] ** x[1]
    return y


CALLS_FAILING_AT_ONCE = {
    # op, the first call's inputs (an error with text), the second's (a check's exception, no text), the text
    "debug index": (lambda: ops.Custom(kernel(gather_pow, debug=True)),
                    [[1, 2, 3], [5]], [[1, 2, 3], [-1]],
                    lambda: f"{HERE}:{_line(gather_pow)}: x[idx[i]]: index 5 is out of range for a dimension of "
                            f"size 3"),
    "output size": (lambda: ops.Custom(sized_pow, out_shape=(2,), func_type="hybrid"),
                    [[3, 1, 1]], [[2, -1, 1]],
                    lambda: f"{HERE}:{_line(sized_pow)}: output 'y' is declared with shape (3,) here, but was "
                            f"allocated as (2,) (out_shape): make them agree"),
}


@pytest.mark.parametrize("case", sorted(CALLS_FAILING_AT_ONCE))
def test_calls_failing_at_once_each_raise_their_own_error(case):
    """A debug build's index error and an output's size error are text the call leaves beside its status;
    a call of the same op failing in another thread (at a check, whose exception needs no text) in the gap
    between that call and the look at its outcome took the text, and the call raised 'failed (status N)'."""
    make_op, first_in, second_in, text = CALLS_FAILING_AT_ONCE[case]
    op = make_op()
    first_in, second_in = [[Tensor(np.array(v, np.int64)) for v in args] for args in (first_in, second_in)]
    stopped, resume = threading.Event(), threading.Event()
    first, second = run_in_threads([
        lambda: stopped_after_its_kernel_call(lambda: op(*first_in), stopped, resume),
        lambda: in_the_gap(lambda: op(*second_in), stopped, resume)])
    assert type(first) is RuntimeError and str(first) == f"hybrid kernel '{op.name}' failed: {text()}", first
    assert type(second) is ValueError, second
    assert "Integers to negative integer powers are not allowed" in str(second)


def test_a_module_constant_rebound_out_of_range_is_refused_at_the_next_call(built):
    global SHIFT
    x = np.array([1, 2], np.int8)
    assert ops.Custom(k_shift)(Tensor(x)).asnumpy().tolist() == [4, 5]
    SHIFT = 300
    try:
        with pytest.raises(HybridOverflowError, match=re.escape(f"{HERE}:{_line(k_shift)}: x[i] + SHIFT: Python "
                                                                 f"integer 300 out of bounds for int8")):
            ops.Custom(k_shift)(Tensor(x))
        with pytest.raises(OverflowError, match="Python integer 300 out of bounds for int8"):
            k_shift(x)
    finally:
        SHIFT = 3
    assert ops.Custom(k_shift)(Tensor(x)).asnumpy().tolist() == [4, 5]


def test_two_python_ints_to_a_negative_power_raise_instead_of_giving_zero(built):
    """Python gives a float (2 ** -1 is 0.5), the DSL types it int64: the compiled kernel raises, never 0."""
    with pytest.raises(ValueError, match=re.escape(f"{HERE}:{_line(k_weak_pow)}: int(x[i]) ** (-1): Integers to "
                                                   "negative integer powers are not allowed (Python gives a "
                                                   "float")):
        ops.Custom(k_weak_pow)(Tensor(np.array([2], np.int64)))
    assert k_weak_pow(np.array([1], np.int64)).tolist() == [1]


def test_only_kernels_with_a_check_have_the_handler():
    assert "try {" not in k_square.source(("float32", 1)) and "ob::" not in k_square.source(("float32", 1))
    assert "try {" not in k_store.source(("int8", 1))  # same dtype: nothing to check
    assert "try {" in k_store.source(("float32", 1)) and "ob::f2i_checked<int8_t>" in k_store.source(("float32", 1))


def k_and_value(a, b):
    y = output_tensor(a.shape, a.dtype)
    for i in range(a.shape[0]):
        y[i] = a[i] and b[i]  # <-
    return y


@kernel
def k_and_condition(a, b):
    y = output_tensor(a.shape, a.dtype)
    for i in range(a.shape[0]):
        if a[i] and not b[i] or a[i] > 2:
            y[i] = 1.0
        else:
            y[i] = 0.0
        y[i] = y[i] + (1.0 if a[i] and b[i] else 0.0)
    return y


def test_and_or_of_non_bool_values_is_a_type_error_but_fine_as_a_condition(cache_dir):
    a, b = np.array([0.0, 2.0, 3.0, 0.5], np.float32), np.array([1.0, 0.0, 4.0, 0.0], np.float32)
    with pytest.raises(HybridTypeError, match=re.escape(f"{HERE}:{_line(k_and_value)}: 'a[i] and b[i]': 'and'/'or' "
                                                        "of a non-bool value (a[i], float32) gives one of the values "
                                                        "in Python, not a bool")):
        ops.Custom(k_and_value, func_type="hybrid")(Tensor(a), Tensor(b))
    assert np.array_equal(ops.Custom(k_and_condition)(Tensor(a), Tensor(b)).asnumpy(), k_and_condition(a, b))


@kernel
def k_select_store(x):
    y = output_tensor(x.shape, "float32")
    for i in range(x.shape[0]):
        y[i] = x[i] if x[i] > 0 else 0.1
    return y


def test_a_conditional_stored_as_it_is_converts_the_branch_taken_as_numpy_does(cache_dir):
    x = np.array([1.5, -1.0, 0.0], np.float16)  # the else branch is the Python float 0.1, not a float16 0.1
    got = ops.Custom(k_select_store)(Tensor(x)).asnumpy()
    assert np.array_equal(got, k_select_store(x)) and got[1] == np.float32(0.1)


@kernel
def k_alloc_from_data(x):
    n = int(x[0])
    y = output_tensor(x.shape, x.dtype)
    t = allocate((2, n), x.dtype)  # <-
    for i in range(x.shape[0]):
        for j in range(n):
            t[1, j] = x[i] + j
        y[i] = t[1, n - 1] if n > 0 else x[i]
    return y


@kernel
def k_out_from_data(x):
    n = int(x[0]) - 1
    y = output_tensor((n,), x.dtype)  # <-
    for i in range(n):
        y[i] = x[i] * 2.0
    return y


@kernel
def k_alloc_from_shape(x):
    y = output_tensor(x.shape, x.dtype)
    t = allocate((x.shape[0] - 4,), x.dtype)  # <-
    for i in range(x.shape[0]):
        t[0] = x[i]
        y[i] = t[0]
    return y


@kernel
def k_out_from_shape(x):
    y = output_tensor((x.shape[0], x.shape[0] - 4), x.dtype)  # <-
    for i in range(x.shape[0]):
        y[i, 0] = x[i]
    return y


def _negative(k, what):
    return re.escape(f"{HERE}:{_line(k)}: {what}(...): negative dimensions are not allowed (in hybrid kernel "
                     f"'{k.__name__}')")


def test_a_negative_size_from_data_is_numpys_value_error_in_both_targets():
    """allocate/output_tensor of a negative size: numpy's ValueError, naming the line, in both targets (the
    compiled kernel clamped the size to 0 and went on writing into it)."""
    x = np.array([-3.0, 1.0, 2.0], np.float32)
    with pytest.raises(ValueError, match="^" + _negative(k_alloc_from_data, "allocate") + "$"):
        ops.Custom(k_alloc_from_data)(Tensor(x))
    with pytest.raises(ValueError, match="^" + _negative(k_alloc_from_data, "allocate") + "$"):
        k_alloc_from_data(x)
    with pytest.raises(ValueError, match="^" + _negative(k_out_from_data, "output_tensor") + "$"):
        ops.Custom(k_out_from_data, out_shape=[0], out_dtype=rt.float32)(Tensor(x))  # declared -4, given 0
    with pytest.raises(ValueError, match="^" + _negative(k_out_from_data, "output_tensor") + "$"):
        k_out_from_data(x)
    good = np.array([2.0, 1.0, 5.0], np.float32)  # sizes from data that are not negative run as before
    np.testing.assert_array_equal(ops.Custom(k_alloc_from_data)(Tensor(good)).asnumpy(), k_alloc_from_data(good))
    np.testing.assert_array_equal(ops.Custom(k_out_from_data, out_shape=[1], out_dtype=rt.float32)(
        Tensor(good)).asnumpy(), k_out_from_data(good))


def test_a_negative_size_from_the_shapes_is_the_same_value_error_before_the_kernel_runs():
    """A size computed from the input shapes alone is known before the call (the output shapes ops.Custom
    infers): the same ValueError as the declaration gives when it runs (it was a HybridTypeError saying the
    shapes cannot be inferred)."""
    x = np.ones(3, np.float32)
    for k, what in ((k_alloc_from_shape, "allocate"), (k_out_from_shape, "output_tensor")):
        for target in ("cpu", "python"):
            with pytest.raises(ValueError, match="^" + _negative(k, what) + "$"):
                ops.Custom(kernel(k.func, target=target))(Tensor(x))
        with pytest.raises(ValueError, match="^" + _negative(k, what) + "$"):
            k(x)
    five = np.arange(5, dtype=np.float32)  # sizes from the shapes that are not negative run as before
    np.testing.assert_array_equal(ops.Custom(k_out_from_shape)(Tensor(five)).asnumpy(), k_out_from_shape(five))
    np.testing.assert_array_equal(ops.Custom(k_alloc_from_shape)(Tensor(five)).asnumpy(), k_alloc_from_shape(five))

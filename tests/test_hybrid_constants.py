"""Names a hybrid kernel reads from outside (module constants, closure variables, DSL functions it calls) are
used with their current values: rebinding one after the kernel was compiled makes the next call check and
build it again (a notebook user editing SCALE), and a value the DSL cannot use is an error, never the stale
one silently. The debug setting read from the environment is likewise current."""
import importlib.util
import textwrap

import numpy as np
import pytest

from runtime import Tensor, ops
from runtime.hybrid import HybridSyntaxError, kernel

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

MODULE = '''
from runtime.hybrid import kernel

SCALE = 2.0
SHIFT = 1


def helper(x):
    h = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        h[i] = x[i] + SHIFT
    return h


@kernel
def scaled(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = x[i] * SCALE
    return y


@kernel
def calls_helper(x):
    t = helper(x)
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = t[i] * 2
    return y
'''


@pytest.fixture()
def mod(tmp_path):
    path = tmp_path / "notebook_cell.py"
    path.write_text(MODULE)
    spec = importlib.util.spec_from_file_location("notebook_cell", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def _both(k, x):
    """(compiled, Python target) results of kernel ``k`` on ``x``."""
    return ops.Custom(k)(Tensor(x)).asnumpy(), k(x)


def test_a_changed_module_constant_is_used_by_the_next_call(mod):
    x = np.array([1.0, -2.0, 0.5], np.float32)
    op = ops.Custom(mod.scaled)
    np.testing.assert_array_equal(op(Tensor(x)).asnumpy(), x * 2)
    mod.SCALE = 3.0
    np.testing.assert_array_equal(op(Tensor(x)).asnumpy(), x * 3)  # the same op object: rebuilt
    np.testing.assert_array_equal(mod.scaled(x), x * 3)
    mod.SCALE = -0.0  # equal to 0.0 but not the same code: x * -0.0 is -0.0 for positive x
    got, want = _both(mod.scaled, x)
    assert np.array_equal(np.signbit(got), np.signbit(want)) and np.signbit(got[0])


def test_rebinding_to_an_equal_value_keeps_the_built_kernel(mod):
    x = np.ones(4, np.float32)
    op = ops.Custom(mod.scaled)
    op(Tensor(x))
    built, expanded = dict(mod.scaled._built), mod.scaled._expanded
    mod.SCALE = float("2.0")  # a new object with the same value, as when a notebook cell runs again
    np.testing.assert_array_equal(op(Tensor(x)).asnumpy(), x * 2)
    # the same objects, not equal ones: a kernel checked and resolved again compares equal to the first
    assert mod.scaled._expanded is expanded
    assert mod.scaled._built.keys() == built.keys() and all(mod.scaled._built[k] is v for k, v in built.items())


def test_a_constant_whose_type_changed_promotes_as_the_python_target_does(mod):
    x = np.array([1, -2, 3], np.int16)
    mod.SCALE = 3  # an int: int16 * 3 stays int16
    got, want = _both(mod.scaled, x)
    assert got.dtype == want.dtype == np.int16 and np.array_equal(got, want) and np.array_equal(got, x * 3)


def test_a_constant_that_is_no_longer_a_number_is_an_error_at_the_next_call(mod):
    x = np.ones(3, np.float32)
    op = ops.Custom(mod.scaled)
    op(Tensor(x))
    mod.SCALE = np.ones(3)
    with pytest.raises(HybridSyntaxError, match=r"notebook_cell\.py:\d+: 'SCALE' is a ndarray from outside"):
        op(Tensor(x))
    del mod.SCALE
    with pytest.raises(HybridSyntaxError, match=r"notebook_cell\.py:\d+: name 'SCALE' is not defined"):
        op(Tensor(x))
    mod.SCALE = 0.5
    np.testing.assert_array_equal(op(Tensor(x)).asnumpy(), x * 0.5)


def test_a_callees_constant_and_a_redefined_callee_are_used(mod, tmp_path):
    x = np.array([1.0, 2.0], np.float64)
    op = ops.Custom(mod.calls_helper)
    np.testing.assert_array_equal(op(Tensor(x)).asnumpy(), (x + 1) * 2)
    mod.SHIFT = 10
    np.testing.assert_array_equal(op(Tensor(x)).asnumpy(), (x + 10) * 2)
    cell = tmp_path / "cell_2.py"
    cell.write_text(textwrap.dedent('''
        def helper(x):
            h = output_tensor(x.shape, x.dtype)
            for i in range(x.shape[0]):
                h[i] = x[i] - SHIFT
            return h
    '''))
    exec(compile(cell.read_text(), str(cell), "exec"), vars(mod))  # the cell defining helper run again, edited
    got, want = _both(mod.calls_helper, x)
    np.testing.assert_array_equal(got, (x - 10) * 2)
    np.testing.assert_array_equal(want, got)


def test_a_closure_variable_is_read_when_it_changes():
    factor = 2

    @kernel
    def times(x):
        y = output_tensor(x.shape, x.dtype)
        for i in range(x.shape[0]):
            y[i] = x[i] * factor
        return y

    x = np.arange(4, dtype=np.int32)
    op = ops.Custom(times)
    np.testing.assert_array_equal(op(Tensor(x)).asnumpy(), x * 2)
    factor = 5  # noqa: F841  (read by the kernel through its closure)
    np.testing.assert_array_equal(op(Tensor(x)).asnumpy(), x * 5)
    np.testing.assert_array_equal(times(x), x * 5)


def test_the_debug_environment_setting_applies_to_the_next_call(monkeypatch):
    @kernel
    def shifted(x):
        y = output_tensor(x.shape, x.dtype)
        for i in range(x.shape[0]):
            y[i] = x[i + 1]
        return y

    op = ops.Custom(shifted)
    x = Tensor(np.ones(3, np.float32))
    monkeypatch.delenv("OPBUILDER_HYBRID_DEBUG", raising=False)
    op(x)  # reads one past the end (undetected in a release build); the debug build must be a new one
    monkeypatch.setenv("OPBUILDER_HYBRID_DEBUG", "1")
    with pytest.raises(RuntimeError, match=r"x\[i \+ 1\]: index 3 is out of range for a dimension of size 3"):
        op(x)

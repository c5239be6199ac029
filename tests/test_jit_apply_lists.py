"""The two hooks a C++ call takes while runtime.jit traces (runtime/jit/tracing.py); no compiler needed.

``bound_hook``: a module function (the m.def of OB_MODULE, NB_MODULE, PYBIND11_MODULE) recorded whole. One
that takes a list of tensors has each tensor as an input of the trace, so a replay reads the new call's values
(a list kept whole would be a constant holding the traced tensors).

``cpp_hook``: a Function's Apply called by a function jit does not record whole (a bound class's method). The
trace stops, and that signature runs eagerly: a replay of the Apply alone would drop the work around it.
"""
import numpy as np
import pytest

from runtime import Tensor, jit
from runtime.jit import tracing


def _sum(xs, scale):
    """What the C++ function does with its arguments: here, the sum of a list of tensors, scaled."""
    out = xs[0]._data * 0
    for x in xs:
        out = out + x._data
    return Tensor(out * scale)


def _bound(xs, scale):
    """A module function's C++ entry: the hook when the trace flag is set, else the call."""
    if tracing.flag.value:
        out = tracing.bound_hook("sum_list", _sum, (list(xs), scale))
        if out is not NotImplemented:
            return out
    return _sum(xs, scale)


def _apply(xs, scale):
    """A Function's Apply reached from a bound class's method."""
    if tracing.flag.value:
        return tracing.cpp_hook("SumList", _sum, (list(xs), scale))
    return _sum(xs, scale)


def test_a_list_of_tensors_given_to_a_module_function_is_read_anew_on_every_replay():
    f = jit(lambda a, b: _bound([a, b], 2.0) * 1.0)
    for k in range(1, 4):
        a, b = Tensor(np.array([k * 1.0])), Tensor(np.array([k * 10.0]))
        np.testing.assert_array_equal(f(a, b).asnumpy(), [k * 22.0])
    assert f.traces == 1


def test_a_tuple_of_tensors_and_a_number_keep_their_places():
    f = jit(lambda a, b: _bound((b, a), 3.0))
    for k in (1.0, 5.0):
        np.testing.assert_array_equal(f(Tensor(np.array([k])), Tensor(np.array([2 * k]))).asnumpy(), [9 * k])
    assert f.traces == 1


def test_an_apply_outside_a_module_function_stops_the_trace():
    f = jit(lambda a, b: _apply([a, b], 2.0) * 1.0)
    with pytest.warns(RuntimeWarning, match=r"not captured: at .*test_jit_apply_lists\.py:\d+, the C\+\+ "
                                            r"Function SumList was applied by a function jit cannot record whole"):
        np.testing.assert_array_equal(f(Tensor(np.array([1.0])), Tensor(np.array([10.0]))).asnumpy(), [22.0])
    for k in range(2, 4):
        a, b = Tensor(np.array([k * 1.0])), Tensor(np.array([k * 10.0]))
        np.testing.assert_array_equal(f(a, b).asnumpy(), [k * 22.0])
    assert f.traces == 0

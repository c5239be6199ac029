"""A C++ Apply recorded alone (a Function bound by NB_MODULE or PYBIND11_MODULE, or a bound class's method)
that takes a list of tensors: each tensor is an input of the trace, so a replay reads the new call's values
(a list kept whole would be a constant holding the traced tensors). The hook is the one C++ Apply calls
while a trace records (runtime/jit/tracing.py ``cpp_hook``); no compiler needed."""
import numpy as np

from runtime import Tensor, jit
from runtime.jit import tracing


def _apply_sum(xs, scale):
    """What a Function's replay does with its arguments: here, the sum of a list of tensors, scaled."""
    out = xs[0]._data * 0
    for x in xs:
        out = out + x._data
    return Tensor(out * scale)


def _op(xs, scale):
    """The C++ Apply's entry while a trace may record: the hook when the flag is set, else the call."""
    if tracing.flag.value:
        return tracing.cpp_hook("SumList", _apply_sum, (list(xs), scale))
    return _apply_sum(xs, scale)


def test_a_list_of_tensors_given_to_an_apply_is_read_anew_on_every_replay():
    f = jit(lambda a, b: _op([a, b], 2.0) * 1.0)
    for k in range(1, 4):
        a, b = Tensor(np.array([k * 1.0])), Tensor(np.array([k * 10.0]))
        np.testing.assert_array_equal(f(a, b).asnumpy(), [k * 22.0])


def test_a_tuple_of_tensors_and_a_number_keep_their_places():
    f = jit(lambda a, b: _op((b, a), 3.0))
    for k in (1.0, 5.0):
        np.testing.assert_array_equal(f(Tensor(np.array([k])), Tensor(np.array([2 * k]))).asnumpy(), [9 * k])

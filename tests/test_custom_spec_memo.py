"""aot ops.Custom with out_shape/out_dtype callables (and op-info checks): the specs are worked out
once per input signature (dtypes, and shapes when a callable may read them) and remembered, in C
for warm calls (custom.py ``_cmemo``, aot_call.cpp run_tensors). A new signature asks the callables
again and is honoured; a wrong answer is an error every time it is given, never remembered."""
from pathlib import Path

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, ops
from runtime.ops import CustomRegOp, DataType

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

ROOT = Path(__file__).resolve().parents[1]
OPS = str(ROOT / "custom_src" / "aot_ops.cpp")


class Counted:
    """A spec callable that records each signature it is asked about."""

    def __init__(self, answer):
        self.answer = answer
        self.asked = []

    def __call__(self, *args):
        self.asked.append(args)
        return self.answer(*args)


def _t(shape, dtype):
    return Tensor(np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape) + 1)


def test_two_signatures_each_ask_the_callables_once_and_get_their_own_specs():
    shape, dtype = Counted(lambda x: x), Counted(lambda x: x)
    op = ops.Custom(f"{OPS}:Square", out_shape=shape, out_dtype=dtype, func_type="aot")
    a, b = _t((3,), np.float32), _t((2, 2), np.float32)
    for _ in range(3):
        for x in (a, b):
            out = op(x)
            assert out.shape == x.shape and out.dtype == rt.float32
            np.testing.assert_array_equal(out.asnumpy(), x.asnumpy() ** 2)
    assert shape.asked == [([3],), ([2, 2],)]
    assert dtype.asked == [(rt.float32,), (rt.float32,)]
    assert op._fast is not None and len(op._cmemo) == 2  # warm calls: one C call each


def test_a_shape_dependent_answer_is_honoured_per_signature():
    # the output is the first half of the input: its shape depends on the input's
    op = ops.Custom(f"{OPS}:Square", out_shape=lambda x: [x[0] // 2], out_dtype=rt.float64, func_type="aot")
    x4, x6 = _t((4,), np.float64), _t((6,), np.float64)
    for _ in range(2):
        np.testing.assert_array_equal(op(x4).asnumpy(), x4.asnumpy()[:2] ** 2)
        np.testing.assert_array_equal(op(x6).asnumpy(), x6.asnumpy()[:3] ** 2)


def test_mixed_dtypes_are_separate_signatures():
    dtype = Counted(lambda x: x)
    op = ops.Custom(f"{OPS}:Square", out_shape=lambda x: x, out_dtype=dtype, func_type="aot")
    f32, f64 = _t((3,), np.float32), _t((3,), np.float64)
    for _ in range(3):
        assert op(f32).dtype == rt.float32
        assert op(f64).dtype == rt.float64
    assert dtype.asked == [(rt.float32,), (rt.float64,)]


def test_numbers_of_equal_value_but_other_types_are_other_signatures():
    dtype = Counted(lambda x, y: y)
    # (a result in y's dtype: a pyfunc's float64 sum cast to bool would change its values, a TypeError)
    op = ops.Custom(lambda x, y: np.zeros(x.shape, np.asarray(y).dtype), out_shape=lambda x, y: x, out_dtype=dtype,
                    func_type="pyfunc")
    x = Tensor(np.zeros(2, np.float64))
    got = [op(x, v).asnumpy().dtype for v in (True, 1, 1.0, True, 1, 1.0)]
    assert got[:3] == got[3:] and len(set(got[:3])) == 3
    assert [a[1] for a in dtype.asked] == [rt.bool_, rt.int64, rt.float32]


def test_a_wrong_answer_for_a_new_signature_is_caught_every_time():
    op = ops.Custom(f"{OPS}:Square", out_shape=lambda x: x if x[0] != 5 else [-1], out_dtype=rt.float64,
                    func_type="aot")
    good, bad = _t((3,), np.float64), _t((5,), np.float64)
    op(good)
    op(good)  # warm: the C path is ready
    for _ in range(2):
        with pytest.raises(ValueError, match=r"^Custom 'Square': output 0 shape \[-1\] is not a list of "
                                             r"non-negative ints$"):
            op(bad)
    np.testing.assert_array_equal(op(good).asnumpy(), good.asnumpy() ** 2)


def test_a_none_answer_for_a_new_signature_names_the_op():
    op = ops.Custom(f"{OPS}:Square", out_shape=lambda x: x, out_dtype=lambda x: None if x == rt.float32 else x,
                    func_type="aot")
    f64 = _t((2,), np.float64)
    op(f64)
    op(f64)
    with pytest.raises(ValueError, match=r"^Custom 'Square': its out_dtype function returned None for input "
                                         r"dtypes \[Float32\]; it must return the output's dtype"):
        op(_t((2,), np.float32))


def test_the_op_info_check_runs_per_dtype_signature_on_warm_calls():
    info = (CustomRegOp("square").input(0, "x").output(0, "y")
            .dtype_format(DataType.F64_Default, DataType.F64_Default).get_op_info())
    op = ops.Custom(f"{OPS}:Square", out_shape=[2], out_dtype=rt.float64, reg_info=info)
    f64 = _t((2,), np.float64)
    for _ in range(3):
        np.testing.assert_array_equal(op(f64).asnumpy(), f64.asnumpy() ** 2)
    assert op._fast is not None
    for _ in range(2):
        with pytest.raises(TypeError, match=r"^Custom 'Square'"):
            op(_t((2,), np.float32))


def test_inputs_needing_grad_still_record_on_a_remembered_signature():
    op = ops.Custom(f"{OPS}:Square", out_shape=lambda x: x, out_dtype=lambda x: x,
                    bprop=lambda x, out, dout: (dout * x * 2.0,))
    x = _t((3,), np.float64)
    op(x)
    op(x)
    g = Tensor(x.asnumpy().copy(), requires_grad=True)
    out = op(g)
    out.sum().backward()
    np.testing.assert_array_equal(g.grad.asnumpy(), 2 * x.asnumpy())


def test_the_c_key_matches_the_signature_key():
    from runtime.ops.aot_trampoline import trampoline
    key = trampoline().memo_key
    sig = (((2, 3), np.dtype(np.float32)), ((), np.dtype(np.int64)))
    assert key(sig, True) == np.array([2, np.dtype(np.float32).num, 2, 2, 3, np.dtype(np.int64).num, 0],
                                      np.int64).tobytes()
    assert key((np.dtype(np.float64),), False) == np.array([1, np.dtype(np.float64).num], np.int64).tobytes()
    with pytest.raises(TypeError, match=r"^memo_key: dtypes must be numpy dtypes$"):
        key(("float32",), False)


def test_run_tensors_takes_fixed_specs_or_a_memo_only():
    from runtime.ops.aot_trampoline import trampoline
    with pytest.raises(TypeError, match=r"^run_tensors\(fn, extra, tensors, out_specs, Tensor, grad\[, with_shapes\]\): "
                                        r"out_specs must be a tuple or a dict$"):
        trampoline().run_tensors(0, 0, (), [], Tensor, False)


COPY_BYTES = r"""
#include <cstdint>
#include <cstring>
// out = x, any dtype of 8 bytes (int64 and uint64 here)
extern "C" int Copy8(int nparam, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  if (nparam != 2) return 1;
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; ++d) n *= shapes[0][d];
  std::memcpy(params[1], params[0], static_cast<size_t>(n) * 8);
  return 0;
}
"""


def test_both_numbers_numpy_gives_int64_share_one_warm_entry(tmp_path):
    # numpy spells int64 'l' and 'q' (two type numbers, equal dtypes): whichever came first, the other
    # takes the one C call too (it fell back to the Python path on every call, about twice as slow)
    src = tmp_path / "copy8.cpp"
    src.write_text(COPY_BYTES)
    for first, second in (("q", "l"), ("l", "q"), ("Q", "L")):
        asked = Counted(lambda x: x)
        op = ops.Custom(f"{src}:Copy8", out_shape=asked, out_dtype=lambda x: x, func_type="aot")
        a = rt.from_numpy(np.arange(3, dtype=first))
        b = rt.from_numpy(np.arange(3, dtype=second) + 5)
        np.testing.assert_array_equal(op(a).asnumpy(), [0, 1, 2])
        fast = op._fast
        out = fast[0](fast[1], fast[2], (b,), fast[3], Tensor, False, fast[5])
        assert out is not None, f"{second} after {first}: not a warm call"
        np.testing.assert_array_equal(out.asnumpy(), [5, 6, 7])
        assert out.dtype == rt.from_numpy(np.arange(1, dtype=first)).dtype
        assert len(asked.asked) == 1 and len(op._cmemo) == 1


def test_the_c_key_gives_one_number_to_equal_integer_dtypes():
    from runtime.ops.aot_trampoline import trampoline
    key = trampoline().memo_key
    for a, b in (("q", "l"), ("Q", "L")):
        assert np.dtype(a) == np.dtype(b) and np.dtype(a).num != np.dtype(b).num
        assert key((np.dtype(a),), False) == key((np.dtype(b),), False)
        assert key((((2,), np.dtype(a)),), True) == key((((2,), np.dtype(b)),), True)
    assert key((np.dtype("q"),), False) != key((np.dtype("Q"),), False)
    assert key((np.dtype("q"),), False) != key((np.dtype("i"),), False)


def test_an_out_shape_with_a_zero_and_overflowing_dims_is_a_memory_error():
    # numpy refuses such dims although the array is empty: the same MemoryError as other overflows
    op = ops.Custom(f"{OPS}:Square", out_shape=lambda x: [0, 2 ** 62, 2 ** 62], out_dtype=rt.float32,
                    func_type="aot")
    with pytest.raises(MemoryError, match=r"^Custom 'Square': cannot allocate output 0 of shape "
                                          r"\[0, 4611686018427387904, 4611686018427387904\] and dtype Float32: its "
                                          r"size in bytes overflows$"):
        op(_t((3,), np.float32))

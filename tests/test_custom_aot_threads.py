"""ops.Custom aot ops called from several Python threads at once (kernels run with the GIL released)."""
import ctypes
import threading
from pathlib import Path

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, ops

from thread_util import in_the_gap, run_in_threads, stopped_after_its_kernel_call

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

SRC = str(Path(__file__).resolve().parent / "cpp" / "aot_thread_ops.cpp")


def _reset(op):
    ctypes.CDLL(op._kernel.library).ResetThreadOps()


def test_init_runs_once_when_first_calls_come_from_several_threads():
    op = ops.Custom(f"{SRC}:Counted", out_shape=[2], out_dtype=rt.float32)
    _reset(op)
    results = run_in_threads([lambda: op(Tensor([0.0])).asnumpy()] * 4)
    # every call waited for the one Init and sees its data (Init ran four times, each deleting
    # the data of the one before while calls still used it)
    for r in results:
        assert not isinstance(r, Exception), r
        np.testing.assert_array_equal(r, [1.0, 1.0])
    np.testing.assert_array_equal(op(Tensor([0.0])).asnumpy(), [1.0, 1.0])


def test_an_error_recorded_by_one_call_is_raised_by_that_call_only():
    op = ops.Custom(f"{SRC}:ErrorsInOneCall", out_shape=[1], out_dtype=rt.float32)
    _reset(op)
    bad, good = run_in_threads([lambda: op(Tensor([-1.0])), lambda: op(Tensor([2.0]))])
    # the error is the call's that recorded it: the bad one raises it, the good one returns
    assert isinstance(bad, RuntimeError)
    assert "aot operator 'ErrorsInOneCall'" in str(bad) and "attribute 'missing' is not set" in str(bad)
    assert not isinstance(good, Exception), good
    np.testing.assert_array_equal(good.asnumpy(), [2.0])
    np.testing.assert_array_equal(op(Tensor([3.0])).asnumpy(), [3.0])  # nothing left over for the next call


def test_calls_failing_at_once_each_raise_their_own_error():
    op = ops.Custom(f"{SRC}:BySign", out_shape=[1], out_dtype=rt.float32)
    stopped, resume = threading.Event(), threading.Event()

    first_r, second_r = run_in_threads([
        lambda: stopped_after_its_kernel_call(lambda: op(Tensor([-1.0])), stopped, resume),  # records an error
        lambda: in_the_gap(lambda: op(Tensor([0.0])), stopped, resume)])  # status 7, no error text
    # each raises its own (through the op's buffer, the second call took the first's text and the first none)
    where = f"aot operator 'BySign' in {op._kernel.library}"
    assert isinstance(first_r, RuntimeError) and isinstance(second_r, RuntimeError)
    assert str(first_r) == f"{where}: attribute 'missing' is not set on this op; it has no attributes (give " \
                           f"them with CustomRegOp.attr)"
    assert str(second_r) == f"{where} returned status 7"


def test_the_gpu_paths_call_gives_each_call_its_own_error_on_host_memory_too():
    """aot_device.call_pointers is the GPU path's kernel call (params by address: aot_call.cpp's ``call_at``,
    the host path's per-call extra); only the CuPy arrays around it need a GPU, so it runs here on host
    memory. It handed the op's shared extra to the kernel and looked there after the call: a good call made
    between a failed call and that look raised the failed call's error, which then raised nothing."""
    from runtime.ops.aot_device import call_pointers
    op = ops.Custom(f"{SRC}:BySign", out_shape=[1], out_dtype=rt.float32)
    op._load_path()  # what the op's first call does

    def via_pointers(x):
        ins, out = np.array([x], np.float32), np.zeros(1, np.float32)
        call_pointers(op._call, op._kernel.fn, op._extra.address, [ins.ctypes.data, out.ctypes.data],
                      [(a.shape, a.dtype) for a in (ins, out)], 0)
        return out

    stopped, resume = threading.Event(), threading.Event()
    bad, good = run_in_threads([
        lambda: stopped_after_its_kernel_call(lambda: via_pointers(-1.0), stopped, resume),
        lambda: in_the_gap(lambda: via_pointers(2.0), stopped, resume)])
    assert type(bad) is op._failed, bad
    assert bad.args == (0, "attribute 'missing' is not set on this op; it has no attributes (give them with "
                           "CustomRegOp.attr)")
    assert not isinstance(good, Exception), good
    np.testing.assert_array_equal(good, [2.0])
    assert op._extra.data.error == b""  # nothing left in the op's buffer for a later call to find
    with pytest.raises(op._failed) as e:
        via_pointers(0.0)
    assert e.value.args == (7, "")


def test_the_call_path_refuses_malformed_params():
    op = ops.Custom(f"{SRC}:Counted", out_shape=[2], out_dtype=rt.float32)
    op._load_path()  # what the op's first call does
    fn, extra = op._kernel.fn, op._extra.address
    with pytest.raises(TypeError, match=r"^call_at\(fn, extra, pointers, shapes, dtypes, stream\): pointers, "
                                        r"shapes and dtypes must be tuples of one length$"):
        op._call(fn, extra, (0, 0), ((2,),), ("float32",), 0)
    with pytest.raises(TypeError, match=r"^call_at\(fn, extra, pointers, shapes, dtypes, stream\): shape 0 must "
                                        r"be a tuple$"):
        op._call(fn, extra, (0,), ([2],), ("float32",), 0)
    with pytest.raises(TypeError, match=r"^call_at\(fn, extra, pointers, shapes, dtypes, stream\) takes 6 "
                                        r"arguments, got 2$"):
        op._call(fn, extra)


def test_a_dtype_the_abi_has_no_name_for_is_refused_by_name():
    from runtime.ops.aot_device import call_pointers
    op = ops.Custom(f"{SRC}:Counted", out_shape=[2], out_dtype=rt.float32)
    op._load_path()
    with pytest.raises(TypeError, match=r"^aot operators take no datetime64\[s\] tensors \(they take float16, "):
        call_pointers(op._call, op._kernel.fn, op._extra.address, [0], [((1,), np.dtype("datetime64[s]"))], 0)


def test_calls_at_once_each_get_their_own_workspaces():
    op = ops.Custom(f"{SRC}:KeepsInWorkspace", out_shape=[1], out_dtype=rt.float32)
    _reset(op)
    first, second = run_in_threads([lambda: op(Tensor([1.0])).asnumpy(), lambda: op(Tensor([2.0])).asnumpy()])
    # both calls had the op's one set: each read back what the one that wrote last kept there
    np.testing.assert_array_equal(first, [1.0])
    np.testing.assert_array_equal(second, [2.0])

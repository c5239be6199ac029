"""ops.Custom aot ops called from several Python threads at once (kernels run with the GIL released)."""
import ctypes
import threading
from pathlib import Path

import numpy as np
import pytest

import runtime as rt
from runtime import Tensor, ops

SRC = str(Path(__file__).resolve().parent / "cpp" / "aot_thread_ops.cpp")


def _run_in_threads(fns):
    """Run each fn in its own thread, started together; their results (or exceptions) in order."""
    results = [None] * len(fns)
    start = threading.Barrier(len(fns))

    def work(i):
        start.wait()
        try:
            results[i] = fns[i]()
        except Exception as e:  # noqa: BLE001 - the test inspects it
            results[i] = e

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _reset(op):
    ctypes.CDLL(op._kernel.library).ResetThreadOps()


def test_init_runs_once_when_first_calls_come_from_several_threads():
    op = ops.Custom(f"{SRC}:Counted", out_shape=[2], out_dtype=rt.float32)
    _reset(op)
    results = _run_in_threads([lambda: op(Tensor([0.0])).asnumpy()] * 4)
    # every call waited for the one Init and sees its data (Init ran four times, each deleting
    # the data of the one before while calls still used it)
    for r in results:
        assert not isinstance(r, Exception), r
        np.testing.assert_array_equal(r, [1.0, 1.0])
    np.testing.assert_array_equal(op(Tensor([0.0])).asnumpy(), [1.0, 1.0])


def test_an_error_recorded_by_one_call_is_raised_by_that_call_only():
    op = ops.Custom(f"{SRC}:ErrorsInOneCall", out_shape=[1], out_dtype=rt.float32)
    _reset(op)
    bad, good = _run_in_threads([lambda: op(Tensor([-1.0])), lambda: op(Tensor([2.0]))])
    # the error went to whichever call looked first: the good one raised it, the bad one returned
    assert isinstance(bad, RuntimeError)
    assert "aot operator 'ErrorsInOneCall'" in str(bad) and "attribute 'missing' is not set" in str(bad)
    assert not isinstance(good, Exception), good
    np.testing.assert_array_equal(good.asnumpy(), [2.0])
    np.testing.assert_array_equal(op(Tensor([3.0])).asnumpy(), [3.0])  # nothing left over for the next call

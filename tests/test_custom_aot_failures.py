"""ops.Custom aot ops whose Init fails or whose kernel throws a C++ exception (runtime/ops/aot_call.cpp)."""
import ctypes
import weakref
from pathlib import Path

import runtime as rt
from runtime import Tensor, ops

SRC = str(Path(__file__).resolve().parent / "cpp" / "aot_failing_ops.cpp")


def test_a_failing_init_is_retried_by_each_call_without_piling_up_finalizers(cache_dir):
    op = ops.Custom(f"{SRC}:FailingInit", out_shape=[1], out_dtype=rt.float32)
    lib = ctypes.CDLL(op._kernel.library)
    before, inits = len(weakref.finalize._registry), lib.InitsRun()
    for _ in range(50):
        try:
            op(Tensor([1.0]))
        except RuntimeError as e:
            err = e
    assert str(err) == f"aot operator 'FailingInitInit' in {op._kernel.library} returned status 3"
    assert lib.InitsRun() - inits == 50  # retried, not cached
    # one finalizer deletes the op's kernel data; each failed call registered another
    assert len(weakref.finalize._registry) - before == 1


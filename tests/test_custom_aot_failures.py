"""ops.Custom aot ops whose Init fails or whose kernel throws a C++ exception (runtime/ops/aot_call.cpp)."""
import ctypes
import subprocess
import sys
import weakref
from pathlib import Path

import runtime as rt
from runtime import Tensor, ops
import pytest

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

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


# Each case runs in a child process: without the catch in the call path a throw is std::terminate.
_CHILD = """
import sys
import runtime as rt
from runtime import Tensor, ops
op = ops.Custom(sys.argv[1], out_shape=[1], out_dtype=rt.float32)
for _ in range(2):  # the process, and the op, go on after the first
    try:
        op(Tensor([1.0]))
    except BaseException as e:
        print(type(e).__name__ + ": " + str(e).replace(op._kernel.library, "LIB"))
"""


def _child(symbol):
    ops.Custom(f"{SRC}:{symbol}", out_shape=[1], out_dtype=rt.float32)  # built here, in the session's cache
    r = subprocess.run([sys.executable, "-c", _CHILD, f"{SRC}:{symbol}"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_a_cpp_exception_from_a_kernel_is_a_runtime_error_with_its_text(cache_dir):
    assert _child("Throws") == ["RuntimeError: aot operator 'Throws' in LIB: threw a C++ exception: out of "
                                "range in Throws"] * 2
    assert _child("ThrowsAnInt") == ["RuntimeError: aot operator 'ThrowsAnInt' in LIB: threw a C++ exception "
                                     "(not a std::exception)"] * 2


def test_an_error_recorded_before_a_throw_is_the_one_raised(cache_dir):
    assert _child("RecordsThenThrows") == [
        "RuntimeError: aot operator 'RecordsThenThrows' in LIB: attribute 'missing' is not set on this op; it has "
        "no attributes (give them with CustomRegOp.attr)"] * 2


def test_a_cpp_exception_from_init_is_a_runtime_error_with_its_text(cache_dir):
    assert _child("ThrowingInit") == ["RuntimeError: aot operator 'ThrowingInitInit' in LIB: threw a C++ "
                                      "exception: bad shapes in Init"] * 2

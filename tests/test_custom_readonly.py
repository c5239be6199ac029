"""aot ops and memory they may not write: read-only arrays, ``bytes`` buffers and read-only memory maps.

An undeclared write into a read-only input lands in a private copy (the caller's memory is untouched, and
a read-only map does not fault); an input declared ``inplace`` in the op-info must be writable, else a
ValueError before the kernel runs. Anything that could fault runs in a child process, so a segfault is a
failed test, not a dead pytest.
"""
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import runtime as rt
from builder_util import child_env
from runtime import Tensor, ops
from runtime.call_rules import PARTIAL_OVERLAP_MESSAGE
from runtime.ops import CustomRegOp, DataType

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

ROOT = Path(__file__).resolve().parents[1]
INPLACE = str(ROOT / "custom_src" / "aot_inplace.cpp")

PRELUDE = f"""
import numpy as np, pytest
import runtime as rt
from runtime import Tensor, ops
from runtime.ops import CustomRegOp
SRC = {INPLACE!r}
undeclared = ops.Custom(SRC + ":AssignAdd", lambda x, y: x, lambda x, y: x)
info = CustomRegOp("assign_add").input(0, "x", inplace=True).input(1, "y").output(0, "out").get_op_info()
declared = ops.Custom(SRC + ":AssignAdd", lambda x, y: x, lambda x, y: x, reg_info=info)
"""


def assign_add_info(**x_kwargs):
    return (CustomRegOp("assign_add").input(0, "x", **x_kwargs).input(1, "y").output(0, "out")
            .dtype_format(DataType.F32_Default, DataType.F32_Default, DataType.F32_Default)
            .dtype_format(DataType.F64_Default, DataType.F64_Default, DataType.F64_Default).get_op_info())


@pytest.fixture(scope="module")
def assign_add():
    """AssignAdd with its write to x declared (the op is built once; children reuse the cached build)."""
    return ops.Custom(f"{INPLACE}:AssignAdd", lambda x, y: x, lambda x, y: x, reg_info=assign_add_info(inplace=True))


def run_child(code: str, tmp_path: Path) -> str:
    res = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], cwd=tmp_path, env=child_env(),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"child exited {res.returncode} (negative: killed by that signal)\n{res.stderr}"
    return res.stdout


# ---- an undeclared write: a private copy --------------------------------------------------

def test_an_array_marked_read_only_is_never_written(assign_add, tmp_path):
    out = run_child("""
        a = np.ones(3, np.float32)
        a.flags.writeable = False
        res = undeclared(rt.from_numpy(a), Tensor([1.0, 2.0, 3.0]))
        assert res.tolist() == [2.0, 3.0, 4.0], res      # the kernel ran, on a private copy
        assert a.tolist() == [1.0, 1.0, 1.0], a           # the caller's array is as it was
        print("ok")
    """, tmp_path)
    assert out == "ok\n"


def test_the_bytes_of_an_immutable_bytes_object_are_never_written(assign_add, tmp_path):
    out = run_child("""
        b = np.full(4, 2.0, np.float32).tobytes()
        x = np.frombuffer(b, np.float32)
        res = undeclared(rt.from_numpy(x), Tensor(np.ones(4, np.float32)))
        assert res.tolist() == [3.0] * 4, res
        assert b == np.full(4, 2.0, np.float32).tobytes()
        print("ok")
    """, tmp_path)
    assert out == "ok\n"


def test_a_read_only_memory_map_does_not_fault_and_keeps_its_file(assign_add, tmp_path):
    np.arange(6, dtype=np.float64).tofile(tmp_path / "data.bin")
    out = run_child("""
        m = np.memmap("data.bin", np.float64, mode="r")
        res = undeclared(rt.from_numpy(m), Tensor(np.ones(6)))   # the kernel writes x: SIGSEGV if it got the map
        assert res.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], res
        print("ok")
    """, tmp_path)
    assert out == "ok\n"
    assert np.fromfile(tmp_path / "data.bin", np.float64).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_an_undeclared_write_into_a_writable_input_reaches_it_uncopied(assign_add):
    # writable C-contiguous inputs are passed as they are (no copy per call); docs/custom_ops.md says so
    undeclared = ops.Custom(f"{INPLACE}:AssignAdd", lambda x, y: x, lambda x, y: x)
    a = np.ones(2, np.float32)
    undeclared(rt.from_numpy(a), Tensor([1.0, 1.0]))
    assert a.tolist() == [2.0, 2.0]


# ---- a declared in-place write --------------------------------------------------------------

def test_a_declared_write_updates_the_tensor_and_its_version(assign_add):
    x = Tensor([1.0, 2.0], rt.float32)
    v = x._version
    out = assign_add(x, Tensor([10.0, 20.0], rt.float32))
    assert x.tolist() == [11.0, 22.0] and out.tolist() == [11.0, 22.0]
    assert x._version == v + 1
    a = np.zeros(2)  # a numpy array is written too (float64 row)
    assign_add(a, np.array([1.5, 2.5]))
    assert a.tolist() == [1.5, 2.5]


def test_a_declared_write_into_a_strided_view_is_written_back():
    info = CustomRegOp("assign_add").input(0, "x", inplace=True).input(1, "y").output(0, "out").get_op_info()
    op = ops.Custom(f"{INPLACE}:AssignAdd", lambda x, y: x, lambda x, y: x, reg_info=info)
    base = np.zeros((3, 4), np.float32)
    view = base[:, ::2]
    op(view, np.ones((3, 2), np.float32))
    assert base.tolist() == [[1.0, 0.0, 1.0, 0.0]] * 3


def test_a_declared_write_partly_over_another_input_is_refused_before_the_kernel(assign_add):
    """torch refuses ``t[1:].add_(t[:-1])`` before writing. Before, the kernel read elements it had already
    written: b = [1, 2, 3, 4], a running sum, where element-wise reads give [1, 2, 2, 2]."""
    b = Tensor(np.ones(4, np.float32))
    with pytest.raises(RuntimeError, match=r"^Custom 'AssignAdd' writes its input 0 in place \(its reg_info says "
                                           r"inplace\), and another input shares part of its memory: "
                                           + re.escape(PARTIAL_OVERLAP_MESSAGE) + "$"):
        assign_add(b[1:4], b[0:3])
    assert b.tolist() == [1.0] * 4 and b._version == 0
    a = np.ones(4, np.float32)
    with pytest.raises(RuntimeError, match=re.escape(PARTIAL_OVERLAP_MESSAGE)):
        assign_add(a[::-1][:3], a[:3])  # a reversed view (numpy's negative strides): its bytes overlap too
    t = np.ones(4, np.float32)
    assign_add(t, t)  # the same elements in the same layout: torch's x.add_(x), allowed
    assert t.tolist() == [2.0] * 4
    c = Tensor(np.ones(4, np.float32))
    assign_add(c[0:2], c[2:4])  # no shared memory: allowed
    assert c.tolist() == [2.0, 2.0, 1.0, 1.0]


def test_a_saved_tensor_written_in_place_is_reported_at_backward(assign_add):
    x = Tensor([1.0, 2.0], rt.float32)
    w = Tensor([3.0, 4.0], rt.float32).requires_grad_()
    y = w * x  # saves x for w's gradient
    assign_add(x, Tensor([1.0, 1.0], rt.float32))
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        y.sum().backward()


def test_a_declared_write_into_an_array_marked_read_only_is_refused(assign_add):
    a = np.ones(3, np.float32)
    a.flags.writeable = False
    with pytest.raises(ValueError, match=r"Custom 'AssignAdd' writes its input 0 in place \(its reg_info says "
                                         r"inplace\), but that array is read-only .*nothing was written"):
        assign_add(rt.from_numpy(a), Tensor([1.0, 1.0, 1.0], rt.float32))
    assert a.tolist() == [1.0, 1.0, 1.0]


def test_a_declared_write_into_a_bytes_buffer_is_refused(assign_add):
    b = np.ones(2, np.float32).tobytes()
    with pytest.raises(ValueError, match="writes its input 0 in place .* read-only"):
        assign_add(np.frombuffer(b, np.float32), np.ones(2, np.float32))
    assert b == np.ones(2, np.float32).tobytes()


def test_a_declared_write_into_a_read_only_memory_map_is_refused(assign_add, tmp_path):
    np.ones(3, np.float32).tofile(tmp_path / "data.bin")
    out = run_child("""
        m = np.memmap("data.bin", np.float32, mode="r")
        with pytest.raises(ValueError, match="Custom 'AssignAdd' writes its input 0 in place .* read-only"):
            declared(rt.from_numpy(m), Tensor(np.ones(3, np.float32)))
        print("refused")
    """, tmp_path)
    assert out == "refused\n"
    assert np.fromfile(tmp_path / "data.bin", np.float32).tolist() == [1.0, 1.0, 1.0]


def test_a_declared_write_needs_an_array_not_requiring_grad(assign_add):
    with pytest.raises(TypeError, match="Custom 'AssignAdd' writes its input 0 in place, so it must be a Tensor or "
                                        "a numpy array, not a float"):
        assign_add(1.0, Tensor(1.0))
    x = Tensor([1.0], rt.float32).requires_grad_()
    with pytest.raises(RuntimeError, match="writes its input 0 in place, and that input requires grad"):
        assign_add(x, Tensor([1.0], rt.float32))
    assert x.tolist() == [1.0]
    with rt.no_grad():
        assign_add(x, Tensor([1.0], rt.float32))
    assert x.tolist() == [2.0]


def test_a_declared_write_beyond_the_inputs_given():
    info = CustomRegOp("bad").input(1, "y", inplace=True).get_op_info()  # declares only input 1
    op = ops.Custom(f"{INPLACE}:AssignAdd", lambda x, y=None: x, lambda x, y=None: x, reg_info=info)
    with pytest.raises(TypeError, match=r"Custom 'AssignAdd' writes its input 1 in place .*but was called with 1 "
                                        r"input\(s\)"):
        op(np.ones(1, np.float32))


def test_inplace_must_be_a_bool():
    info = CustomRegOp("assign_add").input(0, "x", inplace="yes").input(1, "y").output(0, "out").get_op_info()
    with pytest.raises(ValueError, match=r"op-info 'assign_add': input x has inplace='yes'; it must be True or "
                                         r"False"):
        ops.Custom(f"{INPLACE}:AssignAdd", lambda x, y: x, lambda x, y: x, reg_info=info)


def test_a_pyfunc_writing_a_read_only_input_gets_numpys_error():
    def scale_(x):
        x *= 2
        return x

    a = np.ones(2)
    a.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        ops.Custom(scale_, func_type="pyfunc")(a)

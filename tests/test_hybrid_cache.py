"""Hybrid kernels and the builder's cache, across processes (each run a fresh child, the compiler a logging
wrapper): the first run compiles the kernel once; a new process, with a new shape, runs no compiler at all;
editing the kernel's code rebuilds it, editing only a comment does not."""
import subprocess
import sys
from pathlib import Path

from builder_util import child_env, wrapper_cxx
import pytest

pytestmark = pytest.mark.build  # every test here compiles, some in child processes (tests/build_guard.py)

KERNEL = """\
from runtime.ops import kernel

@kernel
def twice(x):
    # {comment}
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = x[i] * {factor}
    return y
"""

DRIVER = """\
import sys
import numpy as np
from runtime import Tensor, ops
from kmod import twice
n = int(sys.argv[1])
print(ops.Custom(twice)(Tensor(np.arange(n, dtype=np.float32))).asnumpy().tolist())
"""


def _run(tmp: Path, cxx: str, n: int) -> str:
    env = child_env(CXX=cxx)
    env["PYTHONPATH"] = f"{tmp}:{env['PYTHONPATH']}"
    res = subprocess.run([sys.executable, str(tmp / "driver.py"), str(n)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def _hybrid_compiles(log: Path) -> int:
    if not log.exists():
        return 0
    return sum(1 for line in log.read_text().splitlines() if " -c " in f" {line} " and "hybrid_twice" in line)


def test_warm_processes_compile_nothing_and_edits_rebuild(tmp_path):
    log = tmp_path / "cxx.log"
    cxx = wrapper_cxx(tmp_path, log)
    (tmp_path / "driver.py").write_text(DRIVER)
    (tmp_path / "kmod.py").write_text(KERNEL.format(comment="first", factor=2))

    assert _run(tmp_path, cxx, 3) == "[0.0, 2.0, 4.0]"
    assert _hybrid_compiles(log) == 1
    before = log.read_text()

    # a new process and a new shape: the same library, found in the cache; no compiler process at all
    assert _run(tmp_path, cxx, 5) == "[0.0, 2.0, 4.0, 6.0, 8.0]"
    assert log.read_text() == before

    # a comment edit changes nothing that is compiled
    (tmp_path / "kmod.py").write_text(KERNEL.format(comment="an edited comment", factor=2))
    assert _run(tmp_path, cxx, 2) == "[0.0, 2.0]"
    assert log.read_text() == before

    # a code edit: one new build, with the new code
    (tmp_path / "kmod.py").write_text(KERNEL.format(comment="first", factor=3))
    assert _run(tmp_path, cxx, 3) == "[0.0, 3.0, 6.0]"
    assert _hybrid_compiles(log) == 2


CALLEE = """\
from runtime.ops import kernel

@kernel
def inner(x):
    # {comment}
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = x[i] + {offset}
    return y
"""

CALLER = """\
from runtime.ops import kernel
from inner_mod import inner

@kernel
def twice(x):
    t = inner(x)
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = t[i] * 2
    return y
"""


def test_editing_a_called_dsl_function_rebuilds_the_caller_and_a_comment_edit_does_not(tmp_path):
    log = tmp_path / "cxx.log"
    cxx = wrapper_cxx(tmp_path, log)
    (tmp_path / "driver.py").write_text(DRIVER)
    (tmp_path / "kmod.py").write_text(CALLER)
    (tmp_path / "inner_mod.py").write_text(CALLEE.format(comment="first", offset=1))

    assert _run(tmp_path, cxx, 3) == "[2.0, 4.0, 6.0]"
    assert _hybrid_compiles(log) == 1
    before = log.read_text()

    (tmp_path / "inner_mod.py").write_text(CALLEE.format(comment="an edited comment", offset=1))
    assert _run(tmp_path, cxx, 2) == "[2.0, 4.0]"
    assert log.read_text() == before

    (tmp_path / "inner_mod.py").write_text(CALLEE.format(comment="first", offset=5))
    assert _run(tmp_path, cxx, 3) == "[10.0, 12.0, 14.0]"
    assert _hybrid_compiles(log) == 2

"""Making an aot or hybrid op compiles nothing: the compiled call path (aot_trampoline.py) is loaded at
the op's first call. An op made at a module's import (tests did it) compiled at import, and a failed
build there stopped a whole pytest session at collection."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parent.parent)

_USER_MODULE = '''
import numpy as np
from runtime import Tensor, ops
from runtime.hybrid import kernel


@kernel
def twice(x):
    y = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        y[i] = x[i] * 2.0
    return y


OP = ops.Custom(twice)
'''


@pytest.mark.build  # the child's first call compiles the call path and the kernel
def test_making_a_hybrid_op_compiles_nothing_until_its_first_call(tmp_path):
    (tmp_path / "user_ops.py").write_text(_USER_MODULE)
    cache = tmp_path / "cache"
    code = ("import os, sys, user_ops\n"
            "import runtime.ops.aot_trampoline as t\n"
            "made = (t._module is None, sorted(os.listdir(sys.argv[1])) if os.path.isdir(sys.argv[1]) else [])\n"
            "out = user_ops.OP(user_ops.Tensor(user_ops.np.ones(3, user_ops.np.float32)))\n"
            "print(repr((made, t._module is not None, out.asnumpy().tolist())))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, str(tmp_path)]), OPBUILDER_CACHE_DIR=str(cache))
    r = subprocess.run([sys.executable, "-c", code, str(cache)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    made, loaded, out = ast.literal_eval(r.stdout.strip().splitlines()[-1])
    assert made == (True, [])  # nothing loaded, nothing in the cache: no compiler ran
    assert loaded and out == [2.0, 2.0, 2.0]  # the first call built both and ran


def test_looking_at_a_pyfunc_op_loads_no_call_path(tmp_path):
    """A pyfunc op never needs the compiled call path: listing its attributes (inspect, a debugger)
    must not build it, nor fail where there is no compiler."""
    code = ("import inspect\nfrom runtime import ops\nimport runtime.ops.aot_trampoline as t\n"
            "op = ops.Custom(lambda x: x, lambda x: x, lambda x: x, func_type='pyfunc')\n"
            "inspect.getmembers(op)\nprint(repr(t._module is None))\n")
    env = dict(os.environ, PYTHONPATH=ROOT, OPBUILDER_CACHE_DIR=str(tmp_path / "cache"), CXX="/bin/false")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "True"


@pytest.mark.build  # the aot library
def test_a_call_path_that_cannot_load_is_tried_once_and_its_error_raised_alone(monkeypatch):
    """The error of a failed load is the call's error: no second build attempt while handling it
    (an `except self._failed` that loaded the path again built it twice and chained the errors)."""
    import runtime as rt
    from runtime import Tensor, ops
    from runtime.ops import custom

    src = Path(__file__).resolve().parent / "cpp" / "aot_thread_ops.cpp"
    op = ops.Custom(f"{src}:BySign", out_shape=[1], out_dtype=rt.float32)  # no Init: the call loads the path
    tries = []

    def failing():
        tries.append(1)
        raise RuntimeError(f"simulated load failure #{len(tries)}")

    monkeypatch.setattr(custom, "trampoline", failing)
    with pytest.raises(RuntimeError, match=r"^simulated load failure #1$") as e:
        op(Tensor([1.0]))
    assert tries == [1] and e.value.__context__ is None

"""``import runtime`` (and a first op call) imports only what that call needs (issue 24).

The rarely used submodules are lazy (PEP 562 ``__getattr__`` in the package ``__init__``): these tests
check, in a fresh child process, that they stay out of ``sys.modules`` and that every public name still
resolves to the same object as before.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# modules `import runtime` must not import (runtime's lazy ones, and what only they need)
LAZY = ["runtime.nn", "runtime.mint", "runtime.graph", "runtime.hybrid", "runtime.checkpoint", "runtime.cuda",
        "runtime.seed", "runtime.interop", "runtime.jit.function", "runtime.autograd.engine",
        "runtime.autograd.function", "runtime.autograd.functional", "runtime.autograd.gradcheck",
        "runtime.ops.custom", "runtime.ops.op_info", "runtime.ops.printing", "runtime.ops.aot_library",
        "runtime._native", "runtime.device_memory", "numpy.random", "json", "hashlib", "ctypes.util",
        "ml_dtypes"]
# modules a warm load() of a built operator and one call must not import (its C++ imports runtime._native;
# runtime.device_memory only for GPU tensors; nanobind's runtime is loaded by importer.py, without the module that
# builds it: issue 21, an import is ~0.1 ms of a 2 ms warm load())
LAZY_AFTER_CALL = [m for m in LAZY if m not in ("json", "runtime._native")] + ["opbuilder.inline",
                                                                            "opbuilder.bridges.interop_common", "torch", "jax",
                                                                            "dataclasses", "opbuilder.native.nanobind_runtime"]


def _child_value(code: str, cache_dir: str = ""):
    """The Python literal a fresh interpreter prints last after running ``code``."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    if cache_dir:
        env["OPBUILDER_CACHE_DIR"] = cache_dir
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    return ast.literal_eval(r.stdout.strip().splitlines()[-1])


def _imported(code: str, watch: List[str], cache_dir: str = "") -> List[str]:
    """Which of ``watch`` a fresh interpreter has in sys.modules after running ``code``."""
    return _child_value(code + f"\nimport sys\nprint(repr([m for m in {watch!r} if m in sys.modules]))\n",
                        cache_dir)


def test_import_runtime_leaves_lazy_modules_out():
    assert _imported("import runtime", LAZY) == []


def test_import_opbuilder_leaves_inline_out():
    assert _imported("import opbuilder", ["opbuilder.inline", "hashlib", "opbuilder.bridges.interop_common"]) == []


def test_import_opbuilder_creates_no_dataclass():
    # issue 21: creating dataclasses (and importing the module) at import left enough gen-0 objects that a
    # warm load() ran a gen-1 collection (~1 ms of a 2 ms goal); the build records are NamedTuples
    assert _imported("import opbuilder", ["dataclasses"]) == []


@pytest.mark.build
def test_first_call_imports_nothing_lazy(my_ops, cache_dir):
    code = ("import runtime\nfrom opbuilder import CustomOpBuilder\n"
            "m = CustomOpBuilder('my_ops', ['custom_src/function_ops.cpp']).load()\n"
            "assert m.mul(runtime.Tensor(2.0), runtime.Tensor(3.0)).item() == 6.0\n")
    assert _imported(code, LAZY_AFTER_CALL, str(cache_dir)) == []


# what only a build runs: a warm load from the cache imports none of it
BUILD_ONLY = {"opbuilder.needs", "opbuilder.compile.ninja_file", "opbuilder.compile.ninja_run",
              "opbuilder.compile.diagnostics", "opbuilder.compile.compiler_warnings", "opbuilder.cache.publish",
              "opbuilder.native.pch", "opbuilder.many", "opbuilder.cache.lock"}


@pytest.mark.build
def test_a_warm_load_imports_nothing_only_a_build_runs(my_ops, cache_dir):
    # issue 21: every warm load() of a nanobind operator imported opbuilder.needs (~0.1 ms of its ~2 ms) for
    # the libraries its record names; what the warm path runs is in modules `import opbuilder` loaded already
    # since issue 35, `from opbuilder import CustomOpBuilder` imports only what a shipped load needs, and a load
    # from the cache imports the builder's lookup then: none of it is what only a build runs
    code = ("import runtime, sys\nbefore = set(sys.modules)\nfrom opbuilder import CustomOpBuilder\n"
            "m = CustomOpBuilder('my_ops', ['custom_src/function_ops.cpp']).load()\n"
            "assert m.mul(runtime.Tensor(2.0), runtime.Tensor(3.0)).item() == 6.0\n"
            "print(repr(sorted(m for m in set(sys.modules) - before if m.split('.')[0] == 'opbuilder')))\n")
    from opbuilder.warm import RECORDS
    (Path(cache_dir) / "my_ops" / RECORDS).unlink(missing_ok=True)  # no warm record: the full lookup runs
    imported = _child_value(code, str(cache_dir))
    assert "opbuilder.builder" in imported  # the lookup ran (the test would pass vacuously otherwise)
    assert sorted(set(imported) & BUILD_ONLY) == []


def test_lazy_names_resolve_to_their_definitions():
    import runtime as rt
    from runtime import autograd, ops
    from runtime.autograd import engine, functional, gradcheck
    from runtime.checkpoint import save_checkpoint
    from runtime.jit import jit
    from runtime.ops.custom import Custom
    from runtime.seed import set_seed
    assert rt.value_and_grad is functional.value_and_grad and rt.grad is functional.grad
    assert rt.gradcheck is gradcheck.gradcheck and rt.GradcheckError is gradcheck.GradcheckError
    assert rt.save_checkpoint is save_checkpoint and rt.set_seed is set_seed
    assert rt.jit is jit and callable(rt.jit)  # the decorator, not the subpackage
    assert rt.nn.Cell.__module__ == "runtime.nn.cell" and rt.mint.add is not None
    assert rt.graph.Graph.__module__ == "runtime.graph.graph" and rt.hybrid.kernel is not None
    assert ops.Custom is Custom and autograd.grad is engine.grad and autograd.Function.__name__ == "Function"
    assert set(rt.__all__) <= set(dir(rt))


def test_star_import_and_jit_stay_functions_in_a_fresh_process():
    code = ("from runtime import *\nimport runtime\nimport runtime.jit.function\nimport runtime.nn\n"
            "assert callable(runtime.jit) and runtime.jit.__name__ == 'jit', runtime.jit\n"
            "assert callable(jit) and nn.Cell and value_and_grad and save_checkpoint and mint.add\n"
            "from runtime.ops import *\nassert Custom and print_ and DataType\n")
    assert _imported(code, []) == []


def test_unknown_attribute_is_an_attribute_error():
    import runtime as rt
    with pytest.raises(AttributeError, match=r"^module 'runtime' has no attribute 'no_such_name'$"):
        rt.no_such_name  # noqa: B018
    with pytest.raises(AttributeError, match=r"^module 'runtime.autograd' has no attribute 'nope'$"):
        rt.autograd.nope  # noqa: B018
    with pytest.raises(AttributeError, match=r"^module 'runtime.ops' has no attribute 'nope'$"):
        rt.ops.nope  # noqa: B018

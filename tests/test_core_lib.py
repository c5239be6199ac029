"""The core library (opbuilder/native/core_lib.py): the core's non-template functions compiled once for
every nanobind operator, keyed and tagged by the headers it compiles, rebuilt when damaged, and
found on the warm path through the operator's record (written by opbuilder/needs.py, read by
opbuilder/importer.py)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

import opbuilder.native.headers as headers
from builder_util import PYTHON, child_env, copied_session_cache
from op_util import CUSTOM_SRC, ROOT, load_op
from opbuilder import CustomOpBuilder
from opbuilder import builder as B
from opbuilder import needs
from opbuilder import importer
from opbuilder.importer import recorded
from opbuilder.native.abi import cxx_abi, python_api
from opbuilder.native.core_lib import CORE_FILE, core_spec, core_tag
from opbuilder.cache.published import INFO
from opbuilder.tools.toolchain import find_compiler, python_info
from opbuilder.cache.trust import stamp_of

pytestmark = pytest.mark.build  # the operators here compile (tests/build_guard.py)


def _tag_flag(plan) -> list:
    return [f for f in plan.flags if f.startswith("-DOB_CORE_TAG=")]


def _nb_spec(path: Path, cache: Path, **kw):
    path.write_text('#include "opbuilder/extension.h"\nOB_MODULE(m) {}\n')
    return CustomOpBuilder("nb_plan", [str(path)], build_dir=str(cache), **kw).spec


# ---- keys and tags ---------------------------------------------------------------------------------
def test_the_core_key_and_tag_change_when_a_core_header_changes(tmp_path, monkeypatch):
    include = tmp_path / "include"
    shutil.copytree(ROOT / "include", include)
    monkeypatch.setattr(headers, "_include_dir", include)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    cxx = find_compiler(cache)
    op = _nb_spec(tmp_path / "op.cpp", cache)

    def state():
        core = B._plan(core_spec(cache), cxx)
        tag = core_tag(headers.headers_digest(cache), cxx_abi(cxx, cache), python_api())
        return tag, B.fp.base_key(core.identity, B.fp.source_digests(core.sources), core.project), B._plan(op, cxx)

    tag1, key1, op1 = state()
    assert re.fullmatch(r"obcore_[0-9a-f]{16}", tag1)
    assert _tag_flag(op1) == [f"-DOB_CORE_TAG={tag1}"]  # the operator binds to this core's symbols
    bridge = include / "opbuilder" / "detail" / "runtime_bridge.h"
    bridge.write_text(bridge.read_text() + "\n// edited\n")
    tag2, key2, op2 = state()
    assert tag2 != tag1 and key2 != key1
    assert _tag_flag(op2) == [f"-DOB_CORE_TAG={tag2}"]


@pytest.mark.parametrize("kw", [{"cflags": ["-fsanitize=address"]}, {"cflags": ["-D_GLIBCXX_DEBUG"]},
                                {"cflags": ["-DOB_CORE_INLINE"]}, {"binding": "pybind11"}])
def test_builds_that_must_see_every_function_compile_the_core_inline(tmp_path, kw):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    spec = _nb_spec(tmp_path / "op.cpp", cache, **kw)
    assert _tag_flag(B._plan(spec, find_compiler(cache))) == []
    assert all(d.name != "_obcore" for d in B._dep_specs(spec))


# ---- one core library for every nanobind operator ---------------------------------------------------
@pytest.fixture(scope="module")
def nb_ops(cache_dir):
    return load_op("my_ops", [CUSTOM_SRC / "function_ops.cpp"])


def _dynamic_symbols(lib: Path, defined: bool) -> set:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    res = subprocess.run([nm, "-D", "--defined-only" if defined else "--undefined-only", str(lib)],
                         capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in res.stdout.splitlines()}


def test_a_nanobind_operator_takes_the_core_from_the_core_library_of_its_tag(nb_ops, cache_dir):
    b = CustomOpBuilder("my_ops", [str(CUSTOM_SRC / "function_ops.cpp")])
    core = Path(b.core_library())
    assert core.name == CORE_FILE and core.parent.parent == cache_dir / "_obcore.lib"
    tag = core_tag(headers.headers_digest(cache_dir), cxx_abi(find_compiler(cache_dir), cache_dir), python_api())
    needed = {s for s in _dynamic_symbols(Path(nb_ops.__file__), defined=False) if "obcore_" in s}
    assert needed, "the operator compiled the core itself"
    assert all(f"B{len(tag)}{tag}" in s for s in needed)  # every one names this core's tag
    assert needed <= _dynamic_symbols(core, defined=True)
    # the process says which core libraries it loaded (benchmarks/many.py's floor loads them first)
    assert core in importer.loaded_cores()
    # the operator defines none of the core's functions
    assert not any("RecordOutputs" in s or "TensorFromPy" in s for s in _dynamic_symbols(Path(nb_ops.__file__), True))


def test_a_nanobind_operator_reads_the_cores_runtime_inline(nb_ops, cache_dir):
    # issue 21: Runtime::Get out of line in libobcore.so cost every call ~30 ns; the operator reads the
    # core's exported pointer itself and calls only the slow path (Runtime::Load) into the core
    core = Path(CustomOpBuilder("my_ops", [str(CUSTOM_SRC / "function_ops.cpp")]).core_library())
    needed = _dynamic_symbols(Path(nb_ops.__file__), defined=False)
    pointer = {s for s in needed if "core_runtime" in s and "obcore_" in s}
    assert pointer and pointer <= _dynamic_symbols(core, defined=True)
    assert not any("7Runtime3Get" in s for s in needed)
    assert any("7Runtime4Load" in s for s in needed)



def _local_symbols(lib: Path) -> list:
    """The demangled names of the functions ``lib`` defines itself, hidden ones included (its .symtab)."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    res = subprocess.run([nm, "-C", "--defined-only", str(lib)], capture_output=True, text=True, check=True)
    return [line.split(" ", 2)[2] for line in res.stdout.splitlines() if line.count(" ") >= 2]


def test_a_nanobind_operator_compiles_only_the_code_of_its_own_types(nb_ops, cache_dir):
    # issue 21: every operator compiled Apply's whole body twice (Function<T>::RunChecked with Apply's
    # and with the jit replay's argument types), a second nanobind function for the replay, and the
    # non-template helpers (tensor conversions, dtype names, NeedGrad, error paths); those now live in
    # the core library and the operator keeps only what depends on its own types
    lib = Path(nb_ops.__file__)
    needed = {s for s in _dynamic_symbols(lib, defined=False) if "obcore_" in s}
    for core_fn in ("RunFunction", "TraceCall", "PrepareBackward", "LoadTensor", "DataTypeName", "NeedGrad",
                    "SaveForBackward"):
        assert any(core_fn in s for s in needed), f"{core_fn} is not taken from the core library"
    own = _local_symbols(lib)
    assert sum("RunChecked<" in s for s in own) <= 1, [s for s in own if "RunChecked<" in s]
    # the replay is the core's: no Function<T>::Traced function object (OB_MODULE's module type,
    # detail::TracedModule, is in the name of every function its body binds, and says nothing of that)
    assert not [s for s in own if "func_create" in s and "Traced" in s.replace("TracedModule", "")]
    # one function object per module function (custom_src/function_ops.cpp binds one): jit's replay runs the
    # module's own (detail/bound_call.h), not a second one compiled beside it
    impls = {s for s in own if "func_create" in s and re.search(r"cleanup_list\*\)#\d+\}::_FUN\(", s)
             and "clone" not in s}
    assert len(impls) == 1, impls
    # the wrapper m.def binds is two pointers, kept in nanobind's function record: no capture to free
    assert not [s for s in own if "func_create" in s and "{lambda(void*)#1}" in s]
    # a Function's per-type XLA FFI entry only where the module includes opbuilder/xla_ffi.h (OB_XLA_FFI's
    # handlers): to_jax's probe reads a per-module function of the replay target instead (~0.05 CPU-s)
    assert not [s for s in own if "FfiEntryOf<" in s]
    for helper in ("TensorFromDlpack(", "DataTypeName(", "AutogradContext::NeedGrad(", "Demangle(",
                   "RecordOutputs(", "TensorFromObject("):
        assert not [s for s in own if helper in s], f"the operator compiled {helper[:-1]} itself"


def test_a_nanobind_operator_leaves_returning_and_raising_to_the_core_library(nb_ops, cache_dir):
    # issue 38: each operator compiled TensorToObject (and the bridge's WrapForeign, ForeignOf and
    # contiguous_copy behind it), PythonError's destructor (Check's throw) and the exception
    # translator, ~0.1-0.15 CPU-s of a new operator's compile; the core library has them once. Each module
    # function's trace site too (its target cell, name, hook calls: ~0.13 CPU-s of a one-function operator)
    lib = Path(nb_ops.__file__)
    needed = {s for s in _dynamic_symbols(lib, defined=False) if "obcore_" in s}
    for core_fn in ("TensorToObject", "ThrowPythonError", "TranslateNeutral", "NewBoundSite", "BoundSiteDefined",
                    "RecordBoundCall", "StopBoundTrace"):
        assert any(core_fn in s for s in needed), f"{core_fn} is not taken from the core library"
    own = _local_symbols(lib)
    for helper in ("TensorToObject(", "WrapForeign(", "ForeignOf(", "Tensor::contiguous_copy(",
                   "PythonError::~PythonError(", "TranslateNeutral(", "TargetCell(", "BoundHook("):
        assert not [s for s in own if helper in s], f"the operator compiled {helper[:-1]} itself"


def test_an_operator_reads_none_of_the_headers_only_the_core_library_needs(tmp_path):
    # issue 38: the graph node (function_node.h), other frameworks' tensors coming in (dlpack_exchange.h)
    # and to_torch's tensors (foreign_tensor.h) are the core library's code. Every operator included them
    # and instantiated their templates at the end of its compile (with the allocation and device helpers
    # now in src/core/: an empty source with the installed PCH went from 0.24 to 0.14 CPU-s)
    import sysconfig

    import nanobind

    src = tmp_path / "op.cpp"
    src.write_text('#include "opbuilder/extension.h"\n')
    res = subprocess.run([*find_compiler(None).argv, "-std=c++17", "-M", "-DOB_BINDING_NANOBIND", "-DNB_SHARED", "-DOB_CORE_TAG=obcore_t",
                          "-DOB_CORE_CXX11_ABI=1", "-isystem", str(headers.include_dir()), "-isystem",
                          nanobind.include_dir(), "-isystem", sysconfig.get_paths()["include"], str(src)],
                         capture_output=True, text=True, check=True)
    read = {Path(p).name for p in res.stdout.replace("\\\n", " ").split()}
    assert {"extension.h", "autograd.h", "runtime_bridge.h"} <= read
    assert read & {"function_node.h", "function_runner.h", "dlpack_exchange.h", "foreign_tensor.h"} == set()


NEW_PROCESS = textwrap.dedent("""
    import sys
    import numpy as np
    from opbuilder import CustomOpBuilder
    from runtime import Tensor
    m = CustomOpBuilder("my_ops", [sys.argv[1]]).load()
    print(m.mul(Tensor(np.array([1.5, 2.0])), Tensor(np.array([2.0, 3.0]))).asnumpy().tolist())
""")


def test_a_damaged_core_library_is_built_again(nb_ops, cache_dir, tmp_path):
    cache = copied_session_cache(cache_dir, tmp_path / "cache")
    core = next(p for p in cache.glob(f"_obcore.lib/*/{CORE_FILE}") if p.parent.name != "build")
    data = bytearray(core.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    core.write_bytes(bytes(data))
    res = subprocess.run([PYTHON, "-c", NEW_PROCESS, str(CUSTOM_SRC / "function_ops.cpp")], capture_output=True,
                         text=True, timeout=600, env=child_env(OPBUILDER_CACHE_DIR=str(cache)))
    assert res.returncode == 0 and res.stdout.strip() == "[3.0, 6.0]", res.stdout + res.stderr
    assert "its SHA-256 is not the one published" in res.stderr
    rebuilt = json.loads((core.parent / INFO).read_text())["library"]
    import hashlib
    assert hashlib.sha256(core.read_bytes()).hexdigest() == rebuilt["sha256"]


WARM_NO_LOOKUP = textwrap.dedent("""
    import sys
    from opbuilder import builder
    def refuse(spec):
        raise AssertionError("looked up " + spec.name)
    builder._cached = refuse  # the libraries the operator loads first must come from its record
    from opbuilder import CustomOpBuilder
    from runtime import Tensor
    import numpy as np
    m = CustomOpBuilder("my_ops", [sys.argv[1]]).load()
    print(m.mul(Tensor(np.array([2.0])), Tensor(np.array([4.0]))).asnumpy().tolist())
    print(m.__file__)  # the build whose record was used (the cache may hold other builds of my_ops)
""")


def test_a_warm_load_takes_the_runtime_and_core_from_the_operators_record(nb_ops, cache_dir, tmp_path):
    cache = copied_session_cache(cache_dir, tmp_path / "cache")
    src = str(CUSTOM_SRC / "function_ops.cpp")
    env = child_env(OPBUILDER_CACHE_DIR=str(cache))
    first = subprocess.run([PYTHON, "-c", NEW_PROCESS, src], capture_output=True, text=True, timeout=600, env=env)
    assert first.returncode == 0, first.stderr  # copied files: looked up, then recorded again
    res = subprocess.run([PYTHON, "-c", WARM_NO_LOOKUP, src], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0 and res.stdout.splitlines()[0] == "[8.0]", res.stdout + res.stderr
    info = json.loads((Path(res.stdout.splitlines()[1]).parent / INFO).read_text())
    assert sorted(e["dir"] for e in info["needs"]) == ["_nanobind.lib", "_obcore.lib"]


# ---- the record is trusted only for what it can name --------------------------------------------------
def _recorded_layout(tmp_path: Path):
    root = tmp_path / "cache"
    key_dir = root / "op" / "0123456789abcdef01234567"
    key_dir.mkdir(parents=True)
    lib = key_dir / "op.so"
    lib.write_bytes(b"module")
    core = root / "_obcore.lib" / "89abcdef0123456789abcdef" / CORE_FILE
    core.parent.mkdir(parents=True)
    core.write_bytes(b"core")
    (key_dir / INFO).write_text(json.dumps({"library": {}}))
    return lib, core


def test_a_recorded_dependency_is_used_only_while_it_is_the_same_file(tmp_path):
    lib, core = _recorded_layout(tmp_path)
    needs.record(lib, [core])
    assert recorded(lib, ["_obcore.lib"]) == [core]
    assert recorded(lib, ["_obcore.lib", "_nanobind.lib"]) is None  # one never recorded
    core.unlink()
    core.write_bytes(b"CORE")  # replaced: another inode and times
    assert recorded(lib, ["_obcore.lib"]) is None


@pytest.mark.parametrize("entry", [
    {"dir": "_obcore.lib", "key": "../../elsewhere", "file": CORE_FILE},
    {"dir": "_obcore.lib", "key": "89abcdef0123456789abcdef", "file": "libevil.so"},
    {"dir": "evil.lib", "key": "89abcdef0123456789abcdef", "file": CORE_FILE},
])
def test_a_record_naming_anything_but_opbuilders_own_libraries_is_ignored(tmp_path, entry):
    lib, core = _recorded_layout(tmp_path)
    info = lib.parent / INFO
    info.write_text(json.dumps({"library": {}, "needs": [{**entry, "stamp": stamp_of(os.lstat(core))}]}))
    assert recorded(lib, [entry["dir"]]) is None


# ---- doctor -------------------------------------------------------------------------------------------
def _doctor(cache: Path) -> str:
    res = subprocess.run([PYTHON, "-m", "opbuilder", "doctor"], capture_output=True, text=True, timeout=300,
                         env=child_env(OPBUILDER_CACHE_DIR=str(cache)))
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def test_doctor_says_whether_nanobind_and_the_libraries_its_operators_load_are_there(nb_ops, cache_dir, tmp_path):
    import nanobind

    out = _doctor(cache_dir)
    assert f"ok    nanobind: {nanobind.__version__} (" in out
    core = CustomOpBuilder("my_ops", [str(CUSTOM_SRC / "function_ops.cpp")]).core_library()
    assert f"ok    opbuilder core library: built for this toolchain ({core})" in out
    assert re.search(r"^ok    nanobind runtime: built for this toolchain \(.*/_nanobind\.lib/\w+/libnanobind\.so\)$",
                     out, re.M), out
    fresh = tmp_path / "fresh"
    fresh.mkdir(mode=0o700)
    out = _doctor(fresh)
    assert "ok    opbuilder core library: not built for this toolchain yet: the first nanobind operator's " \
           "load() builds it once (seconds)" in out


# ---- two versions in one process ----------------------------------------------------------------------
TWO_VERSIONS = textwrap.dedent("""
    import sys
    from pathlib import Path
    import numpy as np
    import opbuilder.native.headers as headers
    from opbuilder import CustomOpBuilder
    from runtime import Tensor
    ops = [CustomOpBuilder("mix_a", [sys.argv[1]]).load()]
    headers._include_dir = Path(sys.argv[2])  # opbuilder's headers, edited: another core library
    ops.append(CustomOpBuilder("mix_b", [sys.argv[1]]).load())
    for m in ops:
        try:
            m.mul(np.ones(2, np.longdouble), Tensor(np.ones(2)))  # float128: no runtime dtype
        except TypeError as e:
            print(str(e).split(";")[0])
""")


def test_operators_built_from_other_headers_each_use_their_own_core_in_one_process(nb_ops, cache_dir, tmp_path):
    """Both core libraries are loaded with RTLD_GLOBAL; each operator must bind to the one built from
    its headers (the tag in the symbol names), never to the first one loaded."""
    cache = copied_session_cache(cache_dir, tmp_path / "cache")  # its runtime and core library; the session's cache keeps one
    include = tmp_path / "include"
    shutil.copytree(ROOT / "include", include)
    bridge = include / "opbuilder" / "detail" / "runtime_bridge.h"
    text = bridge.read_text()
    assert '"opbuilder: unsupported tensor dtype "' in text
    bridge.write_text(text.replace('"opbuilder: unsupported tensor dtype "',
                                   '"opbuilder (edited headers): unsupported tensor dtype "'))
    res = subprocess.run([PYTHON, "-c", TWO_VERSIONS, str(CUSTOM_SRC / "function_ops.cpp"), str(include)],
                         capture_output=True, text=True, timeout=900,
                         env=child_env(OPBUILDER_CACHE_DIR=str(cache), OPBUILDER_PCH="0"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["opbuilder: unsupported tensor dtype float128",
                                       "opbuilder (edited headers): unsupported tensor dtype float128"]
    assert len([p for p in cache.glob(f"_obcore.lib/*/{CORE_FILE}") if p.parent.name != "build"]) == 2

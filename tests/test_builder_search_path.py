"""Files that change a build without being edited: a header created earlier on the include search path
(it shadows the one the build used), a file that __has_include asked for, headers of a user -isystem
directory, a static archive linked in. Each must make the next load() rebuild (never a stale module),
and nothing else may."""
import ctypes
import json
import subprocess
from pathlib import Path

from builder_util import compiled_sources, tiny_module, wrapper_cxx
from opbuilder import CustomOpBuilder, build_library
import pytest

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)


def _manifest_headers(cache: Path, name: str):
    """Every name recorded in the operator's manifests."""
    out = set()
    for m in (cache / name / "deps").glob("*.json"):
        out.update(json.loads(m.read_text())["headers"])
    return out


def test_a_header_created_earlier_on_the_include_path_is_used(tmp_path, monkeypatch):
    log = tmp_path / "cxx.log"
    monkeypatch.setenv("CXX", wrapper_cxx(tmp_path, log))
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (second / "cfg.h").write_text("#define CFG 2\n")
    src = tiny_module(tmp_path / "shadow_op.cpp", "CFG", includes='#include "cfg.h"')
    builder = CustomOpBuilder("shadow_op", [src], include_paths=[first, second], build_dir=tmp_path / "cache")
    assert builder.load().value() == 2
    log.write_text("")
    assert builder.load().value() == 2 and compiled_sources(log) == []  # nothing new: nothing compiled

    (first / "cfg.h").write_text("#define CFG 1\n")  # found before second/cfg.h from now on
    assert builder.load().value() == 1
    assert compiled_sources(log) == ["shadow_op.cpp"]
    (tmp_path / "cfg.h").write_text("#define CFG 0\n")  # beside the source: found first by #include "..."
    assert builder.load().value() == 0
    log.write_text("")
    assert builder.load().value() == 0 and compiled_sources(log) == []

    (tmp_path / "cfg.h").unlink()
    (first / "cfg.h").unlink()
    assert builder.load().value() == 2


def test_a_file_that_has_include_asked_for_is_used_once_it_exists(tmp_path):
    src = tiny_module(tmp_path / "has_op.cpp", "CFG", includes='#if __has_include("opt.h")\n#include "opt.h"\n'
                                                               '#else\n#define CFG 1\n#endif')
    builder = CustomOpBuilder("has_op", [src], build_dir=tmp_path / "cache")
    assert builder.load().value() == 1
    (tmp_path / "opt.h").write_text("#define CFG 2\n")
    assert builder.load().value() == 2
    (tmp_path / "opt.h").unlink()
    assert builder.load().value() == 1


def test_a_header_in_a_user_isystem_directory_is_tracked(tmp_path):
    inc = tmp_path / "vendor"
    inc.mkdir()
    (inc / "vendor.h").write_text("#define CFG 1\n")
    src = tiny_module(tmp_path / "isys_op.cpp", "CFG", includes="#include <vector>\n#include <vendor.h>")
    builder = CustomOpBuilder("isys_op", [src], cflags=["-isystem", str(inc)], build_dir=tmp_path / "cache")
    assert builder.load().value() == 1
    (inc / "vendor.h").write_text("#define CFG 2\n")
    assert builder.load().value() == 2
    # the compiler's own headers (<vector>, libc's) are keyed by its identity, not hashed on every load:
    # what is recorded is in the project (named relative to it)
    recorded = _manifest_headers(tmp_path / "cache", "isys_op")
    assert "vendor/vendor.h" in recorded and not [h for h in recorded if h.startswith("/")], recorded


def test_a_shadowing_header_recompiles_only_the_object_that_includes_it(tmp_path, monkeypatch):
    log = tmp_path / "cxx.log"
    monkeypatch.setenv("CXX", wrapper_cxx(tmp_path, log))
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (second / "base.h").write_text("#define BASE 200\n")
    (tmp_path / "a.cpp").write_text('#include <base.h>\nextern "C" int a_value() { return BASE; }\n')
    (tmp_path / "b.cpp").write_text('extern "C" int b_value() { return 7; }\n')
    args = ("shadow_lib", [tmp_path / "a.cpp", tmp_path / "b.cpp"])
    kw = dict(include_paths=[first, second], build_dir=tmp_path / "cache")
    lib = ctypes.CDLL(build_library(*args, **kw))
    assert (lib.a_value(), lib.b_value()) == (200, 7)
    log.write_text("")
    (first / "base.h").write_text("#define BASE 100\n")
    lib = ctypes.CDLL(build_library(*args, **kw))
    assert (lib.a_value(), lib.b_value()) == (100, 7)
    assert compiled_sources(log) == ["a.cpp"]  # b.cpp's object was current, a.cpp's was not


def _archive(directory: Path, value: int) -> Path:
    """``directory/libhelper.a`` holding ``int helper()`` returning ``value``."""
    (directory / "helper.cpp").write_text(f"int helper() {{ return {value}; }}\n")
    subprocess.run(["c++", "-fPIC", "-c", str(directory / "helper.cpp"), "-o", str(directory / "helper.o")],
                   check=True)
    (directory / "libhelper.a").unlink(missing_ok=True)
    subprocess.run(["ar", "rcs", str(directory / "libhelper.a"), str(directory / "helper.o")], check=True)
    return directory / "libhelper.a"


def test_a_static_archive_rebuilt_is_linked_again(tmp_path, monkeypatch):
    log = tmp_path / "cxx.log"
    monkeypatch.setenv("CXX", wrapper_cxx(tmp_path, log))
    libs = tmp_path / "libs"
    libs.mkdir()
    archive = _archive(libs, 1)
    src = tiny_module(tmp_path / "arch_op.cpp", "helper()", decls="int helper();")
    by_l = CustomOpBuilder("arch_op", [src], ldflags=[f"-L{libs}", "-lhelper"], build_dir=tmp_path / "cache")
    by_path = CustomOpBuilder("arch_op", [src], ldflags=[str(archive)], build_dir=tmp_path / "cache")
    assert by_l.load().value() == 1 and by_path.load().value() == 1
    _archive(libs, 2)
    assert by_l.load().value() == 2 and by_path.load().value() == 2
    log.write_text("")
    assert by_l.load().value() == 2 and log.read_text() == ""  # then warm: no compile, no link

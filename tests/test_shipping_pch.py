"""The precompiled opbuilder/extension.h installed with opbuilder (native/pch.py, install_build.py): the
first operator in a fresh cache compiles with it, and a build it does not fit (another flag, another
compiler) or a PCH that is not to be trusted falls back to the cache's own.

One module fixture runs what ``pip install`` runs (install_build.build_native: nanobind's runtime, the
core library and the PCH, into a temporary ``_native``), and the tests point opbuilder's installed
runtime at it."""
from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from opbuilder import CustomOpBuilder
from opbuilder.native import installed, pch

pytestmark = pytest.mark.build

SOURCE = """#include "opbuilder/extension.h"
using namespace opbuilder;
TensorPtr add_one(const TensorPtr &x) {
  auto y = Tensor::empty_like(x);
  const float *a = x->data<float>();
  float *o = y->data<float>();
  for (int64_t i = 0; i < x->numel(); ++i) o[i] = a[i] + 1;
  return y;
}
OB_MODULE(m) { m.def("add_one", &add_one); }
"""


@pytest.fixture(scope="module")
def native_dir(tmp_path_factory, cache_dir):
    """A ``_native`` directory as ``pip install`` of opbuilder makes it, with its PCH. Its compiles go
    through tests/compile_memo.py: tests/ship_util.py's wheel (this Python, these files) reuses them."""
    from compile_memo import launcher_env
    from opbuilder.native.install_build import build_native
    from opbuilder.tools.toolchain import find_compiler

    if not pch.enabled():
        pytest.skip("OPBUILDER_PCH is off")
    probe = tmp_path_factory.mktemp("probe")
    if find_compiler(probe).family != "gcc":
        pytest.skip("the precompiled header is made with gcc only (native/pch.py)")
    dest = tmp_path_factory.mktemp("site") / "_native"
    from opbuilder import builder as B
    from opbuilder.native import headers
    build, digest = B._build_checked, headers.headers_digest
    started = []

    def spy_build(*a, **k):
        started.append(True)
        return build(*a, **k)

    def spy_digest(*a, **k):
        import sys
        # who asked (installed.current_abi writes the record's), and whether a build had started then
        _DIGESTS.append((sys._getframe(1).f_code.co_name, bool(started)))
        return digest(*a, **k)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(B, "_build_checked", spy_build)
        mp.setattr(headers, "headers_digest", spy_digest)
        for k, v in launcher_env(cache_dir.parent).items():
            mp.setenv(k, v)
        record = build_native(dest)
    assert "pch" in record, "build_native made no precompiled header"
    _RECORD.update(record)
    return dest


_DIGESTS: list = []
_RECORD: dict = {}


def test_the_record_keys_the_headers_as_they_were_before_the_builds(native_dir):
    """A header edited while the install builds must leave a record that fits no headers (load() then
    builds its own), never one that vouches for a library built from other headers: native.json keeps
    the digest taken before the builds read them (an install during an edit gave "undefined symbol")."""
    for_record = [was_started for who, was_started in _DIGESTS if who == "current_abi"]
    assert for_record == [False] and "headers" in _RECORD["abi"]


@pytest.fixture
def use_native(native_dir, monkeypatch):
    """opbuilder's installed runtime (and PCH) is ``native_dir`` in this test (conftest turns it off)."""
    from opbuilder import importer

    monkeypatch.setenv("OPBUILDER_INSTALLED_RUNTIME", "1")
    monkeypatch.setattr(installed, "NATIVE_DIR", native_dir)
    monkeypatch.setattr(importer, "NATIVE_DIR", str(native_dir))
    monkeypatch.setattr(installed, "_memo", {})
    return native_dir


def _build(tmp_path: Path, **kw) -> Path:
    """Build the operator in a fresh cache under ``tmp_path``; its build.ninja's text."""
    src = tmp_path / "src" / "first_op.cpp"
    src.parent.mkdir(exist_ok=True)
    src.write_text(SOURCE)
    cache = tmp_path / "cache"
    CustomOpBuilder("first_op", [str(src)], build_dir=str(cache), **kw).build()
    return cache


def _includes(cache: Path) -> str:
    build = cache / "first_op" / "build"
    text = (build / "build.ninja").read_text()
    return text, (build / "build.log").read_text() if (build / "build.log").exists() else ""


def test_the_first_build_in_a_fresh_cache_compiles_with_the_installed_pch(use_native, tmp_path):
    cache = _build(tmp_path)
    text, log = _includes(cache)
    build = cache / "first_op" / "build"
    assert f"-include {os.path.relpath(use_native / 'pch.h', build)} " in text
    assert "pch.h.gch" not in log  # -Winvalid-pch: gcc says so when it finds the .gch and cannot use it
    assert not (cache / ".pch").exists()  # nothing to precompile in the background: the cache has none


def test_another_flag_uses_the_caches_pch_not_the_installed_one(use_native, tmp_path):
    cache = _build(tmp_path, cflags=["-DOB_TEST_OTHER_FLAG=1"])
    text, _ = _includes(cache)
    assert str(use_native) not in text and "_native/pch.h" not in text
    assert "-include ../../.pch/" in text


def test_another_compiler_uses_the_caches_pch_not_the_installed_one(use_native, tmp_path, monkeypatch):
    from opbuilder.tools.toolchain import find_compiler

    gxx = find_compiler(tmp_path).path
    wrapper = tmp_path / "bin" / "g++"  # the same gcc behind another path: another compiler identity
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {gxx} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    cache = _build(tmp_path)
    text, _ = _includes(cache)
    assert "_native/pch.h" not in text and "-include ../../.pch/" in text


def test_the_installed_pch_is_refused_unless_its_record_and_files_fit(use_native, tmp_path):
    rec = json.loads((use_native / "native.json").read_text())["pch"]
    assert pch.installed(rec["key"], rec["compiler"]).gch == use_native / "pch.h.gch"
    assert pch.installed("0" * 24, rec["compiler"]) is None  # another key: other flags, headers, Python
    assert pch.installed(rec["key"], "/usr/bin/other-g++ 9.9") is None  # another compiler
    copy = tmp_path / "_native"
    shutil.copytree(use_native, copy)
    gch = copy / "pch.h.gch"
    installed._memo.clear()
    installed.NATIVE_DIR = copy  # restored by use_native's monkeypatch
    assert pch.installed(rec["key"], rec["compiler"]) is not None
    gch.chmod(gch.stat().st_mode | stat.S_IWOTH)  # writable by others: not trusted
    assert pch.installed(rec["key"], rec["compiler"]) is None
    gch.chmod(0o644)
    with open(gch, "r+b") as f:  # cut short: not the file recorded
        f.truncate(rec["size"] - 1)
    assert pch.installed(rec["key"], rec["compiler"]) is None
    gch.unlink()
    gch.symlink_to(use_native / "pch.h.gch")  # a link: refused, as in the cache
    assert pch.installed(rec["key"], rec["compiler"]) is None


def test_installed_runtime_off_turns_the_installed_pch_off(use_native, monkeypatch):
    rec = json.loads((use_native / "native.json").read_text())["pch"]
    monkeypatch.setenv("OPBUILDER_INSTALLED_RUNTIME", "0")
    assert pch.installed(rec["key"], rec["compiler"]) is None

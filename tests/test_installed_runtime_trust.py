"""How opbuilder's installed runtime (native/installed.py) is trusted: a shipped load() takes files only
the owner of opbuilder's code can write, of the sizes native.json records, without hashing them; any
other file is hashed, and a build that links them (``library_for``) and ``opbuilder doctor`` always
hash them. No compiler: the "libraries" are bytes, never loaded."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from opbuilder.cache.file_hash import HASH, file_hash
from opbuilder.native import installed

FILES = {"libnanobind.so": b"\x7fELF runtime" * 100, "libobcore.so": b"\x7fELF core" * 120}
ABI = {"python": "p", "nanobind": "n", "cxx": "c", "headers": "h"}
MISSING = (f"opbuilder's installed runtime is missing or was modified ({installed.NATIVE_DIR}: reinstall opbuilder "
           f"with a C++ compiler present)")


@pytest.fixture
def native(tmp_path, monkeypatch) -> Path:
    """``<pkg>/_native`` as an install writes it (files, hashes, sizes), ``<pkg>`` standing for
    opbuilder's own code (owned by whoever runs the test)."""
    pkg = tmp_path / "opbuilder"
    d = pkg / "_native"
    d.mkdir(parents=True)
    for name, data in FILES.items():
        (d / name).write_bytes(data)
        (d / name).chmod(0o644)
    record = {"abi": ABI, "files": {n: file_hash(d / n) for n in FILES}, "sizes": {n: len(b) for n, b in FILES.items()},
              "hash": HASH}
    (d / installed.MANIFEST).write_text(json.dumps(record))
    d.chmod(0o755)
    monkeypatch.setattr(installed, "_PKG_DIR", pkg)
    return d


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def test_an_intact_runtime_serves_hashed_and_by_owner(native):
    for by_owner in (False, True):
        got = installed.installed(native, by_owner=by_owner)
        assert got is not None and got.dir == native and got.runtime == native / "libnanobind.so"
        assert installed.why_not(got, ABI) is None


def test_a_same_size_edit_is_refused_where_the_files_are_hashed(native):
    # a build that links the runtime (library_for), the installed PCH and doctor hash: refused there.
    # A shipped load trusts the owner's files by size (whoever wrote it could write opbuilder's code too)
    _flip_last_byte(native / "libobcore.so")
    assert installed.installed(native) is None
    assert installed.why_not(installed.installed(native), ABI) == MISSING
    assert installed.installed(native, by_owner=True) is not None


def test_a_file_of_another_size_is_refused_by_owner(native):
    with open(native / "libnanobind.so", "ab") as f:
        f.write(b"\0")
    assert installed.installed(native, by_owner=True) is None
    assert installed.why_not(installed.installed(native, by_owner=True), ABI) == MISSING


@pytest.mark.parametrize("where", ["file", "directory"])
def test_a_runtime_others_can_write_is_hashed_by_owner_too(native, where):
    _flip_last_byte(native / "libobcore.so")
    target = native / "libobcore.so" if where == "file" else native
    target.chmod(stat.S_IMODE(target.stat().st_mode) | stat.S_IWGRP)
    assert installed.installed(native, by_owner=True) is None
    target.chmod(stat.S_IMODE(target.stat().st_mode) & ~stat.S_IWGRP)
    assert installed.installed(native, by_owner=True) is not None  # the owner's alone again: by size


def test_a_runtime_of_another_owner_than_the_code_is_hashed(native, monkeypatch, tmp_path):
    other = tmp_path / "code"
    other.mkdir()
    real_stat = os.stat

    def stat_as_other(path, *a, **k):  # opbuilder's code owned by someone else than the runtime's files
        st = real_stat(path, *a, **k)
        if Path(path) == other:
            return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid + 1, *st[5:]))
        return st
    monkeypatch.setattr(installed, "_PKG_DIR", other)
    monkeypatch.setattr(installed.os, "stat", stat_as_other)
    assert installed.installed(native, by_owner=True) is not None  # intact: hashed, and it serves
    _flip_last_byte(native / "libobcore.so")
    assert installed.installed(native, by_owner=True) is None


def test_a_link_in_place_of_a_library_is_refused(native, tmp_path):
    real = tmp_path / "elsewhere.so"
    real.write_bytes(FILES["libnanobind.so"])
    (native / "libnanobind.so").unlink()
    (native / "libnanobind.so").symlink_to(real)
    assert installed.installed(native, by_owner=True) is None  # not a regular file: hashed, and no link is followed
    assert installed.installed(native) is None


def test_a_record_without_sizes_is_hashed_by_owner(native):
    record = json.loads((native / installed.MANIFEST).read_text())
    del record["sizes"]
    (native / installed.MANIFEST).write_text(json.dumps(record))
    assert installed.installed(native, by_owner=True) is not None
    _flip_last_byte(native / "libobcore.so")
    assert installed.installed(native, by_owner=True) is None


@pytest.mark.build  # (doctor probes the compiler's C++ library ABI, as load() does)
def test_doctor_says_when_the_installed_runtime_does_not_serve_a_build_here(native, monkeypatch):
    # it said "ok installed runtime" for one built for other headers (a checkout edited since its install),
    # which load() does not use
    from opbuilder.diagnose import doctor
    from opbuilder.native.abi import python_api
    monkeypatch.setattr(installed, "NATIVE_DIR", native)
    monkeypatch.setattr(installed, "_memo", {})
    monkeypatch.setenv("OPBUILDER_INSTALLED_RUNTIME", "1")
    check = doctor._installed_runtime()
    assert check.status == "note"
    assert check.detail == (f"{native} does not serve operators built here: opbuilder's installed runtime was built "
                            f"for python 'p', this build needs {python_api()!r}; the first load() builds nanobind's "
                            f"runtime and the core library in the cache")
    assert check.fix == "reinstall opbuilder (pip install -e . in a checkout) to rebuild it"

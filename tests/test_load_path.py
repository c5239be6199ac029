"""What a load() runs in a new process, kept small (issues 35 and 38): ``import opbuilder`` is two modules,
a shipped binary is still checked by its hash before it is loaded, and the helpers moved onto that path
(spec.BuildSpec written out, the package walk of cache/shipped.py) behave as before. No compiler."""
from __future__ import annotations

import json
import marshal
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from op_util import ROOT

from opbuilder import CustomOpBuilder
from opbuilder.cache import shipped
from opbuilder.spec import BuildSpec


def test_import_opbuilder_imports_the_package_and_spec_only():
    """The package defines CustomOpBuilder (custom_op.py was a third module, ~0.3 M instructions: issue 35)."""
    code = "import sys, opbuilder; print(sorted(m for m in sys.modules if m.startswith('opbuilder')))"
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "['opbuilder', 'opbuilder.spec']"


def test_a_warm_load_imports_no_package_of_opbuilder_but_opbuilder():
    """The warm record's check is opbuilder.warm (not in the cache package: a package is one more module to
    import, issue 38), and it imports no other module: the load itself is spec.py's (importer.py, the
    shipped check, is ~1 M instructions of a new process); opbuilder.cache.warm is the same module."""
    code = ("import sys, opbuilder\nfrom opbuilder.warm import module\n"
            "print(sorted(m for m in sys.modules if m.startswith('opbuilder')))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "['opbuilder', 'opbuilder.spec', 'opbuilder.warm']"
    from opbuilder import warm
    from opbuilder.cache import warm as old
    assert old is warm and warm._PKG_DIR == str(ROOT / "opbuilder")


def test_the_old_homes_of_moved_names_still_give_them():
    from opbuilder import importer, spec
    from opbuilder.cache import cache_dir, file_hash, json_record, relocate, shipped_record
    from opbuilder.native import abi, core_lib

    assert cache_dir.cache_root is spec.cache_root and relocate.clean_path is spec.clean_path
    assert shipped_record.find_record is spec.find_record and shipped_record.no_build is spec.no_build
    assert file_hash.file_hash is shipped.file_hash and json_record.loads is shipped.loads
    assert abi.python_api is importer.python_api and core_lib.preload is importer.preload_core
    from opbuilder import recorded_deps
    assert importer.recorded is recorded_deps.recorded and importer.loads is json_record.loads
    assert core_lib.CORE_FILE == importer.CORE_FILE == "libobcore.so"
    # the load both paths end with is spec.py's, handed on by importer.py under the same names
    assert importer.import_build is spec.import_build and importer.preload is spec.preload
    assert importer.loaded_modules is spec.loaded_modules and importer.loaded_runtime is spec.loaded_runtime


def _spec(tmp_path: Path) -> BuildSpec:
    src = tmp_path / "op.cpp"
    src.write_text("// op\n")
    return CustomOpBuilder("op", [str(src)], cflags=["-DX=1"], build_dir=str(tmp_path / "cache")).spec


def test_build_spec_keeps_the_named_tuple_api(tmp_path):
    spec = _spec(tmp_path)
    assert spec._fields[0] == "name" and spec.name == spec[0] == "op" and spec.binding is None
    assert spec.cflags == ("-DX=1",) and spec.op_dir == tmp_path / "cache" / "op"
    other = spec._replace(binding="pybind11", debug=True)
    assert (other.binding, other.debug, other.name, type(other)) == ("pybind11", True, "op", BuildSpec)
    assert spec._asdict()["root"] == tmp_path / "cache" and len(spec._asdict()) == 12
    assert pickle.loads(pickle.dumps(spec)) == spec and hash(spec._replace()) == hash(spec)
    assert repr(spec).startswith("BuildSpec(name='op', sources=(") and repr(spec).endswith(", binding=None)")
    with pytest.raises(ValueError) as e:
        spec._replace(nope=1)
    assert str(e.value) == "Got unexpected field names: ['nope']"


def _package(tmp_path: Path, binary: bytes):
    """A package as a wheel installs it: one source, a binary, a record (pybind11: no installed runtime asked)."""
    from opbuilder.tools.toolchain import python_abi

    top = tmp_path / "pkg"
    (top / "csrc").mkdir(parents=True)
    src = top / "csrc" / "op.cpp"
    src.write_text("// op\n")
    lib = top / shipped.BIN_DIR / "op.so"
    lib.parent.mkdir()
    lib.write_bytes(binary)
    spec = CustomOpBuilder("op", [str(src)], binding="pybind11").spec
    entry = shipped.record_entry(spec, top, f"{shipped.BIN_DIR}/op.so", lib,
                                 {"binding": "pybind11", "python": python_abi()}, False)
    record = top / shipped.RECORD
    data = {"format": 1, "hash": shipped.HASH, "ops": {"op": entry}}
    record.write_text(json.dumps(data))
    (top / "opbuilder_ops.rec").write_bytes(shipped.record_copy(data))  # as build_meta writes it: what load() reads
    return spec, record, lib


def test_a_shipped_binary_edited_in_place_same_size_is_refused(tmp_path):
    spec, record, lib = _package(tmp_path, b"\x7fELF not loaded here" * 50)
    binary, entry, why = shipped._fit(spec, record)
    assert (binary, why) == (lib, "") and entry["file"] == f"{shipped.BIN_DIR}/op.so"
    data = bytearray(lib.read_bytes())
    data[-1] ^= 0xFF
    lib.write_bytes(bytes(data))  # same size, same owner
    assert shipped._fit(spec, record) == (None, None, f"its binary {lib} was modified after it was built (its hash "
                                                      f"is not the one recorded): it is never loaded")


def test_a_shipped_binary_is_checked_against_the_records_copy_that_load_reads(tmp_path):
    """The marshal copy (opbuilder_ops.rec) is what a shipped load() reads: a copy whose hash is another
    binary's (a record swapped in) refuses the binary, even when the JSON beside it fits."""
    spec, record, lib = _package(tmp_path, b"\x7fELF not loaded here" * 50)
    data = json.loads(record.read_text())
    data["ops"]["op"]["hash"] = shipped.file_hash(record)  # another file's hash
    (record.parent / "opbuilder_ops.rec").write_bytes(shipped.record_copy(data))
    assert shipped._fit(spec, record) == (None, None, f"its binary {lib} was modified after it was built (its hash "
                                                      f"is not the one recorded): it is never loaded")


@pytest.mark.parametrize("copy", ["group-writable", "link", "truncated", "older tag", "not a tuple", "absent"])
def test_a_records_copy_not_as_written_is_not_read_and_the_json_is(tmp_path, copy):
    """A copy that is not a regular file only its directory's owner can write, with this opbuilder's tag and
    a whole record, is ignored: the JSON is read (and it checks the binary as before)."""
    from opbuilder.importer import RECORD_COPY, read_record

    spec, record, lib = _package(tmp_path, b"\x7fELF not loaded here" * 50)
    rec = record.parent / "opbuilder_ops.rec"
    wrong = {"format": 1, "hash": shipped.HASH, "ops": {}}  # what the copy holds where it is not to be read
    data = shipped.record_copy(wrong)
    if copy == "group-writable":
        rec.write_bytes(data)
        rec.chmod(0o664)
    elif copy == "link":
        other = tmp_path / "elsewhere.rec"
        other.write_bytes(data)
        rec.unlink()
        rec.symlink_to(other)
    elif copy == "truncated":
        rec.write_bytes(data[:-7])
    elif copy == "older tag":
        rec.write_bytes(marshal.dumps(("opbuilder-record-0", wrong)))
    elif copy == "not a tuple":
        rec.write_bytes(marshal.dumps(wrong))
    else:
        rec.unlink()
    assert RECORD_COPY == "opbuilder-record-1"
    assert read_record(str(record)) == json.loads(record.read_text())
    binary, _, why = shipped._fit(spec, record)
    assert (binary, why) == (lib, "")
    lib.write_bytes(lib.read_bytes()[:-1] + b"!")  # the JSON's check still refuses a modified binary
    assert shipped._fit(spec, record)[2] == (f"its binary {lib} was modified after it was built (its hash is not the "
                                             f"one recorded): it is never loaded")


def test_a_truncated_record_and_copy_are_a_no_build_error_in_a_new_process(tmp_path):
    """A record cut short (and its copy) is not read: under OPBUILDER_NO_BUILD=1 a NoBuildError naming it, in a
    process that has not imported json (it was a SystemError from _json's scanner there)."""
    spec, record, lib = _package(tmp_path, b"\x7fELF not loaded here" * 50)
    for f in (record, record.parent / "opbuilder_ops.rec"):
        data = f.read_bytes()
        f.write_bytes(data[:len(data) // 2])
    code = ("import sys\nfrom opbuilder import CustomOpBuilder\nfrom opbuilder.errors import NoBuildError\n"
            "try:\n    CustomOpBuilder('op', [sys.argv[1]], binding='pybind11', build_dir=sys.argv[2]).load()\n"
            "except NoBuildError as e:\n    print(e.reason)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPBUILDER_")}
    env.update(PYTHONPATH=str(ROOT), OPBUILDER_NO_BUILD="1")
    res = subprocess.run([sys.executable, "-c", code, str(spec.sources[0]), str(tmp_path / "no-cache")], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"its record {record} cannot be read (") and "(char " in res.stdout, res.stdout


def test_a_record_of_another_hash_is_never_loaded(tmp_path, monkeypatch):
    """A record (and its copy) from an opbuilder that hashed otherwise: not read as this one's, so the
    binary is not loaded; under OPBUILDER_NO_BUILD=1 a NoBuildError says why."""
    from opbuilder.errors import NoBuildError

    spec, record, lib = _package(tmp_path, b"\x7fELF not loaded here" * 50)
    data = json.loads(record.read_text())
    data["hash"] = "sha256"
    record.write_text(json.dumps(data))
    (record.parent / "opbuilder_ops.rec").write_bytes(shipped.record_copy(data))
    why = f"{record} is not a record this opbuilder reads (no blake2b-256 hashes)"
    assert shipped._fit(spec, record) == (None, None, why)
    monkeypatch.setenv("OPBUILDER_NO_BUILD", "1")
    with pytest.raises(NoBuildError) as e:
        CustomOpBuilder("op", [str(spec.sources[0])], binding="pybind11",
                        build_dir=str(tmp_path / "no-cache")).load()
    assert e.value.reason == why


def test_the_package_walk_skips_caches_binaries_and_linked_directories(tmp_path):
    top = tmp_path / "pkg"
    for d in ("include/sub", "__pycache__", shipped.BIN_DIR, "elsewhere"):
        (top / d).mkdir(parents=True)
    for f in ("include/a.h", "include/sub/b.hpp", "__pycache__/c.h", f"{shipped.BIN_DIR}/d.h", "e.txt", "f.cuh"):
        (top / f).write_text("")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "g.h").write_text("")
    (top / "linked").symlink_to(outside, target_is_directory=True)
    got = shipped.header_files([top, top / "include", tmp_path / "not_inside"], top)
    assert got == [top / "f.cuh", top / "include" / "a.h", top / "include" / "sub" / "b.hpp"]


@pytest.fixture
def native_dir(tmp_path, monkeypatch) -> Path:
    """``<pkg>/_native`` as an install writes it, seen by a shipped load's own check of it (as in a new
    process: nothing checked yet, native/installed.py not imported)."""
    d = tmp_path / "opbuilder" / "_native"
    d.mkdir(parents=True)
    files = {"libnanobind.so": b"\x7fELF runtime" * 100, "libobcore.so": b"\x7fELF core" * 120}
    for name, data in files.items():
        (d / name).write_bytes(data)
    record = {"abi": {"python": "p"}, "files": {n: shipped.file_hash(d / n) for n in files},
              "sizes": {n: len(b) for n, b in files.items()}, "hash": shipped.HASH}
    (d / "native.json").write_text(json.dumps(record))
    from opbuilder import importer
    monkeypatch.setattr(importer, "NATIVE_DIR", str(d))
    monkeypatch.setattr(importer, "_native", [])
    monkeypatch.setattr(importer, "_INSTALLED", "opbuilder.not_imported")
    return d


def test_a_shipped_load_takes_the_owners_installed_runtime_as_installed_by_owner_does(native_dir):
    from opbuilder.native import installed

    assert shipped._owned_runtime()["abi"] == {"python": "p"}
    assert installed.installed(native_dir, by_owner=True).record == shipped._owned_runtime()


@pytest.mark.parametrize("change", ["size", "group-writable", "link"])
def test_a_runtime_not_the_owners_as_recorded_is_left_to_installed_py_which_hashes_it(native_dir, tmp_path, change):
    lib = native_dir / "libobcore.so"
    if change == "size":
        with open(lib, "ab") as f:
            f.write(b"\0")
    elif change == "group-writable":
        lib.chmod(0o664)
    else:
        real = tmp_path / "elsewhere.so"
        real.write_bytes(lib.read_bytes())
        lib.unlink()
        lib.symlink_to(real)
    assert shipped._owned_runtime() is None


def _st(mode: int, uid: int, gid: int) -> os.stat_result:
    return os.stat_result((mode, 1, 1, 1, uid, gid, 0, 0, 0, 0))


_KINDS = [stat_mod | perm for stat_mod in (0o040000, 0o100000, 0o120000, 0o010000)
          for perm in (0o700, 0o755, 0o775, 0o757, 0o600, 0o644, 0o664, 0o606, 0o1777, 0o1775)]


@pytest.mark.parametrize("want_dir", [True, False])
def test_a_warm_loads_test_of_a_cache_entry_is_trust_pys(want_dir):
    from opbuilder.cache import trust, warm
    from opbuilder.errors import UnsafeCacheDirError

    for mode in _KINDS:
        for uid in (os.geteuid(), os.geteuid() + 1, 0):
            st = _st(mode, uid, os.getegid())
            try:
                trust._check(Path("/nonexistent/x"), st, want_dir)
                trusted = True
            except UnsafeCacheDirError:
                trusted = False
            assert warm._ours(st, want_dir) == trusted, (oct(mode), uid)


def test_a_warm_loads_test_of_the_directories_above_the_cache_is_trust_pys():
    from opbuilder.cache import trust, warm
    from opbuilder.errors import UnsafeCacheDirError

    euid, egid = os.geteuid(), os.getegid()
    fine = _st(0o040755, 0, 0)
    for mode in _KINDS:
        for uid in (euid, euid + 1, 0):
            for gid in (egid, egid + 1):
                st = _st(mode, uid, gid)
                try:
                    trust._check_above(Path("/a/b"), Path("/a/b"), known={"/a": st, "/": fine})
                    trusted = True
                except UnsafeCacheDirError:
                    trusted = False
                assert warm._above_ok(st, euid, egid) == trusted, (oct(mode), uid, gid)


def test_load_inline_still_refuses_a_strings_directory_others_can_write(tmp_path):
    from opbuilder import inline
    from opbuilder.errors import UnsafeCacheDirError

    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    b = inline._builder("ok_op", "int f() { return 1; }", "", {}, {"build_dir": str(cache)})  # writes, builds nothing
    directory = Path(b.spec.sources[0]).parent
    assert directory.parent.parent == cache / "inline" and b.spec.name == "ok_op"
    assert inline._builder("ok_op", "int f() { return 1; }", "", {}, {"build_dir": str(cache)}).spec == b.spec
    directory.chmod(0o770)
    with pytest.raises(UnsafeCacheDirError) as e:
        inline._builder("ok_op", "int f() { return 1; }", "", {}, {"build_dir": str(cache)})
    assert str(e.value).startswith(f"opbuilder cache directory {directory} is writable by group or others")


def test_the_load_paths_modules_try_no_import_that_fails():
    """An import that fails searches every sys.path entry first (~0.4 M instructions of a new process on 3.11):
    the modules of a warm load(), a warm load_inline and a shipped load() try none. Fails on 88fd1aa (Python
    3.11): inline.py tried ``_sha2`` (3.12's module) before ``_sha512``."""
    code = ("import sys\nimport opbuilder\ntried = []\n"
            "sys.addaudithook(lambda e, a: tried.append(a[0]) if e == 'import' else None)\n"
            "from opbuilder import inline, warm, importer\n"
            "importer.python_api()\n"
            "print(sorted(set(m for m in tried if m not in sys.modules)))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"

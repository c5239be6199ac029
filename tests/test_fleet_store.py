"""Prebuilt stores (OPBUILDER_PREBUILT_DIR, `build --into`) and bundles (`export`, `import`): real
CLI processes, real compiles of tiny sources, a logging CXX that counts compiles."""
from __future__ import annotations

import io
import logging
import os
import re
import shutil
import subprocess
import tarfile
import textwrap
from pathlib import Path

import pytest

from builder_util import PYTHON, child_env, compiled_sources, tiny_module, wrapper_cxx
from opbuilder import CustomOpBuilder, UnsafeCacheDirError

NAME = "stored_op"


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "opbuilder", *args], capture_output=True, text=True, timeout=300,
                          env=child_env(**env))


@pytest.fixture
def filled(tmp_path, monkeypatch):
    """A store filled by `build --into` (CI's cache in ci/cache) from a checkout in ci/src; the CXX log."""
    log = tmp_path / "cxx.log"
    cxx = wrapper_cxx(tmp_path, log)
    monkeypatch.setenv("CXX", cxx)
    (tmp_path / "ci" / "src").mkdir(parents=True)
    src = tiny_module(tmp_path / "ci" / "src" / "op.cpp", "31")
    store = tmp_path / "store"
    res = _cli("build", NAME, str(src), "--cache-dir", str(tmp_path / "ci" / "cache"), "--into", str(store), CXX=cxx)
    assert res.returncode == 0, res.stderr
    lib = Path(res.stdout.strip())
    assert store in lib.parents and lib.is_file() and compiled_sources(log) == ["op.cpp"]
    log.write_text("")
    return tmp_path, store, lib, log


def _clone(tmp_path: Path, where: str) -> Path:
    """The same source in another checkout."""
    (tmp_path / where).mkdir(parents=True)
    return tiny_module(tmp_path / where / "op.cpp", "31")


LOAD = textwrap.dedent("""
    import os, subprocess, sys
    if sys.argv[2] == "no-process":
        def refuse(*a, **k):
            raise AssertionError("a process was started on the warm path")
        subprocess.Popen = refuse
        os.posix_spawn = os.posix_spawnp = os.fork = os.system = refuse
    from opbuilder import CustomOpBuilder
    m = CustomOpBuilder(sys.argv[3], [sys.argv[1]]).load()
    print(m.value(), m.__file__)
""")


def _load_in_child(src: Path, cache: Path, store: Path, mode: str = "any") -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-c", LOAD, str(src), mode, NAME], capture_output=True, text=True, timeout=300,
                          env=child_env(OPBUILDER_CACHE_DIR=str(cache), OPBUILDER_PREBUILT_DIR=f"/nonexistent:{store}"))


def _tree(directory: Path) -> dict:
    return {str(p): (p.stat().st_mode, p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*"))}


def test_a_store_filled_by_the_cli_serves_a_new_cache_and_another_checkout_without_compiling(filled):
    tmp_path, store, lib, log = filled
    before = _tree(store)
    src = _clone(tmp_path, "user/checkout")
    cache = tmp_path / "user" / "cache"
    # a new cache on this node starts no process, not even the compiler's --version: `build --into`
    # left the toolchain facts in the store, and their files' stamps match here
    res = _load_in_child(src, cache, store, "no-process")
    assert res.returncode == 0, res.stderr
    value, path = res.stdout.split()
    assert value == "31" and Path(path) == lib
    assert compiled_sources(log) == [] and not (cache / NAME).exists()
    facts = store / "toolchains.json"
    assert "compiler" in facts.read_text() and facts.stat().st_mode & 0o777 == 0o644
    res = _load_in_child(src, cache, store, "no-process")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["31", str(lib)] and "building" not in res.stderr
    assert _tree(store) == before  # load() never writes to a store


# load() in a child: the value, or the error (FileNotFoundError: no compiler; NoBuildError: production) it names
NO_COMPILER = textwrap.dedent("""
    import sys
    from opbuilder import CustomOpBuilder, NoBuildError
    try:
        print(CustomOpBuilder(sys.argv[2], [sys.argv[1]]).load().value())
    except NoBuildError as e:
        print("NoBuildError:", e)
    except FileNotFoundError as e:
        print("FileNotFoundError:", e)
""")


def test_a_node_without_a_compiler_loads_what_the_store_holds(filled):
    """The key holds the compiler's identity; a node with no compiler takes it from the store's
    toolchain facts (build --into left them there), so a deployed operator still loads."""
    tmp_path, store, lib, log = filled
    bare = tmp_path / "bare-bin"  # a PATH with Python on it and no compiler
    bare.mkdir()
    os.symlink(PYTHON, bare / "python")
    env = child_env(OPBUILDER_CACHE_DIR=str(tmp_path / "node" / "cache"), OPBUILDER_PREBUILT_DIR=str(store),
                    PATH=str(bare))
    env.pop("CXX", None)
    src = _clone(tmp_path, "node/checkout")
    res = subprocess.run([PYTHON, "-c", NO_COMPILER, str(src), NAME], capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.returncode == 0 and res.stdout.strip() == "31", res.stdout + res.stderr
    # a source the store has no build of cannot be served, and the error says both things
    other = tiny_module(tmp_path / "node" / "checkout" / "new.cpp", "2")
    res = subprocess.run([PYTHON, "-c", NO_COMPILER, str(other), "unstored"], capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.stdout.strip() == ("FileNotFoundError: no C++ compiler found (tried c++, g++, clang++ on PATH); "
                                  "install g++ (e.g. apt-get install g++) or set CXX; and no prebuilt store "
                                  "(OPBUILDER_PREBUILT_DIR) has a build of 'unstored' for these sources"), res.stderr
    assert compiled_sources(log) == []


def test_production_loads_from_the_store_on_a_node_whose_cache_does_not_exist_yet(filled):
    """OPBUILDER_NO_BUILD=1 on a new node (docs/fleet.md's cluster: OPBUILDER_CACHE_DIR=/local/$USER/...,
    not made yet). Before, load() raised at once for the missing cache directory, never asking the store,
    and blamed a missing wheel."""
    tmp_path, store, lib, log = filled
    cache = tmp_path / "node" / "cache"
    env = child_env(OPBUILDER_CACHE_DIR=str(cache), OPBUILDER_PREBUILT_DIR=str(store), OPBUILDER_NO_BUILD="1")
    src = _clone(tmp_path, "node/checkout")
    res = subprocess.run([PYTHON, "-c", NO_COMPILER, str(src), NAME], capture_output=True, text=True, timeout=300,
                         env=env)
    assert res.returncode == 0 and res.stdout.strip() == "31", res.stdout + res.stderr
    other = tiny_module(tmp_path / "node" / "checkout" / "new.cpp", "2")  # sources the store has no build of
    res = subprocess.run([PYTHON, "-c", NO_COMPILER, str(other), "unstored"], capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.stdout.strip() == (
        "NoBuildError: operator 'unstored' would have to be built, and OPBUILDER_NO_BUILD=1 forbids building: no "
        "wheel ships a binary of 'unstored' (no opbuilder_ops.json beside its sources). Fix: build these sources "
        "into the prebuilt store where a compiler is (python -m opbuilder build NAME SOURCES... --into STORE, "
        "docs/fleet.md; no store in OPBUILDER_PREBUILT_DIR holds a build of them as they are now), or install a "
        "wheel of the package built for this Python and opbuilder (python -m opbuilder wheel PKGDIR), or unset "
        "OPBUILDER_NO_BUILD to build it here"), res.stderr
    # a misspelled store is named; a store others can write and a cache that cannot be made say their own fix
    res = subprocess.run([PYTHON, "-c", NO_COMPILER, str(src), NAME], capture_output=True, text=True, timeout=300,
                         env={**env, "OPBUILDER_PREBUILT_DIR": f"{store}-typo"})
    assert f"as they are now; {store}-typo does not exist), or install a wheel" in res.stdout, res.stdout + res.stderr
    (tmp_path / "a-file").write_text("")
    res = subprocess.run([PYTHON, "-c", NO_COMPILER, str(src), NAME], capture_output=True, text=True, timeout=300,
                         env={**env, "OPBUILDER_CACHE_DIR": str(tmp_path / "a-file" / "cache")})
    assert res.returncode == 1 and "BuildError: building operator 'stored_op' failed: cannot create " in res.stderr
    assert "NoBuildError" not in res.stderr and "--into STORE" not in res.stderr, res.stderr
    store.chmod(0o777)
    try:
        res = subprocess.run([PYTHON, "-c", NO_COMPILER, str(src), NAME], capture_output=True, text=True,
                             timeout=300, env=env)
    finally:
        store.chmod(0o755)
    assert res.returncode == 1 and "UnsafeCacheDirError: opbuilder prebuilt store" in res.stderr
    assert "Fix: chmod go-w" in res.stderr and res.stderr.count("Fix:") == 1, res.stderr
    assert compiled_sources(log) == []


@pytest.mark.build  # the CLI children compile both releases (tests/build_guard.py)
def test_builds_of_two_header_layouts_stay_findable_in_any_order_of_imports(tmp_path, monkeypatch):
    """Release 1's a.h defines the value; release 2's a.h includes b.h: the same op.cpp, two layouts of
    headers. A store that got release 2's bundle, then release 1's (a rollback artifact), holds both builds;
    before, the later import's manifest (one header list per source) hid the other, and production
    (OPBUILDER_NO_BUILD=1) refused the operator, naming a missing wheel."""
    log = tmp_path / "cxx.log"
    cxx = wrapper_cxx(tmp_path, log)
    monkeypatch.setenv("CXX", cxx)
    ci = tmp_path / "ci"
    (ci / "src").mkdir(parents=True)
    src = tiny_module(ci / "src" / "op.cpp", "VALUE", includes='#include "a.h"')
    bundles = {}
    for release, headers in (("r1", {"a.h": "#define VALUE 1\n"}),
                             ("r2", {"a.h": '#include "b.h"\n', "b.h": "#define VALUE 2\n"})):
        for name, text in headers.items():
            (ci / "src" / name).write_text(text)
        cache = str(ci / "cache")
        assert _cli("build", NAME, str(src), "--cache-dir", cache, CXX=cxx).returncode == 0
        bundles[release] = tmp_path / f"{release}.tar"
        assert _cli("export", NAME, "-o", str(bundles[release]), "--cache-dir", cache).returncode == 0
    (ci / "src" / "b.h").unlink()  # the CI cache itself: release 2's build, then release 1's sources
    (ci / "src" / "a.h").write_text("#define VALUE 1\n")
    store = tmp_path / "store"
    for release in ("r2", "r1"):
        res = _cli("import", str(bundles[release]), "--into", str(store))
        assert res.returncode == 0, res.stderr
    log.write_text("")
    checkouts = {"1": {"a.h": "#define VALUE 1\n"}, "2": {"a.h": '#include "b.h"\n', "b.h": "#define VALUE 2\n"}}
    for want, headers in checkouts.items():
        node = tmp_path / f"node{want}"
        (node / "src").mkdir(parents=True)
        op = tiny_module(node / "src" / "op.cpp", "VALUE", includes='#include "a.h"')
        for name, text in headers.items():
            (node / "src" / name).write_text(text)
        env = child_env(OPBUILDER_CACHE_DIR=str(node / "cache"), OPBUILDER_PREBUILT_DIR=str(store),
                        OPBUILDER_NO_BUILD="1")
        res = subprocess.run([PYTHON, "-c", NO_COMPILER, str(op), NAME], capture_output=True, text=True,
                             timeout=300, env=env)
        assert res.returncode == 0 and res.stdout.strip() == want, res.stdout + res.stderr
    assert compiled_sources(log) == []
    # a build in one cache keeps the other layout's build findable too: no compile for either
    for want, headers in (("1", checkouts["1"]), ("2", checkouts["2"]), ("1", checkouts["1"])):
        for name in ("a.h", "b.h"):
            (ci / "src" / name).unlink(missing_ok=True)
        for name, text in headers.items():
            (ci / "src" / name).write_text(text)
        res = _cli("build", NAME, str(src), "--cache-dir", str(ci / "cache"), CXX=cxx)
        assert res.returncode == 0, res.stderr
    assert compiled_sources(log) == []


@pytest.mark.build  # the CLI children compile ten layouts (tests/build_guard.py)
def test_a_build_installed_into_a_store_adds_its_own_layout_not_its_caches_others(tmp_path, monkeypatch):
    """Release 1 ([a.h]) is in the store; CI's cache then saw 9 other layouts of the same op.cpp and installs
    the last. Before, the install put all of its cache's manifest first (at most 8 kept), pushing release 1's
    layout out of the store's manifest: a release-1 node got a NoBuildError for a build the store held."""
    cxx = wrapper_cxx(tmp_path, tmp_path / "cxx.log")
    monkeypatch.setenv("CXX", cxx)
    src_dir = tmp_path / "ci"
    src_dir.mkdir()
    src = tiny_module(src_dir / "op.cpp", "VALUE", includes='#include "a.h"')
    store = tmp_path / "store"
    cache = str(tmp_path / "ci-cache")
    (src_dir / "a.h").write_text("#define VALUE 100\n")
    assert _cli("build", NAME, str(src), "--cache-dir", cache, "--into", str(store), CXX=cxx).returncode == 0
    for k in range(9):  # a.h includes h<k>.h: a layout per k
        (src_dir / "a.h").write_text(f'#include "h{k}.h"\n')
        (src_dir / f"h{k}.h").write_text(f"#define VALUE {k}\n")
        into = ["--into", str(store)] if k == 8 else []
        assert _cli("build", NAME, str(src), "--cache-dir", cache, *into, CXX=cxx).returncode == 0
    node = tmp_path / "node"
    node.mkdir()
    op = tiny_module(node / "op.cpp", "VALUE", includes='#include "a.h"')
    env = child_env(OPBUILDER_CACHE_DIR=str(node / "cache"), OPBUILDER_PREBUILT_DIR=str(store), OPBUILDER_NO_BUILD="1")
    for text, want in (("#define VALUE 100\n", "100"), ('#include "h8.h"\n', "8")):
        (node / "a.h").write_text(text)
        (node / "h8.h").write_text("#define VALUE 8\n")
        res = subprocess.run([PYTHON, "-c", NO_COMPILER, str(op), NAME], capture_output=True, text=True, timeout=300,
                             env=env)
        assert res.returncode == 0 and res.stdout.strip() == want, res.stdout + res.stderr


@pytest.mark.build  # the CLI child compiles the library (tests/build_guard.py)
def test_a_library_build_is_served_from_the_store(tmp_path, monkeypatch):
    src = tmp_path / "aot.cpp"
    src.write_text('extern "C" int answer() { return 54; }\n')
    store = tmp_path / "store"
    log = tmp_path / "cxx.log"
    monkeypatch.setenv("CXX", wrapper_cxx(tmp_path, log))
    res = _cli("build", "aot_lib", str(src), "--library", "--cache-dir", str(tmp_path / "ci"), "--into", str(store))
    assert res.returncode == 0, res.stderr
    assert compiled_sources(log) == ["aot.cpp"]
    log.write_text("")
    shutil.rmtree(tmp_path / "ci")
    from opbuilder import build_library
    monkeypatch.setenv("OPBUILDER_PREBUILT_DIR", str(store))
    path = Path(build_library("aot_lib", [src], build_dir=tmp_path / "cache"))
    assert store in path.parents and compiled_sources(log) == []
    import ctypes
    assert ctypes.CDLL(str(path)).answer() == 54


@pytest.mark.parametrize("damage", ["one byte changed", "truncated"])
@pytest.mark.build
def test_a_tampered_stored_library_is_never_imported(filled, monkeypatch, caplog, damage):
    tmp_path, store, lib, log = filled
    data = bytearray(lib.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    else:
        i = data.index(b"\0" * 16) + 8  # a byte nobody will miss, so the library would still load
        data[i] = 1
    lib.write_bytes(bytes(data))
    monkeypatch.setenv("OPBUILDER_PREBUILT_DIR", str(store))
    src = _clone(tmp_path, "user/checkout")
    cache = tmp_path / "user" / "cache"
    with caplog.at_level(logging.WARNING, logger="opbuilder"):
        mod = CustomOpBuilder(NAME, [src], build_dir=cache).load()
    assert mod.value() == 31 and cache in Path(mod.__file__).parents  # built into the cache as usual
    assert compiled_sources(log) == ["op.cpp"]
    assert str(lib) in caplog.text and "never loaded" in caplog.text
    assert lib.read_bytes() == bytes(data)  # the store is left as it is


def test_a_broken_entry_is_warned_about_once_per_process(tmp_path, caplog):
    """A nanobind operator's load looks a store entry up twice (before its build lock, then under it): the
    broken library was named twice per load()."""
    from opbuilder.errors import warn_broken

    path = tmp_path / "store" / "op" / "key" / "op.so"
    with caplog.at_level(logging.WARNING, logger="opbuilder"):
        for _ in range(2):
            warn_broken(path, "100 bytes where 19064 were published", "it is never loaded")
        warn_broken(path, "its SHA-256 is not the one published", "it is never loaded")  # another cause: said
    assert caplog.text.count(f"{path} is broken (100 bytes") == 1 and caplog.text.count(f"{path} is broken") == 2


@pytest.mark.build
def test_a_stored_build_json_that_is_broken_is_ignored_not_built_again_in_the_store(filled, monkeypatch, caplog):
    tmp_path, store, lib, log = filled
    info = lib.parent / "build.json"
    info.write_text("{")
    monkeypatch.setenv("OPBUILDER_PREBUILT_DIR", str(store))
    cache = tmp_path / "user" / "cache"
    with caplog.at_level(logging.WARNING, logger="opbuilder"):
        mod = CustomOpBuilder(NAME, [_clone(tmp_path, "user/checkout")], build_dir=cache).load()
    assert mod.value() == 31 and cache in Path(mod.__file__).parents
    assert f"{info} is broken (not JSON: " in caplog.text
    assert "; ignoring the prebuilt store's copy and building into the cache" in caplog.text
    assert "building the library again" not in caplog.text and info.read_text() == "{"


def test_a_store_others_can_write_is_refused_naming_it(filled, monkeypatch):
    tmp_path, store, lib, log = filled
    monkeypatch.setenv("OPBUILDER_PREBUILT_DIR", str(store))
    src = _clone(tmp_path, "user/checkout")
    store.chmod(0o777)
    with pytest.raises(UnsafeCacheDirError, match=rf"prebuilt store {store} is writable by users other than its "
                                                  rf"owner .*mode 777.*chmod go-w {store}"):
        CustomOpBuilder(NAME, [src], build_dir=tmp_path / "cache").load()
    store.chmod(0o755)
    lib.parent.chmod(0o775)  # an entry inside it
    with pytest.raises(UnsafeCacheDirError, match=rf"{lib.parent} is writable by group or others"):
        CustomOpBuilder(NAME, [src], build_dir=tmp_path / "cache").load()
    assert compiled_sources(log) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="giving the store to another user needs root (chown)")
def test_a_store_of_another_user_that_only_it_can_write_is_used(filled, monkeypatch):
    tmp_path, store, lib, log = filled
    for p in [store, *store.rglob("*")]:
        os.chown(p, 65534, 65534)  # nobody: as a store CI or root filled
    monkeypatch.setenv("OPBUILDER_PREBUILT_DIR", str(store))
    mod = CustomOpBuilder(NAME, [_clone(tmp_path, "user/checkout")], build_dir=tmp_path / "cache").load()
    assert mod.value() == 31 and Path(mod.__file__) == lib and compiled_sources(log) == []
    os.chown(lib, 0, 0)  # one entry of another owner than the store's
    with pytest.raises(UnsafeCacheDirError, match=rf"{lib} belongs to uid 0, not to the owner of its prebuilt "
                                                  rf"store \(uid 65534\)"):
        CustomOpBuilder(NAME, [_clone(tmp_path, "user/other")], build_dir=tmp_path / "cache2").load()


@pytest.mark.build
def test_export_import_round_trip_serves_another_cache_without_compiling(filled):
    tmp_path, store, lib, log = filled
    bundle = tmp_path / "ops.tar"
    res = _cli("export", NAME, "-o", str(bundle), "--cache-dir", str(tmp_path / "ci" / "cache"))
    assert res.returncode == 0, res.stderr
    with tarfile.open(bundle) as tar:
        names = sorted(m.name for m in tar.getmembers())
    assert len(names) == 3 and names[0].startswith(f"{NAME}/") and any(n.endswith(".so") for n in names)
    cluster = tmp_path / "cluster-store"
    res = _cli("import", str(bundle), "--into", str(cluster))
    assert res.returncode == 0, res.stderr
    src = _clone(tmp_path, "node/checkout")
    res = _load_in_child(src, tmp_path / "node" / "cache", cluster)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[0] == "31" and cluster in Path(res.stdout.split()[1]).parents
    assert compiled_sources(log) == []
    # into a cache (the default target): then a plain load() finds it there
    res = _cli("import", str(bundle), "--cache-dir", str(tmp_path / "node2"))
    assert res.returncode == 0, res.stderr
    res = _load_in_child(src, tmp_path / "node2", tmp_path / "no-store")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "node2") in Path(res.stdout.split()[1]).parents and compiled_sources(log) == []


def test_exporting_an_operator_that_was_never_built_names_it(tmp_path):
    (tmp_path / "cache").mkdir(mode=0o700)
    res = _cli("export", "never_built", "-o", str(tmp_path / "x.tar"), "--cache-dir", str(tmp_path / "cache"))
    assert res.returncode == 1
    assert "operator 'never_built' has no intact build in" in res.stderr and not (tmp_path / "x.tar").exists()


def _crafted(path: Path, member: tarfile.TarInfo, data: bytes = b"planted") -> Path:
    with tarfile.open(path, "w") as tar:
        if member.isfile():
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
        else:
            tar.addfile(member)
    return path


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    m = tarfile.TarInfo(name)
    m.type, m.linkname, m.mode = kind, link, 0o644
    return m


CRAFTED = {
    "../ escapes": (_member("stored_op/../../escaped.json"), "is not a path opbuilder writes"),
    "absolute path": (_member("/tmp/opbuilder-escaped.json"), "is not a path opbuilder writes"),
    "symbolic link": (_member("stored_op/abcdef0123456789abcdef01/x.so", tarfile.SYMTYPE, "/etc/passwd"),
                      "is a symbolic link"),
    "hard link": (_member("stored_op/abcdef0123456789abcdef01/x.so", tarfile.LNKTYPE, "/etc/passwd"),
                  "is a hard link"),
    "device": (_member("stored_op/deps/abcdef0123456789abcdef01.json", tarfile.CHRTYPE),
               "is not a regular file or directory"),
    "another file": (_member("stored_op/abcdef0123456789abcdef01/run.sh"), "is not a path opbuilder writes"),
}


@pytest.mark.parametrize("case", list(CRAFTED))
def test_a_crafted_bundle_is_refused_and_nothing_is_written(tmp_path, case):
    member, why = CRAFTED[case]
    bundle = _crafted(tmp_path / "evil.tar", member)
    target = tmp_path / "deep" / "er" / "store"
    res = _cli("import", str(bundle), "--into", str(target))
    assert res.returncode == 1
    assert f"bundle {bundle} refused, nothing was imported: {member.name!r} {why}" in res.stderr, res.stderr
    assert not target.exists()  # the store the import made is gone again: it was left empty
    assert not (tmp_path / "deep" / "escaped.json").exists() and not Path("/tmp/opbuilder-escaped.json").exists()


def _exported_and_rewritten(tmp_path: Path, out_name: str, rewrite) -> Path:
    """CI's build exported into a bundle, then each member passed through ``rewrite(member, data)``,
    which returns the (member, data) pairs to write instead."""
    bundle = tmp_path / "ops.tar"
    assert _cli("export", NAME, "-o", str(bundle), "--cache-dir", str(tmp_path / "ci" / "cache")).returncode == 0
    out = tmp_path / out_name
    with tarfile.open(bundle) as src, tarfile.open(out, "w") as dst:
        for m in src.getmembers():
            for member, data in rewrite(m, src.extractfile(m).read() if m.isfile() else None):
                dst.addfile(member, io.BytesIO(data) if data is not None else None)
    return out


def test_a_bundle_whose_library_was_changed_is_refused_naming_it(filled):
    tmp_path, store, lib, log = filled
    changed = _exported_and_rewritten(tmp_path, "changed.tar", lambda m, data: [
        (m, data[:-1] + bytes([data[-1] ^ 1]) if m.name.endswith(".so") else data)])
    res = _cli("import", str(changed), "--into", str(tmp_path / "cluster"))
    assert res.returncode == 1
    assert "its SHA-256 is not the one its build.json records" in res.stderr and lib.name in res.stderr
    assert not list((tmp_path / "cluster").rglob("*.so"))


@pytest.mark.build  # the doctor child runs the compilers' checks (tests/build_guard.py)
def test_doctor_reports_each_store_and_refuses_one_others_can_write(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir(mode=0o755)
    bad.mkdir()
    bad.chmod(0o777)
    res = _cli("doctor", OPBUILDER_PREBUILT_DIR=f"{good}:{tmp_path / 'missing'}:{bad}",
               OPBUILDER_CACHE_DIR=str(tmp_path / "cache"))
    lines = res.stdout.splitlines()
    assert f"ok    prebuilt store: {good} (owner uid {os.geteuid()}, read-only to load()); 0 build(s) of 0 " \
           f"operator(s) checked as load() does: owner, modes, no links, library sizes (not hashed)" in lines
    assert f"note  prebuilt store: {tmp_path / 'missing'} does not exist (skipped)" in lines
    i = lines.index(f"error prebuilt store: opbuilder prebuilt store {bad} is writable by users other than its "
                    f"owner (uid {os.geteuid()}, mode 777): refused")
    assert lines[i + 1].strip().startswith("fix: make it writable by its owner only")
    assert res.returncode == 1


def test_a_bundle_with_one_incomplete_build_installs_nothing_and_an_empty_one_is_an_error(filled):
    tmp_path, store, lib, log = filled

    def and_a_copy_without_manifest(m, data):  # the same build again as a second operator, no manifest
        if not m.isfile() or "/deps/" in m.name:
            return [(m, data)]
        copy = tarfile.TarInfo("zzz_" + m.name)
        copy.size, copy.mode = m.size, m.mode
        return [(m, data), (copy, data)]

    partial = _exported_and_rewritten(tmp_path, "partial.tar", and_a_copy_without_manifest)
    res = _cli("import", str(partial), "--into", str(tmp_path / "cluster"))
    assert res.returncode == 1
    assert re.search(rf"bundle {re.escape(str(partial))} refused, nothing was imported: zzz_{NAME}/[0-9a-f]+: its "
                     rf"manifest deps/[0-9a-f]+\.json is missing, not JSON, or not a manifest opbuilder wrote",
                     res.stderr), res.stderr
    assert not (tmp_path / "cluster").exists() or not list((tmp_path / "cluster").rglob("*"))  # not even the good one

    def and_a_copy_with_another_manifest(m, data):  # JSON, but not a manifest: refused before any install too
        if not m.isfile():
            return [(m, data)]
        copy = tarfile.TarInfo("zzz_" + m.name)
        other = b'{"headers": [], "more": "not a list"}' if "/deps/" in m.name else data
        copy.size, copy.mode = len(other), m.mode
        return [(m, data), (copy, other)]

    odd = _exported_and_rewritten(tmp_path, "odd.tar", and_a_copy_with_another_manifest)
    res = _cli("import", str(odd), "--into", str(tmp_path / "cluster"))
    assert res.returncode == 1 and "not a manifest opbuilder wrote" in res.stderr, res.stderr
    assert not (tmp_path / "cluster").exists()  # before: the first operator was installed, then the import failed
    empty = tmp_path / "empty.tar"
    tarfile.open(empty, "w").close()
    res = _cli("import", str(empty), "--into", str(tmp_path / "cluster"))
    assert res.returncode == 1 and f"bundle {empty} holds no build" in res.stderr and "nothing was imported" in res.stderr


def test_a_store_reached_through_a_link_others_could_repoint_is_refused(filled, monkeypatch):
    tmp_path, store, lib, log = filled
    open_dir = tmp_path / "world"
    open_dir.mkdir()
    open_dir.chmod(0o777)  # anyone could point this link at a store of their own
    (open_dir / "store").symlink_to(store)
    monkeypatch.setenv("OPBUILDER_PREBUILT_DIR", str(open_dir / "store"))
    with pytest.raises(UnsafeCacheDirError, match=rf"{open_dir}, a directory above the opbuilder prebuilt store "
                                                  rf"{open_dir / 'store'}, is writable by others .*OPBUILDER_PREBUILT_DIR"):
        CustomOpBuilder(NAME, [_clone(tmp_path, "user/checkout")], build_dir=tmp_path / "cache").load()
    assert compiled_sources(log) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="giving the store to another user needs root (chown)")
def test_another_users_store_in_a_sticky_world_writable_directory_is_refused(filled, monkeypatch):
    """In a /tmp-like directory anyone may have made that store first; one of our own there is fine."""
    tmp_path, store, lib, log = filled
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    shutil.move(str(store), sticky / "store")
    monkeypatch.setenv("OPBUILDER_PREBUILT_DIR", str(sticky / "store"))
    mod = CustomOpBuilder(NAME, [_clone(tmp_path, "user/a")], build_dir=tmp_path / "cache").load()
    assert sticky / "store" in Path(mod.__file__).parents  # ours: used
    for p in [sticky / "store", *(sticky / "store").rglob("*")]:
        os.chown(p, 65534, 65534, follow_symlinks=False)
    with pytest.raises(UnsafeCacheDirError, match=rf"{sticky}, a directory above the opbuilder prebuilt store .*"
                                                  rf"is writable by others \(mode 1777\), and {sticky / 'store'} "
                                                  rf"in it belongs to another user"):
        CustomOpBuilder(NAME, [_clone(tmp_path, "user/b")], build_dir=tmp_path / "cache2").load()


def test_a_file_that_is_not_a_tar_is_an_error_not_a_traceback(tmp_path):
    junk = tmp_path / "junk.tar"
    junk.write_text("not a tar\n")
    res = _cli("import", str(junk), "--into", str(tmp_path / "cluster"))
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert f"bundle {junk} is not a tar file opbuilder can read" in res.stderr and "nothing was imported" in res.stderr
    assert not (tmp_path / "cluster").exists()  # the store it made for the import is gone again (it was left empty)
    (tmp_path / "kept").mkdir()
    assert _cli("import", str(junk), "--into", str(tmp_path / "kept")).returncode == 1
    assert (tmp_path / "kept").is_dir()  # a store that was there stays


@pytest.mark.build
def test_a_build_into_a_new_store_that_fails_leaves_no_store(tmp_path):
    src = tiny_module(tmp_path / "bad.cpp", "not C++ at all")
    res = _cli("build", "bad_op", str(src), "--cache-dir", str(tmp_path / "cache"), "--into",
               str(tmp_path / "new" / "deep" / "store"))
    assert res.returncode == 1 and "not C++ at all" in res.stderr
    assert not (tmp_path / "new").exists()  # nor the directories made for it


def test_a_changed_library_under_a_key_the_store_has_leaves_the_good_copy(filled):
    tmp_path, store, lib, log = filled
    good = lib.read_bytes()
    changed = _exported_and_rewritten(tmp_path, "changed.tar", lambda m, data: [
        (m, data[:-1] + bytes([data[-1] ^ 1]) if m.name.endswith(".so") else data)])
    res = _cli("import", str(changed), "--into", str(store))
    assert res.returncode == 1 and "its SHA-256 is not the one its build.json records" in res.stderr
    assert lib.read_bytes() == good  # the store's library is untouched


def _bare_env(tmp_path: Path, **extra: str) -> dict:
    """The environment of a node without a C++ compiler: PATH holds Python only, CXX unset."""
    bare = tmp_path / "bare-bin"
    if not bare.exists():
        bare.mkdir()
        os.symlink(PYTHON, bare / "python")
    env = child_env(PATH=str(bare), **extra)
    env.pop("CXX", None)
    return env


@pytest.mark.parametrize("into", ["store", "cache"])
def test_a_node_without_a_compiler_loads_an_operator_that_came_in_a_bundle(filled, into):
    """The bundle carries the compiler facts its builds were keyed with (build.json), and import adds them
    to the target's toolchains.json: a node with no compiler looks the operator up with them."""
    tmp_path, store, lib, log = filled
    bundle = tmp_path / "ops.tar"
    assert _cli("export", NAME, "-o", str(bundle), "--cache-dir", str(tmp_path / "ci" / "cache")).returncode == 0
    target = tmp_path / "node" / into
    res = _cli("import", str(bundle), *(["--into", str(target)] if into == "store" else ["--cache-dir", str(target)]))
    assert res.returncode == 0, res.stderr
    facts = (target / "toolchains.json")
    assert facts.stat().st_mode & 0o777 == (0o644 if into == "store" else 0o600)
    env = _bare_env(tmp_path, OPBUILDER_CACHE_DIR=str(target if into == "cache" else tmp_path / "node" / "cache"),
                    **({"OPBUILDER_PREBUILT_DIR": str(target)} if into == "store" else {}))
    src = _clone(tmp_path, "node/checkout")
    res = subprocess.run([PYTHON, "-c", NO_COMPILER, str(src), NAME], capture_output=True, text=True, timeout=300,
                         env=env)
    assert res.returncode == 0 and res.stdout.strip() == "31", res.stdout + res.stderr
    assert compiled_sources(log) == []


def _with_compiler_record(tmp_path: Path, out_name: str, change) -> Path:
    """CI's bundle with the compiler record of its build.json passed through ``change``."""
    import json

    def rewrite(m, data):
        if m.name.endswith("/build.json"):
            info = json.loads(data)
            info["compiler"] = change(info["compiler"])
            data = json.dumps(info).encode()
            m.size = len(data)
        return [(m, data)]

    return _exported_and_rewritten(tmp_path, out_name, rewrite)


def test_a_bundles_compiler_facts_never_stand_in_for_a_nodes_own_compiler(filled):
    """A record that says the node's own compiler is another one (stale or forged) is not used by a node
    that has a compiler: it probes its own (--version), and its keys are its own."""
    tmp_path, store, lib, log = filled
    import json

    forged = _with_compiler_record(tmp_path, "forged.tar", lambda c: dict(c, identity="a forged identity"))
    cluster = tmp_path / "cluster"
    res = _cli("import", str(forged), "--into", str(cluster))
    assert res.returncode == 0, res.stderr
    records = json.loads((cluster / "toolchains.json").read_text())
    assert [r["facts"]["identity"] for r in records.values()] == ["a forged identity"]
    res = _load_in_child(_clone(tmp_path, "node/checkout"), tmp_path / "node" / "cache", cluster)
    assert res.returncode == 0, res.stderr
    # the store's build is keyed with CI's real identity: found with the node's own (probed) one
    assert res.stdout.split()[0] == "31" and cluster in Path(res.stdout.split()[1]).parents
    from builder_util import version_probes
    assert version_probes(log) == 1 and compiled_sources(log) == []


@pytest.mark.parametrize("bad", ["control character", "nvcc", "missing field"])
def test_a_bundle_with_a_malformed_compiler_record_is_refused_naming_it(filled, bad):
    tmp_path, store, lib, log = filled
    change = {"control character": lambda c: dict(c, identity=c["identity"] + "\0pybind11=0"),
              "nvcc": lambda c: dict(c, family="nvcc"),
              "missing field": lambda c: {k: v for k, v in c.items() if k != "version"}}[bad]
    why = {"control character": "its compiler record's identity is not one line of text",
           "nvcc": "its compiler record's family 'nvcc' is not one of gcc, clang, unknown",
           "missing field": "its compiler record is not {identity, family, version, path}"}[bad]
    bundle = _with_compiler_record(tmp_path, "bad.tar", change)
    res = _cli("import", str(bundle), "--into", str(tmp_path / "cluster"))
    assert res.returncode == 1
    assert re.search(rf"bundle {re.escape(str(bundle))} refused, nothing was imported: {NAME}/[0-9a-f]+: its "
                     rf"build.json: {re.escape(why)}", res.stderr), res.stderr
    assert not list((tmp_path / "cluster").rglob("*.so")) and not (tmp_path / "cluster" / "toolchains.json").exists()


def test_an_operator_imported_into_a_cache_is_listed_and_cleaned(filled):
    tmp_path, store, lib, log = filled
    bundle = tmp_path / "ops.tar"
    assert _cli("export", NAME, "-o", str(bundle), "--cache-dir", str(tmp_path / "ci" / "cache")).returncode == 0
    cache = tmp_path / "node" / "cache"
    res = _cli("import", str(bundle), "--cache-dir", str(cache))
    assert res.returncode == 0, res.stderr
    key = Path(res.stdout.strip()).parent.name
    res = _cli("cache", "list", NAME, "--cache-dir", str(cache))
    assert res.returncode == 0, res.stderr
    assert re.search(rf"^{NAME} +module +1 build\(s\)", res.stdout, re.M) and key in res.stdout, res.stdout
    res = _cli("cache", "clean", NAME, "--cache-dir", str(cache))
    assert res.returncode == 0 and f"removed {cache / NAME}" in res.stdout, res.stdout + res.stderr
    assert [p.name for p in (cache / NAME).iterdir()] == [".lock"]


@pytest.mark.parametrize("name", ["../cache/" + NAME, "a/b", NAME + ".lib", "", "class"])
def test_exporting_a_name_that_is_not_an_operator_name_writes_nothing(filled, name):
    """A name is looked up as a directory of the cache: `../x` used to export from outside it (members named
    `../cache/...`, which import refuses)."""
    tmp_path, store, lib, log = filled
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "ops.tar").write_bytes(b"the bundle of yesterday")
    res = _cli("export", NAME, name, "-o", str(out_dir / "ops.tar"), "--cache-dir", str(tmp_path / "ci" / "cache"))
    assert res.returncode == 1
    assert res.stderr.strip() == (f"opbuilder: error: cannot export {name!r}: not an operator name (a Python "
                                  f"identifier, as given to 'python -m opbuilder build NAME'); nothing was written")
    assert [p.name for p in out_dir.iterdir()] == ["ops.tar"]
    assert (out_dir / "ops.tar").read_bytes() == b"the bundle of yesterday"


def test_an_export_that_fails_while_writing_leaves_the_old_bundle_and_no_temporary_file(filled):
    tmp_path, store, lib, log = filled
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "ops.tar").write_bytes(b"the bundle of yesterday")
    manifest = next((tmp_path / "ci" / "cache" / NAME / "deps").iterdir())
    manifest.chmod(0o660)  # refused when it is added, after the tar was started
    res = _cli("export", NAME, "-o", str(out_dir / "ops.tar"), "--cache-dir", str(tmp_path / "ci" / "cache"))
    assert res.returncode == 1 and f"{manifest} is writable by group or others" in res.stderr, res.stderr
    assert [p.name for p in out_dir.iterdir()] == ["ops.tar"]
    assert (out_dir / "ops.tar").read_bytes() == b"the bundle of yesterday"
    # an operator that has no build: the same
    res = _cli("export", "never_built", "-o", str(out_dir / "ops.tar"), "--cache-dir", str(tmp_path / "ci" / "cache"))
    assert res.returncode == 1 and "operator 'never_built' has no intact build in" in res.stderr
    assert [p.name for p in out_dir.iterdir()] == ["ops.tar"]


def test_export_to_a_directory_or_into_a_missing_one_is_an_error_naming_it(filled):
    tmp_path, store, lib, log = filled
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    res = _cli("export", NAME, "-o", str(out_dir), "--cache-dir", str(tmp_path / "ci" / "cache"))
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert res.stderr.strip() == (f"opbuilder: error: cannot write the bundle {out_dir}: it is a directory; give a "
                                  f"file name (-o {out_dir}/ops.tar); nothing was written")
    res = _cli("export", NAME, "-o", str(tmp_path / "missing" / "ops.tar"), "--cache-dir",
               str(tmp_path / "ci" / "cache"))
    assert res.returncode == 1
    assert res.stderr.strip() == (f"opbuilder: error: cannot write the bundle {tmp_path / 'missing' / 'ops.tar'}: "
                                  f"its directory {tmp_path / 'missing'} does not exist (create it first); nothing "
                                  f"was written")
    assert list(out_dir.iterdir()) == [] and [p.name for p in tmp_path.glob(".*.tmp")] == []


def test_export_of_no_operator_is_an_error(tmp_path):
    from opbuilder.fleet.bundle import export_bundle

    with pytest.raises(ValueError, match=r"^export needs at least one operator name \(python -m opbuilder export "
                                         r"NAME\.\.\. -o FILE\.tar\)$"):
        export_bundle(tmp_path, [], tmp_path / "x.tar")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.build
def test_doctor_names_unsafe_and_broken_entries_of_a_store(filled):
    """doctor checks what a lookup reads, as load() does (owner, modes, links, sizes), naming each bad entry."""
    tmp_path, store, lib, log = filled
    res = _cli("doctor", OPBUILDER_PREBUILT_DIR=str(store), OPBUILDER_CACHE_DIR=str(tmp_path / "cache"))
    assert (f"ok    prebuilt store: {store} (owner uid {os.geteuid()}, read-only to load()); 1 build(s) of 1 "
            f"operator(s) checked as load() does: owner, modes, no links, library sizes (not hashed)") \
        in res.stdout.splitlines(), res.stdout
    assert "prebuilt store entry" not in res.stdout
    # a second operator whose library was cut short, and a key directory others can write
    shutil.copytree(store / NAME, store / "other_op", symlinks=True)
    short = next((store / "other_op").glob("*/*.so"))
    short.write_bytes(short.read_bytes()[:100])
    lib.parent.chmod(0o775)
    (store / "stray.so").symlink_to(lib)  # a name no lookup reads: not reported
    res = _cli("doctor", OPBUILDER_PREBUILT_DIR=str(store), OPBUILDER_CACHE_DIR=str(tmp_path / "cache"))
    lines = res.stdout.splitlines()
    assert f"error prebuilt store entry: {lib.parent} is writable by group or others (mode 775): load() refuses " \
           f"it (UnsafeCacheDirError)" in lines, res.stdout
    assert f"error prebuilt store entry: {short} has 100 bytes where its build.json records {lib.stat().st_size}: " \
           f"load() ignores it and builds into the cache (a node without a compiler cannot)" in lines, res.stdout
    assert "stray" not in res.stdout and res.returncode == 1
    # a copy made without import: other stamps, every load hashes it (a note, not an error)
    lib.parent.chmod(0o755)
    shutil.rmtree(store / "other_op")
    data = lib.read_bytes()
    lib.unlink()
    lib.write_bytes(data)
    lib.chmod(0o755)
    res = _cli("doctor", OPBUILDER_PREBUILT_DIR=str(store), OPBUILDER_CACHE_DIR=str(tmp_path / "cache"))
    assert f"note  prebuilt store: 1 library(ies) in {store} have other stat stamps than recorded (copied without " \
           f"import?): every load hashes them (about 1 ms per MB)" in res.stdout.splitlines(), res.stdout
    assert "prebuilt store entry" not in res.stdout

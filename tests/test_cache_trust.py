"""Cache trust: nothing in the cache that another user could have put or changed there is read,
compiled in or loaded; what the builder creates is private whatever the umask."""
import json
import os
import re
import stat
import subprocess

import pytest

from builder_util import PYTHON, build_cache, child_env, compiled_sources, copy_cache, key_dir, tiny_module, wrapper_cxx
from opbuilder import CustomOpBuilder, UnsafeCacheDirError
from opbuilder.tools.toolchain import ext_suffix

NAME = "trusty"
LIB = NAME + ext_suffix()


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """One build of the operator for the whole session: (its cache, its source). Tests work on copies."""
    work = tmp_path_factory.mktemp("trusty")
    return build_cache(work, NAME, "11"), work / f"{NAME}.cpp"


@pytest.fixture
def cache(built, tmp_path):
    return copy_cache(built[0], tmp_path / "cache")


def _load(cache, src):
    return CustomOpBuilder(NAME, [src], build_dir=cache).load()


def _refused(cache, src, path, problem):
    with pytest.raises(UnsafeCacheDirError, match=re.escape(f"{path} {problem}")) as info:
        _load(cache, src)
    return str(info.value)


def test_a_cache_file_is_read_in_requests_sized_to_it(tmp_path, monkeypatch):
    # issue 21: each read asked os.read for 1 MiB, a 1 MiB allocation per call (~20 us; ~80 us the first in a
    # process) where a warm load() reads five files of a few KB
    from opbuilder.cache import trust
    data = os.urandom(300_000)
    path = tmp_path / "record.json"
    path.write_bytes(data)
    asked = []
    real_read = os.read
    monkeypatch.setattr(trust.os, "read", lambda fd, n: asked.append(n) or real_read(fd, n))
    assert trust.read_file(path) == data
    assert asked == [len(data) + 1, 1 << 16]  # the file and its end; then the end again (it did not grow)


def test_a_copy_of_the_cache_loads(cache, built):
    # the baseline every test below changes one thing of: a copied cache is trusted and loads
    assert _load(cache, built[1]).value() == 11


def test_a_symlinked_cache_root_is_refused(cache, built, tmp_path):
    link = tmp_path / "link-to-cache"
    link.symlink_to(cache)
    with pytest.raises(UnsafeCacheDirError, match=re.escape(f"{link} is a symbolic link (to {cache})")) as info:
        _load(link, built[1])
    assert f"OPBUILDER_CACHE_DIR={cache}" in str(info.value)  # the fix: the directory itself


def test_links_above_the_root_are_resolved_once(cache, built, tmp_path):
    # a link to a directory that holds the cache (as /home -> /data/home) is fine: the real path is used
    (tmp_path / "via").symlink_to(tmp_path)
    path = CustomOpBuilder(NAME, [built[1]], build_dir=tmp_path / "via" / "cache").build()
    assert path.startswith(str(cache) + os.sep)


def test_a_load_lstats_each_directory_up_to_the_cache_once(cache, built, monkeypatch):
    # issue 21: the root's real path (os.path.realpath: an lstat per directory) and the check of the
    # directories above it (another lstat each) walked the same directories twice in every warm load()
    assert _load(cache, built[1]).value() == 11
    seen = []
    real_lstat = os.lstat
    monkeypatch.setattr(os, "lstat", lambda p, *a, **k: seen.append(os.fspath(p)) or real_lstat(p, *a, **k))
    assert _load(cache, built[1]).value() == 11
    on_the_way = [str(cache), *(str(p) for p in cache.parents)]
    assert str(cache) in seen and os.sep in seen  # all of them checked ...
    assert [d for d in on_the_way if seen.count(d) != 1] == []  # ... each once


@pytest.mark.parametrize("what", ["operator directory", "key directory", "library"])
def test_a_symlinked_entry_is_refused_and_never_loaded_from(cache, built, tmp_path, what):
    """An attacker's copy of the cache put in place by a link, at each level: refused, not loaded."""
    evil_cache = copy_cache(cache, tmp_path / "attacker")
    lib = key_dir(evil_cache, NAME) / LIB
    lib.write_bytes(lib.read_bytes())  # another file with the same bytes: which one is loaded is what matters
    target = {"operator directory": evil_cache / NAME, "key directory": key_dir(evil_cache, NAME),
              "library": lib}[what]
    victim = {"operator directory": cache / NAME, "key directory": key_dir(cache, NAME),
              "library": key_dir(cache, NAME) / LIB}[what]
    import shutil
    shutil.rmtree(victim) if victim.is_dir() else victim.unlink()
    victim.symlink_to(target)
    msg = _refused(cache, built[1], victim, "is a symbolic link")
    assert f"rm {victim}" in msg


def test_a_symlinked_pch_directory_is_refused_before_anything_is_compiled(tmp_path, monkeypatch):
    from opbuilder.native import pch
    if not pch.enabled():
        pytest.skip("OPBUILDER_PCH is off")
    log = tmp_path / "cxx.log"
    monkeypatch.setenv("CXX", wrapper_cxx(tmp_path, log))
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    evil = tmp_path / "attacker-pch"
    evil.mkdir()
    (evil / "pch.h").write_text('#error "the attacker\'s header was compiled in"\n')
    (cache / ".pch").symlink_to(evil)
    src = tmp_path / "pch_target.cpp"
    src.write_text('#include "opbuilder/extension.h"\nPYBIND11_MODULE(OB_EXTENSION_NAME, m) {}\n')
    with pytest.raises(UnsafeCacheDirError, match=re.escape(f"{cache / '.pch'} is a symbolic link")):
        CustomOpBuilder("pch_target", [src], build_dir=cache).load()
    assert compiled_sources(log) == []


def test_a_symlinked_pch_header_is_refused(tmp_path):
    from opbuilder.native import pch
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    first = pch.prepare(root, "k")  # what a build does before compiling with it
    first.header.unlink()
    first.header.symlink_to(tmp_path / "attacker.h")
    with pytest.raises(UnsafeCacheDirError, match=re.escape(f"{first.header} is a symbolic link")):
        pch.prepare(root, "k")


def _entries(cache):
    """Each entry a warm load reads, by a short name."""
    kd = key_dir(cache, NAME)
    (manifest,) = (cache / NAME / "deps").glob("*.json")
    return {"operator directory": cache / NAME, "deps directory": cache / NAME / "deps", "manifest": manifest,
            "key directory": kd, "library": kd / LIB, "build.json": kd / "build.json",
            "toolchains.json": cache / "toolchains.json", "binding record": cache / NAME / ".bindings.json"}


@pytest.mark.parametrize("what", ["operator directory", "deps directory", "manifest", "key directory", "library",
                                  "build.json", "toolchains.json", "binding record"])
@pytest.mark.parametrize("bits", [stat.S_IWGRP, stat.S_IWOTH])
def test_a_group_or_other_writable_entry_is_refused(cache, built, what, bits, monkeypatch):
    from opbuilder.compile import binding
    monkeypatch.setattr(binding, "_memo", {})  # as a new process: the binding record is read
    path = _entries(cache)[what]
    os.chmod(path, os.lstat(path).st_mode | bits)
    msg = _refused(cache, built[1], path, "is writable by group or others")
    assert f"chmod go-w {path}" in msg


@pytest.mark.parametrize("what", ["objects.json", "object", "opbuilder_name.h"])
def test_a_group_writable_file_of_the_build_directory_is_refused_before_compiling(cache, built, what):
    (obj,) = (cache / NAME / "build" / "obj").glob("*.o")
    path = {"objects.json": cache / NAME / "build" / "objects.json", "object": obj,
            "opbuilder_name.h": cache / NAME / "build" / "opbuilder_name.h"}[what]
    os.chmod(path, 0o660)
    (key_dir(cache, NAME) / "build.json").unlink()  # so the load goes on to build (and link that object)
    _refused(cache, built[1], path, "is writable by group or others")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
@pytest.mark.parametrize("what", ["operator directory", "library", "toolchains.json"])
def test_an_entry_of_another_user_is_refused(cache, built, what):
    path = _entries(cache)[what]
    os.chown(path, 4242, 4242, follow_symlinks=False)
    msg = _refused(cache, built[1], path, "belongs to uid 4242, not to you (uid 0)")
    assert "OPBUILDER_CACHE_DIR" in msg


def test_a_cache_below_a_directory_others_can_write_is_refused(built, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    cache = copy_cache(built[0], shared / "cache")
    os.chmod(shared, 0o777)  # anyone could rename the cache away and put their own in its place
    with pytest.raises(UnsafeCacheDirError, match=re.escape(f"{shared}, a directory above the opbuilder cache")):
        _load(cache, built[1])
    os.chmod(shared, 0o1777)  # sticky, as /tmp: only the cache's owner may rename it
    assert _load(cache, built[1]).value() == 11


UMASK_BUILD = """
import os, sys
os.umask(0o002)
from opbuilder import CustomOpBuilder
print(CustomOpBuilder("private_op", [sys.argv[1]], build_dir=sys.argv[2]).load().value())
"""


@pytest.mark.build  # its child compiles (tests/build_guard.py)
def test_everything_built_under_umask_002_is_private(tmp_path):
    src = tiny_module(tmp_path / "private_op.cpp", "5")
    cache = tmp_path / "cache"
    for _ in range(2):  # cold, then warm
        res = subprocess.run([PYTHON, "-c", UMASK_BUILD, str(src), str(cache)], capture_output=True, text=True,
                             timeout=300, env=child_env())
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == "5"
    writable = []
    for d, dirs, files in os.walk(cache):
        for name in dirs + files:
            p = os.path.join(d, name)
            if os.lstat(p).st_mode & 0o022:
                writable.append(f"{p} {os.lstat(p).st_mode & 0o777:o}")
    assert writable == []
    assert (os.lstat(cache).st_mode & 0o777) == 0o700
    names = {os.path.basename(p) for p, _, fs in os.walk(cache) for p in fs}  # the files were looked at
    assert {"toolchains.json", "objects.json", "build.json", ".lock"} <= names


@pytest.mark.build
def test_fresh_parents_of_the_cache_are_created_private(built, tmp_path):
    old = os.umask(0o002)
    try:
        root = tmp_path / "a" / "b" / "cache"
        CustomOpBuilder(NAME, [built[1]], build_dir=root).build()
    finally:
        os.umask(old)
    for d in (tmp_path / "a", tmp_path / "a" / "b", root, root / NAME):
        assert (os.lstat(d).st_mode & 0o777) == 0o700, d


FIFO_LOAD = """
import sys
from opbuilder import CustomOpBuilder, UnsafeCacheDirError
try:
    CustomOpBuilder(sys.argv[1], [sys.argv[2]], build_dir=sys.argv[3]).load()
except UnsafeCacheDirError as e:
    print(e)
"""


def test_a_fifo_in_place_of_a_bookkeeping_file_is_refused_without_hanging(cache, built):
    manifest = _entries(cache)["manifest"]
    manifest.unlink()
    os.mkfifo(manifest, 0o600)
    # in a child: an open() that blocks on the FIFO would hang this test run instead of failing it
    try:
        res = subprocess.run([PYTHON, "-c", FIFO_LOAD, NAME, str(built[1]), str(cache)], capture_output=True,
                             text=True, timeout=60, env=child_env())
    except subprocess.TimeoutExpired:
        pytest.fail("a load blocked opening a FIFO planted in the cache")
    assert res.returncode == 0, res.stderr
    assert f"{manifest} is not a regular file" in res.stdout


def test_the_cli_refuses_a_symlinked_cache(cache, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(cache)
    res = subprocess.run([PYTHON, "-m", "opbuilder", "cache", "list", "--cache-dir", str(link)],
                         capture_output=True, text=True, timeout=120, env=child_env())
    assert res.returncode == 1 and f"{link} is a symbolic link" in res.stderr, res.stderr
    assert json.loads((cache / "toolchains.json").read_text())  # untouched


def test_the_pch_files_are_private_under_umask_002(tmp_path):
    from opbuilder.native import pch
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    old = os.umask(0o002)
    try:
        made = pch.prepare(root, "umask")
    finally:
        os.umask(old)
    modes = {p: os.lstat(p).st_mode & 0o777 for p in (root / ".pch", made.dir, made.header)}
    assert modes == {root / ".pch": 0o700, made.dir: 0o700, made.header: 0o600}

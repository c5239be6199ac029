"""to_torch's C++ bridge is built through the pipeline every operator takes (issue 33): its cache entry
is trust-checked (a link or a directory others can write is refused, and nothing planted runs), a
damaged library is built again instead of crashing every process, and ``cache list`` / ``cache clean``
see it.

Each check runs in a process of its own, with a cache root of its own that holds a copy of the
session's bridge (a copied cache is trusted by the SHA-256 its build recorded): a library that is
loaded stays loaded, and a damaged one would crash the process that maps it.
"""
from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

from opbuilder.bridges import torch_bridge as bridge  # noqa: E402
from opbuilder.native import torch_bridge_build as bridge_build  # noqa: E402
from opbuilder.native.headers import include_dir  # noqa: E402

pytestmark = pytest.mark.build

ENTRY = bridge.MODULE + ".lib"  # the bridge's directory in a cache root


def _run(args, root: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OPBUILDER_CACHE_DIR=str(root), OPBUILDER_TORCH_BRIDGE="1")
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=900)


def _load_bridge(root: Path) -> subprocess.CompletedProcess:
    """A new process that loads the bridge from cache ``root`` and prints its status."""
    return _run(["-c", "from opbuilder.bridges import torch_bridge as b; b.ready(wait=True); print(b.status())"], root)


def _library(root: Path) -> Path:
    libs = [p for p in (root / ENTRY).glob(f"*/{bridge.MODULE}*.so") if p.parent.name != "build"]
    assert len(libs) == 1, libs
    return libs[0]


@pytest.fixture
def copied(torch_bridge, cache_dir, tmp_path) -> Path:
    """A cache root of its own holding a copy of the session's bridge entry."""
    root = Path(os.path.realpath(tmp_path)) / "cache"
    root.mkdir(mode=0o700)
    shutil.copytree(Path(cache_dir) / ENTRY, root / ENTRY, symlinks=True)
    return root


def test_the_bridge_is_a_cache_entry_only_its_owner_can_write(torch_bridge, cache_dir):
    entry = Path(os.path.realpath(cache_dir)) / ENTRY
    assert Path(torch_bridge.__file__).parent.parent == entry  # <root>/_opbuilder_torch_bridge.lib/<key>/
    for p in (entry, *entry.rglob("*")):
        st = os.lstat(p)
        assert stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode), p
        assert st.st_mode & 0o077 == 0, f"{p}: mode {stat.S_IMODE(st.st_mode):o}"


def test_the_key_covers_every_opbuilder_header_the_bridge_includes(torch_bridge, cache_dir):
    # the bridge keys only the opbuilder headers it names (bridge_target), not all of them
    deps = list((Path(cache_dir) / ENTRY / "build" / "obj").glob("*.d"))
    assert len(deps) == 1
    inc = str(include_dir())
    read = {os.path.relpath(p, inc) for p in deps[0].read_text().replace("\\\n", " ").split()
            if p.startswith(inc + os.sep) and p.endswith(".h")}
    assert "opbuilder/detail/foreign_api.h" in read and read <= set(bridge_build._HEADERS)


def test_cache_list_and_clean_see_the_bridge(copied):
    listed = _run(["-m", "opbuilder", "cache", "list"], copied)
    assert listed.returncode == 0, listed.stderr
    assert re.search(rf"^{bridge.MODULE}\s+library\s+1 build\(s\)", listed.stdout, re.M), listed.stdout
    assert str(_library(copied)) in listed.stdout
    cleaned = _run(["-m", "opbuilder", "cache", "clean"], copied)
    assert cleaned.returncode == 0, cleaned.stderr
    assert f"removed {copied / ENTRY}" in cleaned.stdout
    assert bridge.MODULE not in _run(["-m", "opbuilder", "cache", "list"], copied).stdout


@pytest.mark.parametrize("what", ["entry", "library"])
def test_a_planted_link_is_refused_and_nothing_is_loaded_from_it(torch_bridge, cache_dir, tmp_path, what):
    planted = Path(os.path.realpath(tmp_path)) / "planted"
    shutil.copytree(Path(cache_dir) / ENTRY, planted)  # a library that would load, if the link were followed
    root = planted.parent / "cache"
    root.mkdir(mode=0o700)
    if what == "entry":
        link = root / ENTRY
        link.symlink_to(planted)
    else:
        shutil.copytree(planted, root / ENTRY)
        link = _library(root)
        link.unlink()
        link.symlink_to(planted / link.parent.name / link.name)
    r = _load_bridge(root)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith(
        f"failed: UnsafeCacheDirError: opbuilder cache entry {link} is a symbolic link (to {os.readlink(link)}), and "
        f"opbuilder follows none in its cache; nothing is built or loaded from it."), r.stdout


@pytest.mark.parametrize("what", ["entry", "build"])
def test_a_directory_others_can_write_is_refused(copied, what):
    d = copied / ENTRY if what == "entry" else _library(copied).parent
    d.chmod(0o770)
    r = _load_bridge(copied)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith(
        f"failed: UnsafeCacheDirError: opbuilder cache entry {d} is writable by group or others (mode 770); "
        f"nothing is built or loaded from it. Fix: chmod go-w {d}"), r.stdout


@pytest.mark.parametrize("damage", ["truncated", "zeroed"])
def test_a_damaged_bridge_is_built_again(copied, damage):
    lib = _library(copied)
    size = lib.stat().st_size
    if damage == "truncated":
        os.truncate(lib, 4096)
        why = f"is broken (4096 bytes where {size} were published)"
    else:
        with open(lib, "r+b") as f:
            f.write(bytes(size))
        why = "is broken (its SHA-256 is not the one published)"
    r = _load_bridge(copied)
    assert r.returncode == 0, r.stderr  # not a SIGBUS
    assert f"{lib} {why}; building it again" in r.stderr
    assert r.stdout.strip() == f"loaded from {lib}"
    assert lib.read_bytes()[:4] == b"\x7fELF" and lib.stat().st_size > 4096
    assert _load_bridge(copied).stdout.strip() == f"loaded from {lib}"  # and it stays healed


@pytest.mark.parametrize("into", ["cache", "store"])
def test_a_bundle_carries_the_bridge_to_another_cache_or_a_store(torch_bridge, cache_dir, tmp_path, into):
    tmp = Path(os.path.realpath(tmp_path))
    exported = _run(["-m", "opbuilder", "export", bridge.MODULE, "-o", str(tmp / "bridge.tar")], Path(cache_dir))
    assert exported.returncode == 0, exported.stderr
    root = tmp / "cache"
    root.mkdir(mode=0o700)
    store = tmp / "store"
    args = ["-m", "opbuilder", "import", str(tmp / "bridge.tar")]
    imported = _run(args + (["--into", str(store)] if into == "store" else []), root)
    assert imported.returncode == 0, imported.stderr
    env = dict(os.environ, OPBUILDER_CACHE_DIR=str(root), OPBUILDER_TORCH_BRIDGE="1",
               **({"OPBUILDER_PREBUILT_DIR": str(store)} if into == "store" else {}))
    r = subprocess.run([sys.executable, "-c", "from opbuilder.bridges import torch_bridge as b; b.ready(wait=True); "
                        "print(b.status())"], env=env, capture_output=True, text=True, timeout=900)
    where = store if into == "store" else root
    assert r.stdout.strip().startswith(f"loaded from {where / ENTRY}/"), (r.stdout, r.stderr)
    assert "building" not in r.stderr  # nothing compiled: the bundle's build is the one for this torch

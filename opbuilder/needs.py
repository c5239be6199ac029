"""The shared libraries a module loads first, recorded in its build so a warm load() looks nothing up.

A nanobind operator needs nanobind's runtime and (usually) the core library loaded before it is
imported. Finding them is planning and a lookup each (toolchain facts, keys, manifests: ~1 ms). Once
they have been found for a build in the cache, its ``build.json`` records them (``needs``: the cache
directory, key and file of each, and the file's stat stamp as verified then); a later load() in any
process checks each with one ``lstat``: the same stamp (size, times, inode, device) is the same file,
and it is loaded. Anything else (a dependency rebuilt, pruned, copied) falls back to the lookup,
which records the new ones. Only names of the libraries opbuilder builds itself are accepted, so a
record can point nowhere but at their directories in the same cache.
"""
from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path
from typing import List, Optional, Sequence

from .core_lib import CORE_FILE, CORE_NAME
from .published import INFO, verified_record
from .trust import read_file, stamp_of

__all__ = ["RUNTIME_NAME", "recorded", "record", "preload", "preload_runtime", "loaded_runtime"]

# nanobind's runtime (built by nanobind_runtime.py) is loaded here, with the process's record of it,
# so that a warm load() imports nothing that builds it
RUNTIME_NAME = "_nanobind"  # its cache directory: _nanobind.lib
_FILES = {f"{RUNTIME_NAME}.lib": "libnanobind.so", f"{CORE_NAME}.lib": CORE_FILE}
_runtime: Optional[str] = None  # the runtime this process loaded
_lock = threading.Lock()
_HEX = frozenset("0123456789abcdef")


def _is_key(key: object) -> bool:
    """A build key as the builder writes them (hex): never a path (no ``/``, no ``..``)."""
    return isinstance(key, str) and 8 <= len(key) <= 64 and _HEX.issuperset(key)


def _entry(lib: Path) -> Optional[dict]:
    """The record of dependency ``lib`` (``<root>/<dir>/<key>/<file>``), or None if it is not one."""
    key_dir = lib.parent
    name = key_dir.parent.name
    if _FILES.get(name) != lib.name or not _is_key(key_dir.name):
        return None
    try:
        st = os.lstat(lib)
    except OSError:
        return None
    return {"dir": name, "key": key_dir.name, "file": lib.name, "stamp": stamp_of(st)}


def recorded(lib: Path, names: Sequence[str]) -> Optional[List[Path]]:
    """The dependencies recorded for module ``lib`` (in the cache) whose directories are ``names``,
    if every one is there, unchanged since it was recorded; else None (look them up)."""
    data = verified_record(lib.parent)  # parsed by the lookup that found ``lib`` just before
    if data is None:
        try:
            data = json.loads(read_file(lib.parent / INFO))
        except (OSError, ValueError):
            return None
    entries = data.get("needs") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return None
    root = lib.parent.parent.parent
    by_dir = {e.get("dir"): e for e in entries if isinstance(e, dict)}
    out = []
    for name in names:
        e = by_dir.get(name)
        if e is None or _FILES.get(name) != e.get("file") or not _is_key(e.get("key")):
            return None
        path = root / name / e["key"] / e["file"]
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode) or stamp_of(st) != e.get("stamp"):
            return None
        out.append(path)
    return out


def record(lib: Path, deps: Sequence[Path]) -> None:
    """Record ``deps`` (verified just now) in module ``lib``'s build.json, those in the same cache;
    best effort (a cache that cannot be written is looked up again next time)."""
    from .fingerprint import write_json_atomic

    root = lib.parent.parent.parent
    entries = [e for d in deps if d.parent.parent.parent == root for e in [_entry(d)] if e is not None]
    info = lib.parent / INFO
    try:
        data = json.loads(read_file(info))
        if not isinstance(data, dict) or data.get("needs") == entries:
            return
        data["needs"] = entries
        write_json_atomic(info, data)
    except (OSError, ValueError):
        pass


def loaded_runtime() -> Optional[Path]:
    """nanobind's runtime as this process loaded it, if it did."""
    return None if _runtime is None else Path(_runtime)


def preload_runtime(library: Path) -> None:
    """Load nanobind's runtime at ``library`` into the process's global symbol scope, once per
    process (a later call with another build keeps the first: nanobind's state lives in the one loaded)."""
    global _runtime
    if _runtime is not None:
        return
    with _lock:
        if _runtime is None:
            from .core_lib import dlopen_global
            dlopen_global(str(library))
            _runtime = str(library)


def preload(libs: Sequence[Path]) -> None:
    """Load each of ``libs`` into the process's global symbol scope (nanobind's runtime: the first
    one only; core libraries: each file once)."""
    from . import core_lib

    for lib in libs:
        if lib.parent.parent.name == f"{RUNTIME_NAME}.lib":
            preload_runtime(lib)
        else:
            core_lib.preload(lib)

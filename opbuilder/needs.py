"""The shared libraries a module loads first, recorded in its build so a warm load() looks nothing up.

A nanobind operator needs nanobind's runtime and (usually) the core library loaded before it is
imported. Finding them is planning and a lookup each (toolchain facts, keys, manifests: ~1 ms). Once
they have been found for a build in the cache, ``record`` writes them into its ``build.json``
(``needs``: the cache directory, key and file of each, and the file's stat stamp as verified then);
a later load() in any process checks each with one ``lstat`` (importer.recorded): the same stamp
(size, times, inode, device) is the same file, and it is loaded. Anything else (a dependency
rebuilt, pruned, copied) falls back to the lookup, which records the new ones. Only names of the
libraries opbuilder builds itself are recorded (importer.DEP_FILES), so a record can point nowhere
but at their directories in the same cache. This module is the cold path only: a warm load()
never imports it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional, Sequence

from .importer import DEP_FILES, INSTALLED_KEY, NATIVE_DIR, is_key
from .cache.published import INFO
from .cache.trust import read_file, stamp_of

__all__ = ["record"]


def _entry(lib: Path) -> Optional[dict]:
    """The record of dependency ``lib`` (``<root>/<dir>/<key>/<file>``, or opbuilder's installed runtime:
    key ``installed``), or None if it is not one."""
    key_dir = lib.parent
    name = key_dir.parent.name
    key = key_dir.name
    if str(key_dir) == NATIVE_DIR:
        name = next((d for d, f in DEP_FILES.items() if f == lib.name), "")
        key = INSTALLED_KEY
    elif not is_key(key):
        return None
    if DEP_FILES.get(name) != lib.name:
        return None
    try:
        st = os.lstat(lib)
    except OSError:
        return None
    return {"dir": name, "key": key, "file": lib.name, "stamp": stamp_of(st)}


def record(lib: Path, deps: Sequence[Path]) -> None:
    """Record ``deps`` (verified just now) in module ``lib``'s build.json, those in the same cache;
    best effort (a cache that cannot be written is looked up again next time)."""
    from .cache.fingerprint import write_json_atomic

    root = lib.parent.parent.parent
    entries = [e for d in deps if d.parent.parent.parent == root or str(d.parent) == NATIVE_DIR
               for e in [_entry(d)] if e is not None]
    info = lib.parent / INFO
    try:
        data = json.loads(read_file(info))
        if not isinstance(data, dict) or data.get("needs") == entries:
            return
        data["needs"] = entries
        write_json_atomic(info, data)
    except (OSError, ValueError):
        pass

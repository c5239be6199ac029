"""The cache directory: where it is, and what is in it.

``OPBUILDER_CACHE_DIR`` (default ``~/.cache/opbuilder``). Directories are
created mode 0700. A cache directory that is a symbolic link, that another
user owns, that group or others can write to, or that sits below a directory
someone else can write is refused (trust.trusted_root): anyone who can write
there could plant a library that we would load.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

from ..spec import cache_root  # noqa: F401  (defined there: a load() imports spec.py, not this module)


__all__ = ["cache_root", "root_origin", "CachedOp", "list_operators", "remove_operator", "dir_size"]


def root_origin(root: Path) -> str:
    """Where the cache root ``root`` came from, for messages: ``OPBUILDER_CACHE_DIR='...'``, the
    default under ``HOME``, or a ``build_dir`` argument."""
    env = os.environ.get("OPBUILDER_CACHE_DIR")
    if env and cache_root() == root:
        return f"OPBUILDER_CACHE_DIR={env!r}"
    if root == Path.home() / ".cache" / "opbuilder":
        return f"the default ~/.cache/opbuilder, with HOME={os.environ.get('HOME', '')!r}"
    return f"build_dir={str(root)!r}"


# What is in the cache: for ``python -m opbuilder cache list|clean``.

class CachedOp:
    """One operator's directory in the cache and its published builds (newest first)."""

    def __init__(self, name: str, kind: str, path: Path, builds: List[dict], size: int) -> None:
        self.name, self.kind, self.path, self.builds, self.size = name, kind, path, builds, size


def dir_size(path: Path) -> int:
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(d, f)).st_size
            except OSError:
                pass
    return total


def _op_entry(path: Path) -> Optional[CachedOp]:
    """The operator cached in ``path`` (built here: ``build/``, ``.lock``; or imported from a bundle:
    ``deps/``); None if it is not one, or if all it holds is its lock file (what ``remove_operator`` leaves)."""
    import json

    from .lock import LOCK_FILE  # lock.py (and filelock) only for the CLI's listing, not a warm load()

    name, kind = (path.name[:-4], "library") if path.name.endswith(".lib") else (path.name, "module")
    if not name.isidentifier() or not any((path / p).exists() for p in ("build", LOCK_FILE, "deps")):
        return None
    if all(child.name == LOCK_FILE for child in path.iterdir()):
        return None
    builds = []
    for d in path.iterdir():
        info = d / "build.json"
        if d.is_dir() and not d.is_symlink() and info.is_file():
            try:
                data = json.loads(info.read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(data, dict) or not isinstance(data.get("built_at"), (int, float)):
                continue  # not a record this version wrote: the next load rebuilds it
            libs = [p for p in d.iterdir() if p.suffix == ".so" and not p.name.startswith(".")]
            data.update(key=d.name, library=str(libs[0]) if libs else None)
            builds.append(data)
    builds.sort(key=lambda b: b.get("built_at", 0), reverse=True)
    return CachedOp(name, kind, path, builds, dir_size(path))


def list_operators(root: Path, name: Optional[str] = None) -> List[CachedOp]:
    """The operators cached under ``root`` (only ``name``'s, module and library, if given)."""
    if not root.is_dir():
        return []
    out = []
    for p in sorted(root.iterdir()):
        if p.is_dir() and not p.is_symlink() and (name is None or p.name in (name, f"{name}.lib")):
            entry = _op_entry(p)
            if entry is not None:
                out.append(entry)
    return out


def remove_operator(op: CachedOp) -> bool:
    """Delete everything an operator has cached, unless a build of it is running (then False).

    All of it goes while its lock is held, except the lock file itself: a
    build waiting for the lock has it open, and gets the lock once we are
    done. Were the file removed, that build would hold a lock on a file no
    longer in the directory while another process created a new one and
    locked that: two builds in one directory at once (filelock leaves its
    files in place for the same reason).
    """
    import shutil

    from .lock import LOCK_FILE, try_lock

    with try_lock(op.path) as free:
        if not free:
            return False
        for child in op.path.iterdir():
            if child.name != LOCK_FILE:
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
    return True

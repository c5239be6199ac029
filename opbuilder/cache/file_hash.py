"""SHA-256 of files, and a check of files against recorded hashes: how shipped binaries and opbuilder's
installed runtime are trusted (cache/shipped.py, native/installed.py). Files outside the cache (a wheel's,
in site-packages) may belong to another user, so they are checked by content, not by owner."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["sha256_of", "files_intact", "inside"]


def sha256_of(path: Path) -> str:
    """The SHA-256 of the file at ``path`` (read without following a symlink)."""
    from .published import _sha256_of

    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return _sha256_of(fd)
    finally:
        os.close(fd)


def files_intact(directory: Path, files: object) -> bool:
    """Whether each ``{relative path: sha256}`` of ``files`` under ``directory`` has that SHA-256."""
    if not isinstance(files, dict) or not files:
        return False
    for rel, digest in files.items():
        if not inside(rel):
            return False
        try:
            if sha256_of(directory / rel) != digest:
                return False
        except OSError:
            return False
    return True


def inside(rel: object) -> bool:
    """A relative path that stays in its directory (no absolute path, no ``..``)."""
    return isinstance(rel, str) and not os.path.isabs(rel) and ".." not in Path(rel).parts

"""Hashes of files, and a check of files against recorded hashes: how shipped binaries and opbuilder's
installed runtime are trusted (cache/shipped.py, native/installed.py). Files outside the cache (a wheel's,
in site-packages) may belong to another user, so they are checked by content, not by owner.

The hash is BLAKE2b-256 from ``_blake2``, as the cache's keys use it (fingerprint.py): hashlib's SHA-256
imports OpenSSL first, which cost a shipped load() 10-50 ms on a loaded machine."""
from __future__ import annotations

import os
from pathlib import Path

try:
    from _blake2 import blake2b
except ImportError:  # pragma: no cover - an interpreter without the builtin module
    from hashlib import blake2b

__all__ = ["HASH", "file_hash", "files_intact", "inside"]

HASH = "blake2b-256"  # what records name the hash they hold


def file_hash(path: Path) -> str:
    """The BLAKE2b-256 of the file at ``path`` (hex; read without following a symlink)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        h = blake2b(digest_size=32)
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return h.hexdigest()
            h.update(chunk)
    finally:
        os.close(fd)


def files_intact(directory: Path, files: object) -> bool:
    """Whether each ``{relative path: hash}`` of ``files`` under ``directory`` has that hash (file_hash)."""
    if not isinstance(files, dict) or not files:
        return False
    for rel, digest in files.items():
        if not inside(rel):
            return False
        try:
            if file_hash(directory / rel) != digest:
                return False
        except OSError:
            return False
    return True


def inside(rel: object) -> bool:
    """A relative path that stays in its directory (no absolute path, no ``..``)."""
    return isinstance(rel, str) and not os.path.isabs(rel) and ".." not in Path(rel).parts

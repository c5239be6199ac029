"""Where opbuilder's C++ headers are, and a hash of their contents.

In a source checkout they are in ``include/`` beside the package; an
installed wheel carries them as ``opbuilder/include``.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

__all__ = ["include_dir", "headers_digest"]

_PKG = Path(__file__).resolve().parent


@lru_cache(maxsize=None)
def include_dir() -> Path:
    for candidate in (_PKG / "include", _PKG.parent / "include"):
        if (candidate / "opbuilder" / "extension.h").is_file():
            return candidate
    raise FileNotFoundError(f"opbuilder's C++ headers were not found next to {_PKG}; reinstall opbuilder")


@lru_cache(maxsize=None)
def headers_digest() -> str:
    """Content hash of every header opbuilder ships (part of every cache key)."""
    h = hashlib.blake2b(digest_size=16)
    root = include_dir()
    for p in sorted(root.rglob("*.h")):
        h.update(str(p.relative_to(root)).encode())
        h.update(b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()

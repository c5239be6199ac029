"""Hashes of files, and a check of files against recorded hashes: how shipped binaries and opbuilder's
installed runtime are trusted (cache/shipped.py, native/installed.py). Files outside the cache (a wheel's,
in site-packages) may belong to another user, so they are checked by content, not by owner.

The hash is BLAKE2b-256 from ``_blake2`` (``file_hash``). These are defined in importer.py, which a
shipped load() imports (and not this module: each module is ~0.3 M instructions of a new process);
here under their old names.
"""
from __future__ import annotations

from ..importer import HASH, file_hash, files_intact, inside

__all__ = ["HASH", "file_hash", "files_intact", "inside"]

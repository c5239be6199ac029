"""Where opbuilder's C++ headers are, and a hash of their contents.

In a source checkout they are in ``include/`` beside the package; an
installed wheel carries them as ``opbuilder/include``. The digest is part of
every cache key; it is computed once and remembered (``probe_cache``) until
a header or a header directory changes.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional, Tuple

from .fingerprint import blake2b
from .probe_cache import remembered

__all__ = ["include_dir", "headers_digest"]

_PKG = os.path.dirname(os.path.realpath(__file__))
_include_dir: Optional[Path] = None


def include_dir() -> Path:
    """The directory to put on the include path for ``#include "opbuilder/extension.h"``."""
    global _include_dir
    if _include_dir is None:
        for candidate in (os.path.join(_PKG, "include"), os.path.join(os.path.dirname(_PKG), "include")):
            if os.path.isfile(os.path.join(candidate, "opbuilder", "extension.h")):  # os.path: on the warm path
                _include_dir = Path(candidate)
                break
        else:
            raise FileNotFoundError(f"opbuilder's C++ headers were not found next to {_PKG}; reinstall opbuilder")
    return _include_dir


def _digest_now(root: str) -> Tuple[dict, List[str]]:
    h = blake2b(digest_size=16)
    watched = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        watched.append(d)  # a directory's stamp changes when a header is added, removed or renamed
        for name in sorted(files):
            if not name.endswith((".h", ".hpp", ".cuh")):
                continue
            p = os.path.join(d, name)
            with open(p, "rb") as f:
                data = f.read()
            h.update(os.path.relpath(p, root).encode() + b"\0" + data + b"\0")
            watched.append(p)
    return {"digest": h.hexdigest()}, watched


def headers_digest(state_dir: Optional[Path] = None) -> str:
    """Content hash of every header opbuilder ships (part of every cache key)."""
    root = str(include_dir())
    return str(remembered(state_dir, f"headers {root}", lambda: _digest_now(root), schema={"digest": str})["digest"])

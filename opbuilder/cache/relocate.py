"""Relocatable keys: paths named relative to the operator's project, never where a checkout lives.

The *project root* of an operator is the nearest directory at or above its
sources' common directory that holds ``.git`` (a checkout), else that common
directory itself. Keys name every file under the root by its path relative to
the root (``src/ops.cpp``), and files elsewhere (system headers, another
project's include path) by their absolute path. So the same sources in
another clone or copy hash to the same key; contents are hashed as before.

What could still put the root's absolute path into the binary (``__FILE__``,
debug information) is mapped away when compiling: ``-ffile-prefix-map=ROOT=.``
for gcc and clang, passed to nvcc's host compiler with ``-Xcompiler`` (the
builder maps the toolchain's include directories the same way, to fixed
names). Under sccache gcc gets it as ``-Wp,-ffile-prefix-map=...``, which
sccache does not hash (``prefix_map_flags``). No map is part of any key.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence, Tuple

from ..spec import clean_path  # noqa: F401  (defined there: a load() imports spec.py, not this module)

__all__ = ["project_root", "portable", "resolve", "prefix_map_flags", "clean_path"]


def project_root(sources: Sequence[Path]) -> Path:
    """The directory that paths in keys are relative to (see the module's docstring)."""
    common = os.path.commonpath([os.path.dirname(s) for s in sources])
    d = common
    while True:
        if os.path.lexists(os.path.join(d, ".git")):
            return Path(d)
        parent = os.path.dirname(d)
        if parent == d:
            return Path(common)
        d = parent


def portable(path: str, root: Path) -> str:
    """``path`` (absolute) as keys name it: relative to ``root`` if it is under it (``.`` for ``root``
    itself), else as it is."""
    r = str(root).rstrip("/")
    if path == r:
        return "."
    prefix = r + "/"
    return path[len(prefix):] if path.startswith(prefix) else path


def resolve(name: str, root: Path) -> str:
    """The absolute path a key's name stands for, under ``root`` (inverse of ``portable``)."""
    return name if os.path.isabs(name) else os.path.join(str(root), name)


def prefix_map_flags(root: Path, family: str, via_preprocessor: bool = False, to: str = ".") -> Tuple[str, ...]:
    """Compiler flags that write ``root`` as ``to`` wherever the compiler would embed it (gcc >= 8, clang >= 10).
    Of several maps that match a path, gcc applies the last one given.

    ``via_preprocessor`` (gcc under sccache): the same map as ``-Wp,-ffile-prefix-map=ROOT=.``, which gcc
    hands to the compiler proper unchanged (``__FILE__`` and debug information are mapped alike) and
    which sccache counts as a preprocessor flag: not hashed, its effect being in the preprocessed text
    that ``SCCACHE_BASEDIRS`` makes checkout-independent. The plain flag is hashed as written (sccache
    0.16), so two checkouts at different paths never share a compile. Not with ccache, which does not
    cache a compile with such a ``-Wp`` option, nor for a path holding a comma (``-Wp`` splits there)."""
    if family not in ("gcc", "clang"):
        return ()
    if via_preprocessor and family == "gcc" and "," not in str(root) + to:
        return (f"-Wp,-ffile-prefix-map={root}={to}",)
    return (f"-ffile-prefix-map={root}={to}",)

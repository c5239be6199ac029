"""Where opbuilder's C++ headers and sources are, and a hash of their contents.

In a source checkout they are in ``include/`` and ``src/`` beside the package;
an installed wheel carries them as ``opbuilder/include`` and ``opbuilder/src``.
``src/core/`` holds the bodies of the core's functions (the core library's
sources, which builds without it compile inline), so the digest covers them
with the headers. It is part of every cache key; it is computed once and
remembered (``probe_cache``) until a file or a directory in them changes.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..cache.fingerprint import blake2b
from ..tools.probe_cache import remembered

__all__ = ["include_dir", "source_dir", "headers_digest", "shadowing_copy", "copy_read"]

_PKG = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # the opbuilder package
_include_dir: Optional[Path] = None
_source_dir: Optional[Path] = None


def _beside_package(name: str, probe: str, what: str) -> Path:
    """``name`` in the installed package (a wheel) or beside it (a checkout): the one holding ``probe``."""
    for candidate in (os.path.join(_PKG, name), os.path.join(os.path.dirname(_PKG), name)):
        if os.path.isfile(os.path.join(candidate, probe)):  # os.path: on the warm path
            return Path(candidate)
    raise FileNotFoundError(f"opbuilder's C++ {what} were not found next to {_PKG}; reinstall opbuilder")


def include_dir() -> Path:
    """The directory to put on the include path for ``#include "opbuilder/extension.h"``."""
    global _include_dir
    if _include_dir is None:
        _include_dir = _beside_package("include", os.path.join("opbuilder", "extension.h"), "headers")
    return _include_dir


def source_dir() -> Path:
    """opbuilder's C++ sources (``src/``): the core library's (``core/core_lib.cpp``, with the bodies
    the headers include when built without it) and the torch bridge's (``torch_bridge.cpp``). The
    headers reach ``core/`` by a path relative to themselves (``../../src/core``)."""
    global _source_dir
    if _source_dir is None:
        _source_dir = _beside_package("src", os.path.join("core", "core_lib.cpp"), "sources")
    return _source_dir


def _digest_now(roots: Sequence[Tuple[str, str, Tuple[str, ...]]]) -> Tuple[dict, List[str]]:
    h = blake2b(digest_size=16)
    watched = []
    for root, label, suffixes in roots:
        for d, dirs, files in os.walk(root):
            dirs.sort()
            watched.append(d)  # a directory's stamp changes when a file is added, removed or renamed
            for name in sorted(files):
                if not name.endswith(suffixes):
                    continue
                p = os.path.join(d, name)
                with open(p, "rb") as f:
                    data = f.read()
                h.update(label.encode() + os.path.relpath(p, root).encode() + b"\0" + data + b"\0")
                watched.append(p)
    return {"digest": h.hexdigest()}, watched


def headers_digest(state_dir: Optional[Path] = None) -> str:
    """Content hash of every header opbuilder ships and of the core's bodies (src/core/), which the
    headers include in builds without the core library (part of every cache key, and of the core's tag)."""
    root = str(include_dir())
    core = str(source_dir() / "core")
    roots = ((root, "", (".h", ".hpp", ".cuh")), (core, "src/core/", (".cpp",)))
    return str(remembered(state_dir, f"headers {root} {core}", lambda: _digest_now(roots),
                          schema={"digest": str})["digest"])


def shadowing_copy(dirs: Sequence[Tuple[str, str]]) -> Optional[Tuple[str, str, str]]:
    """(directory, how it is on the include path, header) for the first of ``dirs`` (directory, how) that
    holds a copy of opbuilder's headers (``<dir>/opbuilder/...``) with a header whose contents differ
    from the installed one of that name; None if none does. Such a directory, searched before
    opbuilder's own, would have a source compile against the copy while the core library, nanobind's
    runtime and the precompiled header are built from the installed headers. Cold builds only."""
    installed = os.path.join(str(include_dir()), "opbuilder")
    own = os.path.realpath(str(include_dir()))
    for d, how in dirs:
        copy = os.path.join(d, "opbuilder")
        if not os.path.isdir(copy) or os.path.realpath(d) == own:
            continue
        for root, subdirs, files in os.walk(copy):
            subdirs.sort()
            for name in sorted(files):
                rel = os.path.relpath(os.path.join(root, name), copy)
                mine = os.path.join(installed, rel)
                if not name.endswith((".h", ".hpp", ".cuh")) or not os.path.isfile(mine):
                    continue
                try:
                    with open(os.path.join(root, name), "rb") as f, open(mine, "rb") as g:
                        same = f.read() == g.read()
                except OSError:
                    same = False
                if not same:
                    return d, how, f"opbuilder/{rel}"
    return None


def copy_read(inputs: Dict[str, str]) -> Optional[Tuple[str, str]]:
    """(file, header) for a file a compile read (``inputs``: path -> digest, as recorded from its
    depfiles) that is a copy of opbuilder's ``header`` (``.../opbuilder/<header>``) whose contents differ
    from the installed one; None if there is none. What ``shadowing_copy`` cannot see beforehand (an
    ``-include`` of a copy, a relative ``#include "../vendor/opbuilder/..."``), read from what was used."""
    from ..cache.fingerprint import ABSENT, file_digest

    installed = os.path.join(str(include_dir()), "opbuilder")
    own = os.path.realpath(installed) + "/"
    for path, digest in inputs.items():
        at = path.rfind("/opbuilder/")
        if at < 0 or digest == ABSENT or os.path.realpath(path).startswith(own):
            continue
        rel = path[at + len("/opbuilder/"):]
        mine = os.path.join(installed, rel)
        if not os.path.isfile(path[:at] + "/opbuilder/extension.h"):
            continue  # an opbuilder/ folder of the user's own, not a copy of opbuilder's headers
        try:
            if file_digest(Path(mine)) == digest:
                continue
        except OSError:
            continue  # not one of opbuilder's headers
        return path, f"opbuilder/{rel}"
    return None

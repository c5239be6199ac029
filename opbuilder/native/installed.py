"""opbuilder's own native runtime, built when opbuilder is installed (hatch_build.py).

``pip install .``, ``pip install -e .`` and ``pip wheel .`` compile nanobind's runtime and the core
library once (install_build.py) into ``opbuilder/_native/``, with ``native.json``: the ABI they were
built for (abi.py: opbuilder's headers, nanobind's version, the Python API, the C++ library ABI) and
the hash (BLAKE2b-256) of each file. A nanobind operator then finds them there first (``library_for``), built or
shipped, and the first ``load()`` in a fresh environment compiles only the operator. They serve it when
the ABI it is built for is theirs, whichever compiler builds it; otherwise (another nanobind, a
libc++ toolchain, an edited header) the builder builds its own in the cache, as before.
``OPBUILDER_INSTALLED_RUNTIME=0`` ignores them (the test suite does, to test the JIT builds).

A shipped load() (cache/shipped.py) asks ``installed(by_owner=True)``: files that only the owner of
opbuilder's own code can write, each of the size its record gives, are taken as installed without
hashing them (~0.5 MB, a third of a shipped load, issue 35), as the installed PCH is (pch.py). Whoever
could change them could change the code that checks them. Anything else (another owner, a file others
can write, a record without sizes) is hashed, as a build that links them always hashes them
(``library_for``, once per change of their stamps) and as ``opbuilder doctor`` does.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Optional

from ..importer import CORE_FILE, RUNTIME_FILE
from ..importer import NATIVE_DIR as _NATIVE_DIR

__all__ = ["NATIVE_DIR", "MANIFEST", "Native", "installed", "library_for", "last_why", "why_not"]

NATIVE_DIR = Path(_NATIVE_DIR)  # as importer.py names it (no resolve(): a realpath is ~20 lstat calls)
_PKG_DIR = NATIVE_DIR.parent  # opbuilder's own code
MANIFEST = "native.json"


class Native:
    """The installed runtime: its directory and its record (native.json). A plain class: a NamedTuple
    is compiled when its module is imported, on a shipped load()'s path."""

    __slots__ = ("dir", "record")

    def __init__(self, dir: Path, record: Dict[str, object]) -> None:
        self.dir, self.record = dir, record

    @property
    def runtime(self) -> Path:
        return self.dir / RUNTIME_FILE

    @property
    def core(self) -> Path:
        return self.dir / CORE_FILE


_memo: Dict[str, object] = {}  # "native" -> Native or None; (kind, cxx abi) -> path or None


def enabled() -> bool:
    return os.environ.get("OPBUILDER_INSTALLED_RUNTIME", "1") != "0"


def installed(directory: Optional[Path] = None, state_dir: Optional[Path] = None,
              by_owner: bool = False) -> Optional[Native]:
    """The installed runtime, if its record is there and each file has its recorded hash (a file
    changed since the install is refused, never loaded). Checked once per process; with ``state_dir``
    (the cache, on a JIT load) the result is remembered there while the files' stamps stay the same,
    so a later process hashes nothing. ``by_owner`` (a shipped load): files that pass ``_owned`` are
    not hashed (see the module's docstring)."""
    if directory is None:
        if "native" in _memo:  # hashed: serves both
            return _memo["native"]  # type: ignore[return-value]
        if by_owner and "owned" in _memo:
            return _memo["owned"]  # type: ignore[return-value]
    d = NATIVE_DIR if directory is None else directory
    found = None
    owned = False
    try:
        from ..importer import HASH, files_intact, inside, read_record  # a shipped load() has it
        record = read_record(f"{d}/{MANIFEST}")  # its marshal copy native.rec when there (importer.read_record)
        files = record.get("files") if isinstance(record, dict) and record.get("hash") == HASH else None
        if isinstance(files, dict) and all(inside(f) for f in files):
            if by_owner and _owned(d, files, record.get("sizes")):
                ok = owned = True
            elif state_dir is None:
                ok = files_intact(d, files)
            else:
                from ..tools.probe_cache import remembered
                paths = [str(d / f) for f in sorted(files)]
                ok = bool(remembered(state_dir, f"installed runtime {d} {sorted(files.items())}",
                                     lambda: ({"ok": files_intact(d, files)}, paths), inputs=paths,
                                     schema={"ok": bool})["ok"])
            if ok:
                found = Native(d, record)
    except (OSError, ValueError):
        pass
    if directory is None:
        _memo["owned" if owned else "native"] = found
    return found


def _owned(d: Path, files: Dict[str, object], sizes: object) -> bool:
    """Whether directory ``d`` and each of ``files`` in it belong to the owner of opbuilder's own code
    (the package directory), only that owner can write them, and each file (a regular one, not a link)
    has the size ``sizes`` records: then no one could have changed them who could not change that code
    (importer.py defines the check: a shipped load() runs it without importing this module)."""
    from ..importer import owned_by_code_owner
    return owned_by_code_owner(str(d), files, sizes, _PKG_DIR)


def current_abi(cxx_abi: str, root: Optional[Path] = None) -> Dict[str, str]:
    """The ABI a nanobind operator built here with a compiler of C++ library ABI ``cxx_abi`` needs."""
    from ..tools.toolchain import nanobind_info
    from .abi import python_api
    from .headers import headers_digest

    return {"headers": headers_digest(root), "nanobind": nanobind_info(root).version, "python": python_api(),
            "cxx": cxx_abi}


def why_not_installed(want: Dict[str, str]) -> Optional[str]:
    """``why_not`` for the installed runtime as its owner left it (importer.shipped_fit asks, through its
    caller, when the owned record does not match: importer.py does not import this module)."""
    return why_not(installed(by_owner=True), want)


def why_not(native: Optional[Native], want: Dict[str, str]) -> Optional[str]:
    """Why the installed runtime does not serve an operator built for ABI ``want``; None when it does."""
    if native is None:
        return (f"opbuilder's installed runtime is missing or was modified ({NATIVE_DIR}: reinstall opbuilder "
                f"with a C++ compiler present)")
    have = native.record.get("abi")
    if not isinstance(have, dict):
        return f"{native.dir / MANIFEST} records no ABI"
    for part in ("python", "nanobind", "cxx", "headers"):
        if have.get(part) != want.get(part):
            return (f"opbuilder's installed runtime was built for {part} {have.get(part)!r}, this build needs "
                    f"{want.get(part)!r}")
    return None


def last_why() -> str:
    """Why opbuilder's installed runtime did not serve the last build that asked for it."""
    if not enabled():
        return "OPBUILDER_INSTALLED_RUNTIME=0 turns opbuilder's installed runtime off"
    return str(_memo.get("why") or why_not(installed(), {}) or "opbuilder's installed runtime does not fit")


def library_for(kind: str, cxx_abi: str, root: Optional[Path] = None) -> Optional[Path]:
    """The installed library of ``kind`` ("runtime": nanobind's, "core": the core library) for an operator
    built here with a compiler of C++ library ABI ``cxx_abi`` (``root``: the cache, where the facts it
    needs are remembered); None to build it in the cache."""
    if not enabled() or kind not in ("runtime", "core"):
        return None
    memo = (kind, cxx_abi)
    if memo not in _memo:
        native = installed(state_dir=root)
        why = why_not(native, current_abi(cxx_abi, root))
        _memo["why"] = why
        _memo[memo] = None if why is not None else (native.runtime if kind == "runtime" else native.core)  # type: ignore
    return _memo[memo]  # type: ignore[return-value]

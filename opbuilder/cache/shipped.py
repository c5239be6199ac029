"""Operators shipped prebuilt in a wheel (opbuilder.build_meta): found, checked and loaded by ``load()``.

A wheel built by ``opbuilder.build_meta`` carries, in the package that holds an operator's sources,
``opbuilder_ops.json`` (``RECORD``) and each operator's binary under ``_opbuilder/``. The record says,
per operator: the binary and its hash (BLAKE2b-256), the options it was built with, the hash of each source
and of each header beside them, and the ABI it needs (native/abi.py: Python API, nanobind, C++ library
ABI, opbuilder's headers). ``CustomOpBuilder(name, sources).load()`` looks for the record beside its
sources first (a few ``stat``s), and uses the binary when

- the sources, headers and options are the ones it was built from (the key),
- opbuilder's installed runtime (native/installed.py) was built for the same ABI,
- and the binary has the hash recorded when it was built (a modified one is never loaded).

Then nothing is compiled, no process is started and nothing is written to the cache. Otherwise the
reason is kept: load() builds (the JIT fallback; with a warning when the binary was modified), or,
under ``OPBUILDER_NO_BUILD=1``, raises ``NoBuildError`` with it (``refuse_build``).

A shipped load() imports importer.py only, where the check and the load are (``shipped_fit``,
``shipped_module``: each module is ~0.3 M instructions of a new process, issue 35). This module is
imported when the binary does not fit (``built_instead``: build, or say why not), by the wheel build
(``record_entry``) and by ``doctor``; how files are hashed (``file_hash``, BLAKE2b from ``_blake2``)
and records read (``loads``, with ``_json``'s scanner) are defined in importer.py too.
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from .. import importer
from ..importer import (CORE_FILE, NATIVE_DIR, RUNTIME_FILE, import_extension, loaded_runtime,  # noqa: F401
                        preload, python_api)
# a binary's check against its record, in importer.py (native/installed.py uses them too); public here as well
from ..importer import HASH, _read_text, file_hash, files_intact, inside, owned_by_code_owner  # noqa: F401
from ..importer import HEADER_SUFFIXES
from ..importer import SHIPPED_DIR as BIN_DIR
from ..importer import owned_runtime as _owned_runtime  # noqa: F401
from ..importer import shipped_used as _used, shipped_why as _why
from ..spec import RECORD, find_record, no_build  # noqa: F401  (public here too)
from ..native import installed as _installed
from .json_record import loads  # noqa: F401

__all__ = ["RECORD", "BIN_DIR", "HEADER_SUFFIXES", "shipped_module", "shipped_or_built", "built_instead",
           "refuse_build", "no_build", "record_entry", "record_copy", "header_files", "options_of", "find_record",
           "status", "HASH", "file_hash", "files_intact", "inside", "loads", "shipped_binary"]


def record_copy(record: Dict[str, Any]) -> bytes:
    """The marshal copy of JSON record ``record``, written beside it as ``<name>.rec`` (importer.read_record
    reads it on a shipped load: no ``_json``): exactly what the JSON reads back as (lists, not tuples)."""
    import json
    import marshal

    return marshal.dumps((importer.RECORD_COPY, json.loads(json.dumps(record))), 4)


def header_files(dirs: Sequence[Path], top: Path) -> List[Path]:
    """The headers under each of ``dirs`` that are inside ``top`` (sorted, each once): what a shipped
    operator's key covers besides its sources."""
    return [top / rel for rel in importer.header_names([str(d) for d in dirs], str(top))]


def options_of(spec, top: Path) -> Dict[str, object]:
    """What of a spec, besides its sources and headers, decides the binary, as the record writes it."""
    return importer.shipped_options(spec, str(top))


def shipped_binary(lib: Path, out: Path, debug: bool) -> Path:
    """The file a wheel ships for the built library ``lib``: a copy under ``out`` without the symbols no
    loader needs (``strip --strip-unneeded``; its dynamic symbols stay), a third smaller, so each shipped
    load() hashes a third less (~0.3 M instructions of ~6.5 M, issue 35). ``lib`` itself for a debug build
    (its symbols are for the debugger) or where no ``strip`` runs."""
    import shutil
    import subprocess

    strip = shutil.which("strip")
    if debug or strip is None:
        return lib
    dst = out / "stripped" / lib.parent.name / lib.name
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        res = subprocess.run([strip, "--strip-unneeded", "-o", str(dst), str(lib)], capture_output=True,
                             timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return lib
    return dst if res.returncode == 0 and dst.is_file() else lib


def record_entry(spec, top: Path, file: str, binary: Path, abi: Dict[str, str], uses_core: bool,
                 read: Union[Sequence[str], Mapping[str, str]] = ()) -> Dict[str, object]:
    """The record of operator ``spec`` built into ``binary``, shipped as ``file`` (relative to ``top``,
    the package directory). ``read``: the files the compiler read (absolute paths; or the build's record,
    path to digest, whose ABSENT entries are files the search probed and did not find); those inside the
    package are in the key whatever their names. A ValueError when one cannot be read."""
    sources = importer.digests(list(spec.sources), str(top))
    if sources is None:
        raise ValueError(f"operator '{spec.name}': every source must be inside the package {top}")
    from .fingerprint import ABSENT
    if isinstance(read, Mapping):  # the build's record: a file it probed and did not find is no file to key
        read = [p for p, digest in read.items() if digest != ABSENT]
    prefix = str(top).rstrip("/") + "/"
    inside_top = {os.path.normpath(p)[len(prefix):] for p in read if os.path.normpath(p).startswith(prefix)}
    extra = sorted(rel for rel in inside_top if rel not in sources)
    headers = importer.header_digests(spec, str(top), extra)
    if headers is None:  # (a record no load() would ever fit: a wheel that always builds)
        raise ValueError(f"operator '{spec.name}': the files it was built from cannot all be read in its package "
                         f"{top}: {', '.join(extra) or 'its headers'}")
    return {"file": file, "hash": file_hash(binary), "sources": sources,
            "headers": headers, "options": options_of(spec, top),
            "abi": abi, "core": uses_core}


def shipped_module(spec, record_path: Optional[Path] = None) -> Optional[ModuleType]:
    """The module of the binary shipped for ``spec`` when it fits; else None, with the reason kept for
    ``refuse_build`` (and a warning when the binary was modified): importer.shipped_module, the record
    looked for when ``record_path`` (``find_record(spec.sources)``) is not given."""
    if record_path is None and spec.kind == "module":
        record_path = find_record(spec.sources)
    return importer.shipped_module(spec, record_path, lambda: _installed)


def _fit(spec, record_path: Path) -> Tuple[Optional[Path], Optional[Dict[str, Any]], str]:
    """(binary, its record entry, "") when the shipped binary of ``spec`` fits; else (None, None, why)."""
    binary, entry, why = importer.shipped_fit(spec, record_path, lambda: _installed)
    return (None if binary is None else Path(binary)), entry, why


def shipped_or_built(spec, build: Callable[[], ModuleType], record_path: Optional[Path] = None) -> ModuleType:
    """``load()``: the shipped module of ``spec`` when it fits, else ``build()`` (the cache, or a build).
    Under ``OPBUILDER_NO_BUILD=1`` a failure of the latter is a NoBuildError saying why the shipped binary
    did not fit, and with no cache directory at all it is raised at once (nothing can be cached there).
    ``record_path``: ``find_record(spec.sources)``, when the caller has it."""
    if record_path is None:
        record_path = find_record(spec.sources)
    mod = shipped_module(spec, record_path)
    return mod if mod is not None else built_instead(spec, build)


def built_instead(spec, build: Callable[[], ModuleType]) -> ModuleType:
    """``build()`` (the cache, or a build) for ``spec``, whose shipped binary did not fit (``shipped_module``
    returned None). Under ``OPBUILDER_NO_BUILD=1`` a failure of it is a NoBuildError saying why the
    shipped binary did not fit, and with neither a cache directory nor a prebuilt store it is raised at once
    (a new node's cache directory may not exist yet: the store's build needs none)."""
    if not no_build():
        return build()
    from ..errors import NoBuildError

    if not os.path.isdir(spec.root) and not os.environ.get("OPBUILDER_PREBUILT_DIR"):
        why = _why.get(spec.name, f"no wheel ships a binary of '{spec.name}'")
        raise NoBuildError(spec.name, why, fix=_fix(why))
    from ..errors import UnsafeCacheDirError

    try:
        return build()
    except (NoBuildError, UnsafeCacheDirError):  # each says its own fix (a store others can write: chmod)
        raise
    except (OSError, RuntimeError) as e:
        if getattr(e, "cache_problem", False):  # a cache that cannot be made or written: its own fix
            raise
        why = f"{_why.get(spec.name, 'nothing is shipped for it')}; and it is not in the cache ({e})"
        raise NoBuildError(spec.name, why, fix=_fix(why)) from e


RUNTIME_FIX = ("reinstall opbuilder (pip install -e . in a checkout) with a C++ compiler present, so that its "
               "installed runtime is built for its headers and this Python, or unset OPBUILDER_NO_BUILD to build "
               "it here")


def _fix(why: str) -> str:
    """The fix a NoBuildError gives for ``why``: reinstall opbuilder when its own installed runtime is what
    does not fit (a wheel built for this opbuilder cannot help); fill the prebuilt store when one is set;
    else install a wheel of the package."""
    from ..errors import NoBuildError

    if why.startswith("opbuilder's installed runtime"):
        return RUNTIME_FIX
    stores = os.environ.get("OPBUILDER_PREBUILT_DIR")
    if stores:
        missing = [d for d in stores.split(os.pathsep) if d and not os.path.isdir(d)]
        gone = f"; {', '.join(missing)} {'does' if len(missing) == 1 else 'do'} not exist" if missing else ""
        return ("build these sources into the prebuilt store where a compiler is (python -m opbuilder build NAME "
                "SOURCES... --into STORE, docs/fleet.md; no store in OPBUILDER_PREBUILT_DIR holds a build of them "
                f"as they are now{gone}), or " + NoBuildError.WHEEL_FIX)
    return NoBuildError.WHEEL_FIX


_lookups = threading.local()  # .depth: > 0 while this thread takes builds from the cache and compiles none


@contextmanager
def lookups_only() -> Iterator[None]:
    """In this thread, a build that would be needed is a NoBuildError, as under ``OPBUILDER_NO_BUILD=1``
    (torch_bridge.request: load to_torch's bridge if the cache has it; never compile in a process that
    did not ask for it)."""
    _lookups.depth = getattr(_lookups, "depth", 0) + 1
    try:
        yield
    finally:
        _lookups.depth -= 1


def refuse_build(spec, cause: Optional[BaseException] = None) -> None:
    """Under ``OPBUILDER_NO_BUILD=1`` (or ``lookups_only``), the NoBuildError for a build of ``spec`` that
    would be needed now."""
    if not no_build() and not getattr(_lookups, "depth", 0):
        return
    from ..errors import NoBuildError

    if spec.kind == "module" and _is_inline(spec):  # no wheel carries load_inline's sources
        why = f"load_inline's sources of '{spec.name}' are not built in this cache ({spec.root})"
        if cause is not None:
            why += f"; and no compiler can build them here ({cause})"
        raise NoBuildError(spec.name, why, fix="run the same load_inline once where a compiler is, with this "
                           "OPBUILDER_CACHE_DIR, or move the sources into a package that ships a wheel "
                           "(docs/shipping.md), or unset OPBUILDER_NO_BUILD to build it here")
    if spec.kind == "module":
        why = _why.get(spec.name) or f"no wheel ships a binary of '{spec.name}'"
    elif spec.kind in ("runtime", "core"):
        from ..native.installed import last_why
        why = f"opbuilder's installed runtime does not serve it: {last_why()}"
    else:
        why = f"'{spec.name}' is built on first use and is not in the cache"
    if cause is not None:
        why += f"; and no compiler can build it here ({cause})"
    raise NoBuildError(spec.name, why, fix=_fix(why))


def _is_inline(spec) -> bool:
    """Whether ``spec`` is a load_inline build: its sources are written under the cache's inline/."""
    inline = Path(spec.root) / "inline"
    return bool(spec.sources) and all(inline in Path(s).parents for s in spec.sources)


def status(name: str) -> Tuple[Optional[str], Optional[str]]:
    """(the shipped binary this process loaded for operator ``name``, why none was) for ``doctor``."""
    return _used.get(name), _why.get(name)

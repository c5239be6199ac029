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

A shipped load() imports this module and importer.py, and nothing else of opbuilder (each module is
~0.3 M instructions of a new process, issue 35): how files are hashed (``file_hash``, BLAKE2b from
``_blake2``) and records read (``loads``, with ``_json``'s scanner) are defined here, and
cache/file_hash.py and cache/json_record.py hand them on under their old names.
"""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from ..importer import CORE_FILE, NATIVE_DIR, RUNTIME_FILE, import_extension, loaded_runtime, preload, python_api
# a binary's check against its record, in importer.py (native/installed.py uses them too); public here as well
from ..importer import HASH, _read_text, file_hash, files_intact, inside, loads, owned_by_code_owner  # noqa: F401
from ..spec import RECORD, find_record, no_build  # noqa: F401  (public here too)

__all__ = ["RECORD", "BIN_DIR", "HEADER_SUFFIXES", "shipped_module", "shipped_or_built", "refuse_build",
           "no_build", "record_entry", "header_files", "options_of", "find_record", "status", "HASH", "file_hash",
           "files_intact", "inside", "loads"]


BIN_DIR = "_opbuilder"
HEADER_SUFFIXES = (".h", ".hh", ".hpp", ".hxx", ".cuh", ".inc", ".inl", ".ipp", ".tpp")
_why: Dict[str, str] = {}  # operator name -> why its shipped binary was not used (the last load())
_modules: Dict[Tuple[str, str], ModuleType] = {}  # (record, hash of the binary) -> module
_used: Dict[str, str] = {}  # operator name -> the shipped binary this process loaded (doctor)
_lock = threading.Lock()
_native: List[Optional[Dict[str, Any]]] = []  # [the installed runtime's record, when its files are owned] once
_ABI_PARTS = ("python", "nanobind", "cxx", "headers")  # as installed.why_not compares them
_INSTALLED = __name__.rsplit(".", 2)[0] + ".native.installed"


def _owned_runtime() -> Optional[Dict[str, Any]]:
    """The record (native.json) of opbuilder's installed runtime when ``installed(by_owner=True)`` would
    take it without hashing (its files owned by the owner of opbuilder's code, of their recorded sizes),
    checked once per process; else None, and the caller asks native/installed.py (which hashes). A
    shipped load() then imports neither that module nor the native package (~0.9 M instructions)."""
    inst = sys.modules.get(_INSTALLED)
    if inst is not None:  # imported already (a build ran in this process, or doctor): its answer, as it hashed
        nat = inst.installed(by_owner=True)
        return None if nat is None else nat.record
    if not _native:
        record = None
        try:
            got = loads(_read_text(f"{NATIVE_DIR}/native.json"))
            files = got.get("files") if isinstance(got, dict) and got.get("hash") == HASH else None
            if isinstance(files, dict) and all(inside(f) for f in files) and \
                    owned_by_code_owner(NATIVE_DIR, files, got.get("sizes"), os.path.dirname(NATIVE_DIR)):
                record = got
        except (OSError, ValueError):
            pass
        _native.append(record)
    return _native[0]


def _header_names(dirs: Sequence[str], top: str) -> List[str]:
    """The headers under each of ``dirs`` that are inside ``top``, as paths relative to ``top`` (each
    once, sorted): what a shipped operator's key covers besides its sources."""
    out = set()
    prefix = top.rstrip("/") + "/"
    for d in dirs:
        if d != top and not d.startswith(prefix):
            continue
        todo = [d]
        while todo:  # os.walk, without its generator and per-directory lists (a shipped load walks the package)
            base = todo.pop()
            try:
                entries = list(os.scandir(base))
            except OSError:
                continue
            for e in entries:
                if e.is_dir():  # through a link, as os.walk sorts entries; but a linked one is not walked
                    if e.name not in ("__pycache__", BIN_DIR) and not e.is_symlink():
                        todo.append(e.path)
                elif e.name.endswith(HEADER_SUFFIXES):
                    out.add(e.path[len(prefix):])
    return sorted(out)


def header_files(dirs: Sequence[Path], top: Path) -> List[Path]:
    """The headers under each of ``dirs`` that are inside ``top`` (sorted, each once): what a shipped
    operator's key covers besides its sources."""
    return [top / rel for rel in _header_names([str(d) for d in dirs], str(top))]


def _portable(flags: Sequence[str], top: Path) -> List[str]:
    """``flags`` with the package's directory written as ``<pkg>`` (paths in flags are absolute)."""
    prefix = str(top)
    return [f.replace(prefix, "<pkg>") for f in flags]


def _relative(path: str, top: str) -> Optional[str]:
    """``path`` relative to ``top`` (lexically, as Path.relative_to: "." for ``top`` itself); None if
    it is not under it."""
    if path == top:
        return "."
    prefix = top.rstrip("/") + "/"
    return path[len(prefix):] if path.startswith(prefix) else None


def options_of(spec, top: Path) -> Dict[str, object]:
    """What of a spec, besides its sources and headers, decides the binary, as the record writes it."""
    t = str(top)
    incs = []
    for p in spec.include_paths:
        rel = _relative(str(p), t)
        incs.append(str(p) if rel is None else rel)
    return {"backend": spec.backend, "cflags": _portable(spec.cflags, top), "ldflags": _portable(spec.ldflags, top),
            "cuda_cflags": _portable(spec.cuda_cflags, top), "include_paths": incs, "debug": bool(spec.debug),
            "binding": spec.binding}


def _digests(paths: Sequence[Union[str, Path]], top: str) -> Optional[Dict[str, str]]:
    """{path relative to ``top``: its file_hash} of each of ``paths``; None if one is not under ``top``
    or cannot be read."""
    out = {}
    for p in paths:
        rel = _relative(str(p), top)
        if rel is None:
            return None
        try:
            out[rel] = file_hash(p)
        except OSError:
            return None
    return out


def _scope(spec, top: Path) -> List[str]:
    return sorted({str(top)} | {str(p) for p in spec.include_paths})  # a source may include "../x.h" anywhere


def _header_digests(spec, top: str) -> Optional[Dict[str, str]]:
    return _digests([f"{top}/{rel}" for rel in _header_names(_scope(spec, top), top)], top)


def record_entry(spec, top: Path, file: str, binary: Path, abi: Dict[str, str], uses_core: bool) -> Dict[str, object]:
    """The record of operator ``spec`` built into ``binary``, shipped as ``file`` (relative to ``top``,
    the package directory)."""
    sources = _digests(list(spec.sources), str(top))
    if sources is None:
        raise ValueError(f"operator '{spec.name}': every source must be inside the package {top}")
    return {"file": file, "hash": file_hash(binary), "sources": sources, "headers": _header_digests(spec, str(top)),
            "options": options_of(spec, top), "abi": abi, "core": uses_core}


def _fit(spec, record_path: Path) -> Tuple[Optional[Path], Optional[Dict[str, object]], str]:
    """(binary, its record entry, "") when the shipped binary of ``spec`` fits; else (None, None, why)."""
    try:
        record = loads(_read_text(str(record_path)))
    except (OSError, ValueError) as e:
        return None, None, f"its record {record_path} cannot be read ({e})"
    top = os.path.dirname(str(record_path))
    if not isinstance(record, dict) or record.get("hash") != HASH:
        return None, None, f"{record_path} is not a record this opbuilder reads (no {HASH} hashes)"
    entry = record.get("ops", {}).get(spec.name)
    if not isinstance(entry, dict):
        return None, None, f"{record_path} ships no operator '{spec.name}'"
    want_sources = entry.get("sources")
    if not isinstance(want_sources, dict) or not all(inside(k) for k in want_sources):
        return None, None, f"{record_path} is not a record opbuilder writes"
    have = _digests(spec.sources, top)
    if have is None:
        return None, None, f"its sources are not all in the package {top} the binary was shipped in"
    if have != want_sources:
        changed = sorted(set(have) ^ set(want_sources)) or sorted(k for k in have if have[k] != want_sources[k])
        return None, None, f"its sources differ from those the binary was built from ({', '.join(changed)})"
    if _header_digests(spec, top) != entry.get("headers"):
        return None, None, "a header in its package differs from those the binary was built from"
    options = options_of(spec, Path(top))
    if options != entry.get("options"):
        diff = sorted(k for k in options if options[k] != (entry.get("options") or {}).get(k))
        return None, None, f"it is asked for other options than the binary was built with ({', '.join(diff)})"
    abi = entry.get("abi")
    if not isinstance(abi, dict):
        return None, None, f"{record_path} records no ABI for '{spec.name}'"
    pybind11 = abi.get("binding") == "pybind11"  # its binding's runtime is in the binary
    if pybind11:
        from ..tools.toolchain import python_abi
        need = python_abi()
    else:
        need = python_api()
    if abi.get("python") != need:
        return None, None, f"the binary was built for Python {abi.get('python')}, this Python needs {need}"
    if not pybind11:
        if os.environ.get("OPBUILDER_INSTALLED_RUNTIME", "1") == "0":  # native/installed.py's enabled()
            return None, None, "OPBUILDER_INSTALLED_RUNTIME=0 turns opbuilder's installed runtime off"
        have = _owned_runtime()
        have_abi = have.get("abi") if have is not None else None
        if not isinstance(have_abi, dict) or any(have_abi.get(p) != abi.get(p) for p in _ABI_PARTS):
            from ..native import installed as native  # hashes what is not the owner's; says why it does not fit
            why = native.why_not(native.installed(by_owner=True), abi)
            if why is not None:
                return None, None, why
    rel = entry.get("file")
    if not inside(rel):
        return None, None, f"{record_path} is not a record opbuilder writes"
    binary = f"{top}/{rel}"
    try:
        digest = file_hash(binary)
    except OSError as e:
        return None, None, f"its binary {binary} cannot be read ({e.strerror})"
    if digest != entry.get("hash"):
        return None, None, (f"its binary {binary} was modified after it was built (its hash is not the one "
                            f"recorded): it is never loaded")
    return Path(binary), entry, ""


def shipped_module(spec, record_path: Optional[Path] = None) -> Optional[ModuleType]:
    """The module of the binary shipped for ``spec`` when it fits (see the module's docstring); else None,
    with the reason kept for ``refuse_build`` (and a warning when the binary was modified). ``record_path``:
    ``find_record(spec.sources)``, when the caller has it."""
    if spec.kind != "module":
        return None
    if record_path is None:
        record_path = find_record(spec.sources)
    if record_path is None:
        _why[spec.name] = f"no wheel ships a binary of '{spec.name}' (no {RECORD} beside its sources)"
        return None
    binary, entry, why = _fit(spec, record_path)
    if binary is None:
        _why[spec.name] = why
        if "modified" in why and not no_build():
            import logging
            logging.getLogger("opbuilder").warning("opbuilder: %s: %s; building it instead", spec.name, why)
        return None
    memo = (str(record_path), str(entry["hash"]))
    mod = _modules.get(memo)
    if mod is not None:
        return mod
    with _lock:  # one import per binary, whichever thread loads it first
        mod = _modules.get(memo)
        if mod is not None:
            return mod
        if entry.get("abi", {}).get("binding") == "pybind11":
            native_dir = None
        elif _owned_runtime() is not None:
            native_dir = Path(NATIVE_DIR)
        else:
            from ..native import installed as native
            nat = native.installed(by_owner=True)
            native_dir = None if nat is None else nat.dir
        loaded = loaded_runtime()
        if native_dir is None:
            deps: List[Path] = []
        else:
            runtime = native_dir / RUNTIME_FILE
            if loaded is not None and loaded != runtime:
                _why[spec.name] = (f"this process already loaded another nanobind runtime ({loaded}), built by "
                                   f"opbuilder in its cache")
                return None
            deps = [runtime] + ([native_dir / CORE_FILE] if entry.get("core") else [])
        preload(deps)
        mod = import_extension(spec.name, binary, spec.name)
        _modules[memo] = mod
        _used[spec.name] = str(binary)
        _why.pop(spec.name, None)
    return mod


def shipped_or_built(spec, build: Callable[[], ModuleType], record_path: Optional[Path] = None) -> ModuleType:
    """``load()``: the shipped module of ``spec`` when it fits, else ``build()`` (the cache, or a build).
    Under ``OPBUILDER_NO_BUILD=1`` a failure of the latter is a NoBuildError saying why the shipped binary
    did not fit, and with no cache directory at all it is raised at once (nothing can be cached there).
    ``record_path``: ``find_record(spec.sources)``, when the caller has it."""
    mod = shipped_module(spec, record_path)
    if mod is not None:
        return mod
    if not no_build():
        return build()
    from ..errors import NoBuildError

    if not os.path.isdir(spec.root):
        raise NoBuildError(spec.name, _why.get(spec.name, f"no wheel ships a binary of '{spec.name}'"))
    try:
        return build()
    except NoBuildError:
        raise
    except (OSError, RuntimeError) as e:
        raise NoBuildError(spec.name, f"{_why.get(spec.name, 'nothing is shipped for it')}; and it is not in the "
                                      f"cache ({e})") from e


def refuse_build(spec, cause: Optional[BaseException] = None) -> None:
    """Under ``OPBUILDER_NO_BUILD=1``, the NoBuildError for a build of ``spec`` that would be needed now."""
    if not no_build():
        return
    from ..errors import NoBuildError

    if spec.kind == "module":
        why = _why.get(spec.name) or f"no wheel ships a binary of '{spec.name}'"
    elif spec.kind in ("runtime", "core"):
        from ..native.installed import last_why
        why = f"opbuilder's installed runtime does not serve it: {last_why()}"
    else:
        why = f"'{spec.name}' is built on first use and is not in the cache"
    if cause is not None:
        why += f"; and no compiler can build it here ({cause})"
    raise NoBuildError(spec.name, why)


def status(name: str) -> Tuple[Optional[str], Optional[str]]:
    """(the shipped binary this process loaded for operator ``name``, why none was) for ``doctor``."""
    return _used.get(name), _why.get(name)

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
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from types import ModuleType
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .file_hash import inside as _inside
from .file_hash import HASH, file_hash
from .json_record import loads
from .shipped_record import RECORD, find_record, no_build  # noqa: F401  (public here too)

__all__ = ["RECORD", "BIN_DIR", "HEADER_SUFFIXES", "shipped_module", "shipped_or_built", "refuse_build",
           "no_build", "record_entry", "header_files", "options_of", "find_record", "status"]

BIN_DIR = "_opbuilder"
HEADER_SUFFIXES = (".h", ".hh", ".hpp", ".hxx", ".cuh", ".inc", ".inl", ".ipp", ".tpp")
_why: Dict[str, str] = {}  # operator name -> why its shipped binary was not used (the last load())
_modules: Dict[Tuple[str, str], ModuleType] = {}  # (record, hash of the binary) -> module
_used: Dict[str, str] = {}  # operator name -> the shipped binary this process loaded (doctor)
_lock = threading.Lock()


def header_files(dirs: Sequence[Path], top: Path) -> List[Path]:
    """The headers under each of ``dirs`` that are inside ``top`` (sorted, each once): what a shipped
    operator's key covers besides its sources."""
    out = set()
    for d in dirs:
        try:
            d.relative_to(top)
        except ValueError:
            continue
        for base, subdirs, files in os.walk(d):
            subdirs[:] = sorted(s for s in subdirs if s not in ("__pycache__", BIN_DIR))
            out.update(Path(base, f) for f in files if f.endswith(HEADER_SUFFIXES))
    return sorted(out)


def _portable(flags: Sequence[str], top: Path) -> List[str]:
    """``flags`` with the package's directory written as ``<pkg>`` (paths in flags are absolute)."""
    prefix = str(top)
    return [f.replace(prefix, "<pkg>") for f in flags]


def options_of(spec, top: Path) -> Dict[str, object]:
    """What of a spec, besides its sources and headers, decides the binary, as the record writes it."""
    incs = []
    for p in spec.include_paths:
        try:
            incs.append(str(Path(p).relative_to(top)))
        except ValueError:
            incs.append(str(p))
    return {"backend": spec.backend, "cflags": _portable(spec.cflags, top), "ldflags": _portable(spec.ldflags, top),
            "cuda_cflags": _portable(spec.cuda_cflags, top), "include_paths": incs, "debug": bool(spec.debug),
            "binding": spec.binding}


def _digests(paths: Sequence[Path], top: Path) -> Optional[Dict[str, str]]:
    out = {}
    for p in paths:
        try:
            out[str(p.relative_to(top))] = file_hash(p)
        except (ValueError, OSError):
            return None
    return out


def _scope(spec, top: Path) -> List[Path]:
    return sorted({top} | {Path(p) for p in spec.include_paths})  # a source may include "../x.h" anywhere in it


def record_entry(spec, top: Path, file: str, binary: Path, abi: Dict[str, str], uses_core: bool) -> Dict[str, object]:
    """The record of operator ``spec`` built into ``binary``, shipped as ``file`` (relative to ``top``,
    the package directory)."""
    sources = _digests(list(spec.sources), top)
    if sources is None:
        raise ValueError(f"operator '{spec.name}': every source must be inside the package {top}")
    return {"file": file, "hash": file_hash(binary), "sources": sources,
            "headers": _digests(header_files(_scope(spec, top), top), top), "options": options_of(spec, top),
            "abi": abi, "core": uses_core}


def _fit(spec, record_path: Path) -> Tuple[Optional[Path], Optional[Dict[str, object]], str]:
    """(binary, its record entry, "") when the shipped binary of ``spec`` fits; else (None, None, why)."""
    try:
        record = loads(record_path.read_text())
    except (OSError, ValueError) as e:
        return None, None, f"its record {record_path} cannot be read ({e})"
    top = record_path.parent
    if not isinstance(record, dict) or record.get("hash") != HASH:
        return None, None, f"{record_path} is not a record this opbuilder reads (no {HASH} hashes)"
    entry = record.get("ops", {}).get(spec.name)
    if not isinstance(entry, dict):
        return None, None, f"{record_path} ships no operator '{spec.name}'"
    want_sources = entry.get("sources")
    if not isinstance(want_sources, dict) or not all(_inside(k) for k in want_sources):
        return None, None, f"{record_path} is not a record opbuilder writes"
    have = _digests(list(spec.sources), top)
    if have is None:
        return None, None, f"its sources are not all in the package {top} the binary was shipped in"
    if have != want_sources:
        changed = sorted(set(have) ^ set(want_sources)) or sorted(k for k in have if have[k] != want_sources[k])
        return None, None, f"its sources differ from those the binary was built from ({', '.join(changed)})"
    headers = _digests(header_files(_scope(spec, top), top), top)
    if headers != entry.get("headers"):
        return None, None, "a header in its package differs from those the binary was built from"
    options = options_of(spec, top)
    if options != entry.get("options"):
        diff = sorted(k for k in options if options[k] != (entry.get("options") or {}).get(k))
        return None, None, f"it is asked for other options than the binary was built with ({', '.join(diff)})"
    from ..native import installed as native

    abi = entry.get("abi")
    if not isinstance(abi, dict):
        return None, None, f"{record_path} records no ABI for '{spec.name}'"
    from ..native.abi import python_api
    pybind11 = abi.get("binding") == "pybind11"  # its binding's runtime is in the binary
    if pybind11:
        from ..tools.toolchain import python_abi
        need = python_abi()
    else:
        need = python_api()
    if abi.get("python") != need:
        return None, None, f"the binary was built for Python {abi.get('python')}, this Python needs {need}"
    if not pybind11:
        if not native.enabled():
            return None, None, "OPBUILDER_INSTALLED_RUNTIME=0 turns opbuilder's installed runtime off"
        why = native.why_not(native.installed(by_owner=True), abi)
        if why is not None:
            return None, None, why
    rel = entry.get("file")
    if not _inside(rel):
        return None, None, f"{record_path} is not a record opbuilder writes"
    binary = top / str(rel)
    try:
        digest = file_hash(binary)
    except OSError as e:
        return None, None, f"its binary {binary} cannot be read ({e.strerror})"
    if digest != entry.get("hash"):
        return None, None, (f"its binary {binary} was modified after it was built (its hash is not the one "
                            f"recorded): it is never loaded")
    return binary, entry, ""


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
    from ..importer import import_extension, loaded_runtime, preload
    from ..native import installed as native

    with _lock:  # one import per binary, whichever thread loads it first
        mod = _modules.get(memo)
        if mod is not None:
            return mod
        nat = native.installed(by_owner=True)
        loaded = loaded_runtime()
        if nat is None or entry.get("abi", {}).get("binding") == "pybind11":
            deps: List[Path] = []
        else:
            if loaded is not None and loaded != nat.runtime:
                _why[spec.name] = (f"this process already loaded another nanobind runtime ({loaded}), built by "
                                   f"opbuilder in its cache")
                return None
            deps = [nat.runtime] + ([nat.core] if entry.get("core") else [])
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

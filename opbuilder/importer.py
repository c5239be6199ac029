"""A binary a wheel ships, checked against its record before it is loaded; and the names of loading a
built extension module, handed on from spec.py.

A nanobind operator needs nanobind's runtime and (usually) the core library loaded with RTLD_GLOBAL
before it is imported: ``preload`` loads them and ``import_extension`` the module (``import_build``, a
cached build once per process). They are defined in spec.py, which ``import opbuilder`` imports anyway,
so that a warm load() (warm.py) imports no module besides warm.py (each module is ~0.3 M instructions
of a new process, plus ~1 M per 20 KB of its code: issues 35 and 38); they are given here under their
old names. A full lookup knows the libraries from build.json's ``needs`` (recorded_deps.py).

A shipped load() runs ``shipped_module``: the check of the binary a wheel ships against the wheel's
record (cache/shipped.py says what it checks), then the load; records are read from their marshal
copies (``read_record``). It imports no module of opbuilder but this one after ``import opbuilder``: the
Python API a module built here needs (native/abi.py) is defined here and handed on by that module.
What neither path runs is elsewhere and given here by name when asked for (``__getattr__``).
"""
from __future__ import annotations

import importlib.machinery
import marshal
import os
import sys
import threading
from pathlib import Path
from types import ModuleType
from stat import S_ISDIR, S_ISREG, S_IWGRP, S_IWOTH
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from .spec import (CORE_FILE, CORE_NAME, DEP_FILES, INSTALLED_KEY, RUNTIME_FILE, RUNTIME_NAME,  # noqa: F401
                   dlopen_global, import_build, import_extension, is_key, loaded_lock, loaded_modules,
                   loaded_cores, loaded_runtime, module_name_for, names_used, preload, preload_core, preload_runtime)
from .spec import NATIVE_DIR as _NATIVE_DIR

__all__ = ["import_extension", "RUNTIME_NAME", "DEP_FILES", "is_key", "preload", "preload_runtime", "preload_core",
           "dlopen_global", "loaded_runtime", "loaded_cores", "import_build", "loaded_modules", "names_used", "loaded_lock",
           "RUNTIME_FILE", "CORE_NAME", "CORE_FILE",
           "LIMITED_API_HEX", "limited_api", "python_api", "HASH", "file_hash", "files_intact", "inside",
           "owned_by_code_owner", "read_record", "RECORD_COPY", "shipped_module", "shipped_fit", "owned_runtime"]

LIMITED_API_HEX = "0x030C0000"  # Python 3.12: the first the stable ABI of nanobind serves (native/abi.py)
# opbuilder's installed runtime (native/installed.py), as spec.py finds it; tests point it elsewhere
NATIVE_DIR = _NATIVE_DIR


def limited_api() -> bool:
    """Whether nanobind libraries are built against the limited API here (Python >= 3.12; native/abi.py)."""
    return sys.version_info >= (3, 12) and os.environ.get("OPBUILDER_LIMITED_API", "1") != "0"


def interpreter_abi() -> str:
    """This interpreter's ABI as keys and records name it: its bytecode tag and extension suffix
    (``cpython-311 .cpython-311-x86_64-linux-gnu.so``; tools.toolchain.python_abi)."""
    return f"{sys.implementation.cache_tag} {importlib.machinery.EXTENSION_SUFFIXES[0]}"


def python_api() -> str:
    """The Python ABI a nanobind library built here needs, as keys and records name it:
    ``abi3-cp312`` under the limited API, else this interpreter's (``interpreter_abi``)."""
    if limited_api():
        return "abi3-cp312"
    return interpreter_abi()


# names defined elsewhere, given here under their old names (PEP 562) and imported when first asked for: what
# explains a failed import (import_errors.py, when one fails), the check of a cached build's recorded
# libraries (recorded_deps.py: a full lookup's) and the JSON reader (cache/json_record.py: a record with no
# marshal copy). Neither a warm nor a shipped load() runs them, so they cost it no import
_MOVED = {"demangle": "import_errors", "loader_error": "import_errors", "_explain": "import_errors",
          "_module_name_hint": "import_errors", "recorded": "recorded_deps", "recorded_needs": "recorded_deps",
          "loads": "cache.json_record"}


def __getattr__(name: str):
    if name in _MOVED:
        import importlib
        return getattr(importlib.import_module(f".{_MOVED[name]}", __package__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- a binary checked against its record, before it is imported --------------------------------------
# A shipped operator's binary (below) and opbuilder's installed runtime (native/installed.py) are trusted
# by the hashes their records (JSON) hold: here, on the path both loads take already.

HASH = "blake2b-256"  # what records name the hash they hold
_OTHERS_WRITE = S_IWGRP | S_IWOTH
_blake2b: Optional[Callable[..., Any]] = None  # _blake2's BLAKE2b, imported on first use (a warm load() hashes nothing)


def file_hash(path: Union[str, Path]) -> str:
    """The BLAKE2b-256 of the file at ``path`` (hex; read without following a symlink). BLAKE2b from
    ``_blake2``, as the cache's keys use it (fingerprint.py): hashlib's SHA-256 imports OpenSSL first,
    which cost a shipped load() 10-50 ms on a loaded machine, and the SHA-512 of ``_sha512`` (imported
    by ``random`` already) takes twice BLAKE2b's instructions for a binary of 70 KB."""
    global _blake2b
    if _blake2b is None:
        try:
            from _blake2 import blake2b
        except ImportError:  # pragma: no cover - an interpreter without the builtin module
            from hashlib import blake2b
        _blake2b = blake2b
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        h = _blake2b(digest_size=32)
        want = os.fstat(fd).st_size + 1  # the file in one read: a 1 MiB request allocates (and maps) 1 MiB
        while True:
            chunk = os.read(fd, want)
            if not chunk:
                return h.hexdigest()
            h.update(chunk)
            want = 1 << 20
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
            if file_hash(f"{directory}/{rel}") != digest:
                return False
        except OSError:
            return False
    return True


def owned_by_code_owner(d: str, files: Dict[str, object], sizes: object, code_dir: Union[str, Path]) -> bool:
    """Whether directory ``d`` and each of ``files`` in it belong to the owner of ``code_dir`` (opbuilder's
    own code), only that owner can write them, and each file (a regular one, not a link) has the size
    ``sizes`` records: then no one could have changed them who could not change that code
    (native/installed.py: how its installed runtime is trusted by a shipped load)."""
    if not isinstance(sizes, dict) or set(sizes) != set(files):
        return False  # a record written before sizes were: hashed
    try:
        owner = os.stat(code_dir).st_uid
        st = os.lstat(d)
        if not S_ISDIR(st.st_mode) or st.st_uid != owner or st.st_mode & _OTHERS_WRITE:
            return False
        for name in files:
            st = os.lstat(f"{d}/{name}")
            if (not S_ISREG(st.st_mode) or st.st_uid != owner or st.st_mode & _OTHERS_WRITE
                    or st.st_size != sizes[name]):
                return False
    except OSError:
        return False
    return True


def inside(rel: object) -> bool:
    """A relative path that stays in its directory (no absolute path, no ``..``)."""
    return isinstance(rel, str) and not os.path.isabs(rel) and ".." not in rel.split("/")


RECORD_COPY = "opbuilder-record-1"  # the tag of a JSON record's marshal copy (``read_record``)


def read_record(path: str) -> Any:
    """The JSON record at ``path`` (``<dir>/<name>.json``: a wheel's opbuilder_ops.json, the installed
    runtime's native.json), from its marshal copy ``<name>.rec`` when one is there: a regular file of the
    owner of ``<dir>`` that no one else can write, holding ``(RECORD_COPY, the record)`` (written beside
    the JSON by the same writer, cache/shipped.record_copy). marshal is built in, as trusted as the
    package's own ``.pyc`` files beside it, and reading it spares a shipped load() importing ``_json``
    (~0.5 M instructions, issue 35). Anything else: the JSON (``loads``), whose errors are raised."""
    if path.endswith(".json"):
        try:
            fd = os.open(path[:-4] + "rec", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                st = os.fstat(fd)
                if S_ISREG(st.st_mode) and not st.st_mode & _OTHERS_WRITE and \
                        st.st_uid == os.stat(os.path.dirname(path) or ".").st_uid:
                    data = marshal.loads(os.read(fd, st.st_size + 1))
                    if type(data) is tuple and len(data) == 2 and data[0] == RECORD_COPY and type(data[1]) is dict:
                        return data[1]
            except (OSError, ValueError, EOFError, TypeError):
                pass  # not a copy this opbuilder writes: the JSON says what the record is
            finally:
                os.close(fd)
    from .cache.json_record import loads  # with _json (a record without its copy: an older install)
    return loads(_read_text(path))


def _read_text(path: str) -> str:
    """The UTF-8 text of the file at ``path`` (no text layer made: ~0.1 M instructions less than open())."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks).decode()
            chunks.append(chunk)
    finally:
        os.close(fd)


# ---- a binary a wheel ships (cache/shipped.py says how it is found and trusted): checked, then loaded ---
# here, so that a shipped load() imports this module and nothing else of opbuilder's besides ``import
# opbuilder`` (each module is ~0.3 M instructions of a new process, issue 35); cache/shipped.py says
# why a binary did not fit, builds instead and writes records

SHIPPED_DIR = "_opbuilder"  # cache/shipped.py's BIN_DIR: the binaries, in the package that ships them
HEADER_SUFFIXES = (".h", ".hh", ".hpp", ".hxx", ".cuh", ".inc", ".inl", ".ipp", ".tpp")
shipped_why: Dict[str, str] = {}  # operator name -> why its shipped binary was not used (the last load())
shipped_used: Dict[str, str] = {}  # operator name -> the shipped binary this process loaded (doctor)
_shipped: Dict[Tuple[str, str], ModuleType] = {}  # (record, hash of the binary) -> module
_native: List[Optional[Dict[str, Any]]] = []  # [the installed runtime's record, when its files are owned] once
_shipped_lock = threading.Lock()
_ABI_PARTS = ("python", "nanobind", "cxx", "headers")  # as installed.why_not compares them
_INSTALLED = __name__.rsplit(".", 1)[0] + ".native.installed"


def owned_runtime() -> Optional[Dict[str, Any]]:
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
            got = read_record(f"{NATIVE_DIR}/native.json")
            files = got.get("files") if isinstance(got, dict) and got.get("hash") == HASH else None
            if isinstance(files, dict) and all(inside(f) for f in files) and \
                    owned_by_code_owner(NATIVE_DIR, files, got.get("sizes"), os.path.dirname(NATIVE_DIR)):
                record = got
        except (OSError, ValueError):
            pass
        _native.append(record)
    return _native[0]


def header_names(dirs: Sequence[str], top: str) -> List[str]:
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
                    if e.name not in ("__pycache__", SHIPPED_DIR) and not e.is_symlink():
                        todo.append(e.path)
                elif e.name.endswith(HEADER_SUFFIXES):
                    out.add(e.path[len(prefix):])
    return sorted(out)


def _relative(path: str, top: str) -> Optional[str]:
    """``path`` relative to ``top`` (lexically, as Path.relative_to: "." for ``top`` itself); None if
    it is not under it."""
    if path == top:
        return "."
    prefix = top.rstrip("/") + "/"
    return path[len(prefix):] if path.startswith(prefix) else None


def shipped_options(spec, top: str) -> Dict[str, object]:
    """What of a spec, besides its sources and headers, decides the binary, as the record writes it
    (the package's directory ``top`` written as ``<pkg>`` in flags, include paths relative to it)."""
    incs = []
    for p in spec.include_paths:
        rel = _relative(str(p), top)
        incs.append(str(p) if rel is None else rel)
    return {"backend": spec.backend, "cflags": [f.replace(top, "<pkg>") for f in spec.cflags],
            "ldflags": [f.replace(top, "<pkg>") for f in spec.ldflags],
            "cuda_cflags": [f.replace(top, "<pkg>") for f in spec.cuda_cflags], "include_paths": incs,
            "debug": bool(spec.debug), "binding": spec.binding}


def digests(paths: Sequence[Union[str, Path]], top: str) -> Optional[Dict[str, str]]:
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


def header_digests(spec, top: str, read: Sequence[str] = ()) -> Optional[Dict[str, str]]:
    """The digests of the headers a shipped operator's key covers: those in its package and in its include
    paths inside it (a source may include "../x.h" anywhere in the package), and ``read``: more files of
    the package, relative to ``top``, whatever their names (what the compiler read besides headers by
    name, a ``.tcc`` or a ``.def``: the wheel's build lists them, and load() takes the list from the record).
    A name that leaves the package makes the key not match."""
    scope = sorted({top} | {str(p) for p in spec.include_paths})
    names = set(header_names(scope, top))
    for rel in read:
        if not isinstance(rel, str) or rel.startswith("/") or os.path.normpath(rel) != rel or rel.startswith(".."):
            return None
        names.add(rel)
    return digests([f"{top}/{rel}" for rel in sorted(names)], top)


def shipped_fit(spec, record_path: Union[str, Path], native: Callable[[], ModuleType]
                ) -> Tuple[Optional[str], Optional[Dict[str, Any]], str]:
    """(binary, its record entry, "") when the binary a wheel ships for ``spec`` fits (cache/shipped.py);
    else (None, None, why). ``native()``: the module opbuilder.native.installed, imported by the caller
    only when the owned runtime's record does not do (that module imports this one, not the reverse)."""
    record_path = str(record_path)
    try:
        record = read_record(record_path)
    except (OSError, ValueError) as e:
        return None, None, f"its record {record_path} cannot be read ({e})"
    top = os.path.dirname(record_path)
    if not isinstance(record, dict) or record.get("hash") != HASH:
        return None, None, f"{record_path} is not a record this opbuilder reads (no {HASH} hashes)"
    ops = record.get("ops")
    entry = ops.get(spec.name) if isinstance(ops, dict) else None
    if not isinstance(entry, dict):
        return None, None, f"{record_path} ships no operator '{spec.name}'"
    want_sources = entry.get("sources")
    if not isinstance(want_sources, dict) or not all(inside(k) for k in want_sources):
        return None, None, f"{record_path} is not a record opbuilder writes"
    have = digests(spec.sources, top)
    if have is None:
        return None, None, f"its sources are not all in the package {top} the binary was shipped in"
    if have != want_sources:
        changed = sorted(set(have) ^ set(want_sources)) or sorted(k for k in have if have[k] != want_sources[k])
        return None, None, f"its sources differ from those the binary was built from ({', '.join(changed)})"
    want_headers = entry.get("headers")
    if not isinstance(want_headers, dict) or header_digests(spec, top, list(want_headers)) != want_headers:
        return None, None, "a header in its package differs from those the binary was built from"
    options = shipped_options(spec, top)
    if options != entry.get("options"):
        want = entry.get("options")
        diff = sorted(k for k in options if not isinstance(want, dict) or options[k] != want.get(k))
        return None, None, f"it is asked for other options than the binary was built with ({', '.join(diff)})"
    abi = entry.get("abi")
    if not isinstance(abi, dict):
        return None, None, f"{record_path} records no ABI for '{spec.name}'"
    pybind11 = abi.get("binding") == "pybind11"  # its binding's runtime is in the binary
    if pybind11:
        need = interpreter_abi()
    else:
        need = python_api()
    if abi.get("python") != need:
        return None, None, f"the binary was built for Python {abi.get('python')}, this Python needs {need}"
    if not pybind11:
        if os.environ.get("OPBUILDER_INSTALLED_RUNTIME", "1") == "0":  # native/installed.py's enabled()
            return None, None, "OPBUILDER_INSTALLED_RUNTIME=0 turns opbuilder's installed runtime off"
        owned = owned_runtime()
        have_abi = owned.get("abi") if owned is not None else None
        if not isinstance(have_abi, dict) or any(have_abi.get(p) != abi.get(p) for p in _ABI_PARTS):
            why = native().why_not_installed(abi)  # hashes what is not the owner's; says why it does not fit
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
    return binary, entry, ""


def shipped_module(spec, record_path: Optional[Union[str, Path]],
                   native: Callable[[], ModuleType]) -> Optional[ModuleType]:
    """The module of the binary a wheel ships for ``spec`` when it fits (``shipped_fit``); else None, with
    the reason kept (``shipped_why``: cache/shipped.py's NoBuildError says it) and a warning when the
    binary was modified. ``record_path``: ``spec.find_record(spec.sources)``; ``native``: as
    ``shipped_fit`` takes it."""
    if spec.kind != "module":
        return None
    if record_path is None:
        shipped_why[spec.name] = f"no wheel ships a binary of '{spec.name}' (no opbuilder_ops.json beside its sources)"
        return None
    binary, entry, why = shipped_fit(spec, record_path, native)
    if binary is None or entry is None:
        shipped_why[spec.name] = why
        from .spec import no_build  # imported by ``import opbuilder``
        if "modified" in why and not no_build():
            import logging
            logging.getLogger("opbuilder").warning("opbuilder: %s: %s; building it instead", spec.name, why)
        return None
    memo = (str(record_path), str(entry["hash"]))
    mod = _shipped.get(memo)
    if mod is not None:
        return mod
    with _shipped_lock:  # one import per binary, whichever thread loads it first
        mod = _shipped.get(memo)
        if mod is not None:
            return mod
        native_dir: Optional[str]
        if entry["abi"].get("binding") == "pybind11":
            native_dir = None
        elif owned_runtime() is not None:
            native_dir = NATIVE_DIR
        else:
            nat = native().installed(by_owner=True)
            native_dir = None if nat is None else str(nat.dir)
        deps: List[str] = []
        if native_dir is not None:
            runtime = f"{native_dir}/{RUNTIME_FILE}"
            loaded = loaded_runtime()
            if loaded is not None and str(loaded) != runtime:
                shipped_why[spec.name] = (f"this process already loaded another nanobind runtime ({loaded}), "
                                          f"built by opbuilder in its cache")
                return None
            deps = [runtime] + ([f"{native_dir}/{CORE_FILE}"] if entry.get("core") else [])
        preload(deps)  # type: ignore[arg-type]
        mod = import_extension(spec.name, binary, spec.name)  # type: ignore[arg-type]
        # its plain name is taken: a later build of this operator imports under a name of its own (pybind11
        # would otherwise hand back this module, module_name_for)
        names_used.add(spec.name)
        _shipped[memo] = mod
        shipped_used[spec.name] = binary
        shipped_why.pop(spec.name, None)
    return mod

"""Importing a built extension module from its path, with readable failures, after the shared
libraries it loads first.

A nanobind operator needs nanobind's runtime and (usually) the core library loaded with
RTLD_GLOBAL before it is imported. Its ``build.json`` records them (``needs``, written by
needs.py once a lookup found them); ``recorded`` checks each with one ``lstat`` and ``preload``
loads them. These are here, not in needs.py, because every warm load() runs them: importing a
module of its own was ~0.1 ms of a ~2 ms warm load() (issue 21). A shipped load() (cache/shipped.py)
uses ``preload``, ``import_extension`` and ``python_api`` only: what the cache's records need is
imported by ``recorded`` when first called.

It imports nothing of opbuilder: the names of the core library's files (``CORE_NAME``, ``CORE_FILE``),
its ``dlopen`` (native/core_lib.py) and the Python API a module built here needs (native/abi.py) are
defined here and handed on by those modules, so a warm or shipped load() imports neither (each module
is ~0.3 M instructions of a new process, issues 35 and 38).
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import stat
import sys
import threading
from pathlib import Path
from types import ModuleType
from stat import S_ISDIR, S_ISREG, S_IWGRP, S_IWOTH
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

__all__ = ["import_extension", "RUNTIME_NAME", "DEP_FILES", "is_key", "recorded",
           "recorded_needs", "preload", "preload_runtime", "preload_core", "dlopen_global", "loaded_runtime",
           "import_build", "loaded_modules", "names_used", "loaded_lock", "RUNTIME_FILE", "CORE_NAME", "CORE_FILE",
           "LIMITED_API_HEX", "limited_api", "python_api", "HASH", "file_hash", "files_intact", "inside", "loads",
           "owned_by_code_owner"]

# nanobind's runtime (built by nanobind_runtime.py) and the core library (native/core_lib.py) are loaded
# here, with the process's record of them, so that a warm load() imports nothing that builds them
RUNTIME_NAME = "_nanobind"  # its cache directory: _nanobind.lib
RUNTIME_FILE = "libnanobind.so"
CORE_NAME = "_obcore"  # the core library's cache directory: _obcore.lib
CORE_FILE = "libobcore.so"
LIMITED_API_HEX = "0x030C0000"  # Python 3.12: the first the stable ABI of nanobind serves (native/abi.py)
DEP_FILES = {f"{RUNTIME_NAME}.lib": RUNTIME_FILE, f"{CORE_NAME}.lib": CORE_FILE}  # the only ones recorded
# opbuilder's installed runtime (native/installed.py): a record names it by this key, never by a path
NATIVE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_native")
INSTALLED_KEY = "installed"
_runtime: Optional[str] = None  # the runtime this process loaded
_lock = threading.Lock()
_cores: Dict[str, int] = {}  # path -> dlopen handle, the core libraries this process loaded
# the cache's builds this process imported: (op dir, key) -> module, so an unchanged load() returns the
# same object; and the module names used (a later build of one operator gets a name of its own)
loaded_modules: Dict[Tuple[str, str], ModuleType] = {}
names_used: Set[str] = set()
loaded_lock = threading.Lock()
_HEX = frozenset("0123456789abcdef")


def is_key(key: object) -> bool:
    """A build key as the builder writes them (hex): never a path (no ``/``, no ``..``)."""
    return isinstance(key, str) and 8 <= len(key) <= 64 and _HEX.issuperset(key)


def recorded(lib: Path, names: Sequence[str]) -> Optional[List[Path]]:
    """The dependencies recorded for module ``lib`` (in the cache) whose directories are ``names``,
    if every one is there, unchanged since it was recorded; else None (look them up). Only names of
    the libraries opbuilder builds itself are accepted (``DEP_FILES``), so a record can point
    nowhere but at their directories in the same cache."""
    from .cache.published import INFO, verified_record
    from .cache.trust import read_file, stamp_of

    key_dir = str(lib.parent)
    data = verified_record(key_dir)  # parsed by the lookup that found ``lib`` just before
    if data is None:
        import json
        try:
            data = json.loads(read_file(Path(key_dir, INFO)))
        except (OSError, ValueError):
            return None
    entries = data.get("needs") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return None
    root = os.path.dirname(os.path.dirname(key_dir))
    by_dir = {e.get("dir"): e for e in entries if isinstance(e, dict)}
    out = []
    for name in names:
        e = by_dir.get(name)
        if e is None or DEP_FILES.get(name) != e.get("file"):
            return None
        if e.get("key") == INSTALLED_KEY and os.environ.get("OPBUILDER_INSTALLED_RUNTIME", "1") != "0":
            path = f"{NATIVE_DIR}/{e['file']}"
        elif is_key(e.get("key")):
            path = f"{root}/{name}/{e['key']}/{e['file']}"  # plain strings: no Path built per part
        else:
            return None
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode) or stamp_of(st) != e.get("stamp"):
            return None
        out.append(Path(path))
    return out


def recorded_needs(lib: Path) -> List[Path]:
    """Every library the record of module ``lib`` (in the cache) says it loads first, if each is
    there unchanged (``recorded``); else none. For an import by path alone, as a pickle names it."""
    import json

    from .cache.published import INFO
    from .cache.trust import read_file

    try:
        data = json.loads(read_file(lib.parent / INFO))
    except (OSError, ValueError):
        return []
    entries = data.get("needs") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return []
    return recorded(lib, [e.get("dir") for e in entries if isinstance(e, dict)]) or []


def limited_api() -> bool:
    """Whether nanobind libraries are built against the limited API here (Python >= 3.12; native/abi.py)."""
    return sys.version_info >= (3, 12) and os.environ.get("OPBUILDER_LIMITED_API", "1") != "0"


def python_api() -> str:
    """The Python ABI a nanobind library built here needs, as keys and records name it:
    ``abi3-cp312`` under the limited API, else this interpreter's (``cpython-311 .cpython-311-...so``;
    tools.toolchain.python_abi(), written out: a shipped load() asks for this and nothing of the toolchain)."""
    if limited_api():
        return "abi3-cp312"
    return f"{sys.implementation.cache_tag} {importlib.machinery.EXTENSION_SUFFIXES[0]}"


def dlopen_global(path: str) -> int:
    """dlopen ``path`` with RTLD_NOW | RTLD_GLOBAL (never closed); its handle. ``_ctypes.dlopen``, not
    ``ctypes.CDLL``: a CDLL object makes a class per library (~0.1 ms of a 2 ms warm load)."""
    try:
        import _ctypes
    except ImportError:  # an interpreter built without ctypes: then nothing here can load a library
        raise OSError(f"cannot load {path}: this Python has no _ctypes module") from None
    return _ctypes.dlopen(path, os.RTLD_NOW | os.RTLD_GLOBAL)


def preload_core(library: Path) -> None:
    """Load the core library at ``library`` into the process's global symbol scope, once per file.
    Libraries of other tags may be loaded beside it: their symbols have other names."""
    path = str(library)
    if path in _cores:
        return
    with _lock:
        if path not in _cores:
            _cores[path] = dlopen_global(path)


def loaded_runtime() -> Optional[Path]:
    """nanobind's runtime as this process loaded it, if it did."""
    return None if _runtime is None else Path(_runtime)


def preload_runtime(library: Path) -> None:
    """Load nanobind's runtime at ``library`` into the process's global symbol scope, once per
    process (a later call with another build keeps the first: nanobind's state lives in the one loaded)."""
    global _runtime
    if _runtime is not None:
        return
    with _lock:
        if _runtime is None:
            dlopen_global(str(library))
            _runtime = str(library)


def preload(libs: Sequence[Path]) -> None:
    """Load each of ``libs`` into the process's global symbol scope (nanobind's runtime: the first
    one only; core libraries: each file once)."""
    for lib in libs:
        if os.path.basename(os.path.dirname(os.path.dirname(lib))) == f"{RUNTIME_NAME}.lib":
            preload_runtime(lib)
        else:
            preload_core(lib)


def module_name_for(name: str, key: str) -> str:
    """The name a build of operator ``name`` is imported under: ``name`` the first time in this process, a
    name of its own later (``_opbuilder_<key>.<name>``), or pybind11 would return the module it made first.
    Call with ``loaded_lock`` held."""
    return name if name not in names_used else f"_opbuilder_{key}.{name}"


def import_build(name: str, op_dir: str, key: str, lib: Path, libs: Sequence[Path]) -> Optional[ModuleType]:
    """The module of the cache's build ``key`` of operator ``name`` (in ``op_dir``): the one this process
    imported already, else ``libs`` loaded first and ``lib`` imported. None when that fails in any way
    (cache/warm.py: the full lookup then runs, and says why)."""
    memo = (op_dir, key)
    with loaded_lock:
        mod = loaded_modules.get(memo)
        if mod is not None:
            return mod
        try:
            preload(libs)
            mod = import_extension(name, lib, module_name_for(name, key))
        except Exception:
            return None
        names_used.add(name)
        loaded_modules[memo] = mod
        return mod


# what explains a failed import (import_errors.py) is imported when one fails; here under its old names
_MOVED = ("demangle", "loader_error", "_explain", "_module_name_hint")


def __getattr__(name: str):
    if name in _MOVED:
        from . import import_errors
        return getattr(import_errors, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def import_extension(name: str, path: Path, module_name: Optional[str] = None) -> ModuleType:
    """Load the extension at ``path`` (operator ``name``) as module ``module_name`` (default ``name``).

    The module is not put in ``sys.modules``. Its init function is
    ``PyInit_<last part of module_name>``, so a dotted ``module_name`` ending
    in ``.name`` imports the same library under a name of its own: pybind11
    (3.x) hands back a module it already created under the same name instead
    of running the new library's code.
    """
    module_name = module_name or name
    loader = importlib.machinery.ExtensionFileLoader(module_name, str(path))
    # what spec_from_file_location makes of an extension file (not a package), without its path checks
    spec = importlib.machinery.ModuleSpec(module_name, loader, origin=str(path))
    spec.has_location = True
    try:
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    except ImportError as e:
        from .errors import BuildError
        from .import_errors import _explain
        why = _explain(e, path) or str(e)
        raise BuildError(f"operator '{name}' was built but cannot be imported: {why}\nlibrary: {path}",
                         name=name, log=str(e)) from e
    return module


# ---- a binary checked against its record, before it is imported --------------------------------------
# A shipped operator's binary (cache/shipped.py) and opbuilder's installed runtime (native/installed.py)
# are trusted by the hashes their records (JSON) hold: here, on the path both loads take already.

try:
    from _blake2 import blake2b
except ImportError:  # pragma: no cover - an interpreter without the builtin module
    from hashlib import blake2b

HASH = "blake2b-256"  # what records name the hash they hold
_OTHERS_WRITE = S_IWGRP | S_IWOTH
_scan: Optional[Callable[[str, int], Any]] = None  # _json's scanner, made on first use (loads)


def file_hash(path: Union[str, Path]) -> str:
    """The BLAKE2b-256 of the file at ``path`` (hex; read without following a symlink). BLAKE2b from
    ``_blake2``, as the cache's keys use it (fingerprint.py): hashlib's SHA-256 imports OpenSSL first,
    which cost a shipped load() 10-50 ms on a loaded machine."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        h = blake2b(digest_size=32)
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return h.hexdigest()
            h.update(chunk)
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


class _Context:
    """What ``_json.make_scanner`` reads of a decoder: json.loads's defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__
    memo: dict = {}


def loads(text: str) -> Any:
    """``json.loads(text)`` with the C scanner of ``_json``, the json package's accelerator, without
    importing the json package (its decoder and encoder modules: ~1 ms of a ~3 ms shipped load); a
    ValueError (json.JSONDecodeError) for what is not one JSON document. Where ``_json`` is missing,
    the json package reads it."""
    global _scan
    if _scan is None:
        try:
            from _json import make_scanner
        except ImportError:  # pragma: no cover - an interpreter without the accelerator
            import json
            return json.loads(text)
        _scan = make_scanner(_Context())
    doc = text.strip(" \t\n\r")
    try:
        value, end = _scan(doc, 0)
    except StopIteration:  # nothing that starts a JSON value
        end = -1
    if end != len(doc):
        import json
        return json.loads(text)  # raises its JSONDecodeError, with the position
    return value


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

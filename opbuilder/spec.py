"""What to build: the validated description of one operator build, and what every ``load()`` reads
before it looks for a build (the cache's root, a wheel's record of shipped operators, the environment);
and how a build found is loaded (its libraries, then the module: ``import_build``).

This module imports nothing of opbuilder, and ``import opbuilder`` imports it and the package only: each
module a new process imports costs ~0.3 M instructions (~0.15 ms), a tenth of a shipped load's budget
(issue 35). So ``cache_root`` (cache/cache_dir.py), ``clean_path`` (cache/relocate.py) and ``find_record``
(cache/shipped_record.py) are defined here, and those modules hand them on under their old names; and
so is the loading both a warm load() (warm.py) and a shipped one (importer.py) end with, so that a warm
load() imports warm.py and no other module (importer.py hands these names on).
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import keyword
import os
import threading
from operator import itemgetter
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

__all__ = ["BuildSpec", "make_spec", "verbose_requested", "BACKENDS", "CXX_SUFFIXES", "CUDA_SUFFIXES", "MAX_NAME",
           "PATH_FLAGS", "joined_path_flag", "cache_root", "clean_path", "RECORD", "find_record", "no_build",
           "RUNTIME_NAME", "RUNTIME_FILE", "CORE_NAME", "CORE_FILE", "DEP_FILES", "NATIVE_DIR", "is_key",
           "dlopen_global", "preload", "preload_core", "preload_runtime", "loaded_runtime", "import_build",
           "import_extension", "module_name_for", "loaded_modules", "names_used", "loaded_lock"]

BACKENDS = ("CPU", "GPU")
BINDINGS = ("nanobind", "pybind11")
CXX_SUFFIXES = (".cpp", ".cc", ".cxx", ".c++", ".C")
CUDA_SUFFIXES = (".cu",)
MAX_NAME = 100  # characters in an operator name: with suffixes and temporary-file parts, well under 255
if TYPE_CHECKING:  # a typing alias made at import costs every new process ~0.1 M instructions
    PathLike = Union[str, Path]
# flags whose argument is a path (``-Idir`` or ``-I dir``): relative ones are made absolute at once
PATH_FLAGS = ("-I", "-iquote", "-isystem", "-idirafter", "-include", "-imacros", "-L")
_LINKED = (".a", ".o", ".so")  # libraries and objects named in ldflags
_FIELDS = ("name", "sources", "backend", "kind", "include_paths", "cflags", "cuda_cflags", "ldflags", "debug",
           "verbose", "root", "binding")
RECORD = "opbuilder_ops.json"  # a wheel's record of the operators it ships (cache/shipped.py)
_SEARCH_UP = 4  # directories searched for it, from the first source's upwards


class BuildSpec(tuple):
    """What to build: an operator's inputs, checked and made absolute (make_spec).

    Fields: ``name`` (str); ``sources`` and ``include_paths`` (tuples of Path); ``backend`` ("CPU",
    "GPU"); ``kind`` ("module": a Python extension, nanobind or pybind11; "library": a plain shared
    library, aot ops; "core": libobcore, the C++ API's compiled bodies; "runtime": nanobind's shared
    runtime; "torch_bridge": to_torch's C++ bridge); ``cflags``, ``cuda_cflags``, ``ldflags`` (tuples of
    str); ``debug``, ``verbose`` (bool); ``root`` (Path: the cache); ``binding`` (modules: "nanobind" or
    "pybind11"; None: read from the sources, binding.py).

    A named tuple written out (``_fields``, ``_replace``, ``_asdict`` as collections.namedtuple has
    them): namedtuple() compiles its ``__new__`` from source when called, typing.NamedTuple a ForwardRef
    per field, and a dataclass allocates enough to push a warm load() into a garbage collection (issue
    21); each costs every new process a fraction of a millisecond."""

    __slots__ = ()
    _fields = _FIELDS

    def __new__(cls, name, sources, backend, kind, include_paths, cflags, cuda_cflags, ldflags, debug, verbose,
                root, binding=None):
        return tuple.__new__(cls, (name, sources, backend, kind, include_paths, cflags, cuda_cflags, ldflags, debug,
                                   verbose, root, binding))

    name = property(itemgetter(0))
    sources = property(itemgetter(1))
    backend = property(itemgetter(2))
    kind = property(itemgetter(3))
    include_paths = property(itemgetter(4))
    cflags = property(itemgetter(5))
    cuda_cflags = property(itemgetter(6))
    ldflags = property(itemgetter(7))
    debug = property(itemgetter(8))
    verbose = property(itemgetter(9))
    root = property(itemgetter(10))
    binding = property(itemgetter(11))

    def _replace(self, **changes) -> "BuildSpec":
        """A copy with the fields ``changes`` names set (ValueError for a name that is no field)."""
        values = [changes.pop(f, v) for f, v in zip(_FIELDS, self)]
        if changes:
            raise ValueError(f"Got unexpected field names: {list(changes)!r}")
        return tuple.__new__(type(self), values)

    def _asdict(self) -> dict:
        return dict(zip(_FIELDS, self))

    def __getnewargs__(self) -> tuple:
        return tuple(self)

    def __repr__(self) -> str:
        return "BuildSpec(" + ", ".join(f"{f}={v!r}" for f, v in zip(_FIELDS, self)) + ")"

    @property
    def op_dir(self) -> Path:
        """Per-operator directory: objects, dependency manifests, published builds."""
        return self.root / (self.name if self.kind == "module" else f"{self.name}.lib")

    def warm_record_fits(self) -> bool:
        """Whether a warm record (opbuilder/warm.py) may serve this build: a CPU module, no prebuilt store
        (its lookups are its own), no ``-march=native`` (the CPU is a fact no file stamps)."""
        return (self.kind == "module" and self.backend == "CPU" and not os.environ.get("OPBUILDER_PREBUILT_DIR")
                and not any("native" in f for f in (*self.cflags, *self.cuda_cflags)))


def _as_list(value: Optional[Union[str, Iterable[str]]], what: str) -> Tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, (bytes, bytearray)):
        raise TypeError(f"{what} must be a string or a list of strings, got {type(value).__name__}")
    if isinstance(value, str):  # one string: split as a shell splits it, so "-DMSG='a b'" stays one flag
        if not any(c in value for c in "'\"\\"):
            return tuple(value.split())
        import shlex
        try:
            return tuple(shlex.split(value))
        except ValueError as e:  # an unbalanced quote
            raise ValueError(f"{what}: cannot split {value!r} into flags: {e}") from None
    out = tuple(value)
    for v in out:
        if not isinstance(v, str):
            raise TypeError(f"{what} must be strings, got {type(v).__name__}: {v!r}")
    return out


def joined_path_flag(flag: str) -> Optional[str]:
    """The ``PATH_FLAGS`` entry that ``flag`` begins with, its path joined to it (``-Idir``), or None."""
    if not flag.startswith(PATH_FLAGS):  # most flags: one call, not one per entry (the warm path keys ~20)
        return None
    return next((p for p in PATH_FLAGS if flag.startswith(p) and len(flag) > len(p)), None)


def _absolute(path: str) -> str:
    return path if os.path.isabs(path) or path.startswith("~") else clean_path(os.path.abspath(path))


def _flag_path(flag: str, path: str) -> str:
    # -include x.h is looked up in the working directory, then along the include path: absolute only if
    # it names a file here (else the compiler's search finds it, as before). Not relative to the current
    # directory, so left as written: -I- (no directory) and sysroot-relative paths (=dir, $SYSROOT/dir)
    if path == "-" or path.startswith(("=", "$SYSROOT")) or \
            (flag in ("-include", "-imacros") and not os.path.isfile(path)):
        return path
    return _absolute(path)


def _absolute_paths(flags: Tuple[str, ...], link: bool = False) -> Tuple[str, ...]:
    """``flags`` with the relative paths of ``PATH_FLAGS`` (and, in link flags, of libraries and objects
    named by a relative path that exists) made absolute against the current directory, as sources and
    include paths are: the compiler runs in the cache's build directory, where they would mean nothing."""
    out = []
    i = 0
    while i < len(flags):
        f = flags[i]
        if f in PATH_FLAGS and i + 1 < len(flags):
            out += [f, _flag_path(f, flags[i + 1])]
            i += 2
            continue
        flag = joined_path_flag(f)
        if flag is not None:
            f = flag + _flag_path(flag, f[len(flag):])
        elif link and not f.startswith("-") and (f.endswith(_LINKED) or ".so." in f) and os.path.isfile(f):
            f = _absolute(f)
        out.append(f)
        i += 1
    return tuple(out)


def _absolute_path(path: PathLike) -> str:
    """``clean_path(str(Path(path).expanduser().absolute()))`` with one Path made, not three (a new process's
    load() makes a spec before anything else, issue 35): what pathlib drops (``.`` parts, doubled ``/``, a
    trailing ``/``) is dropped by clean_path's normpath too, a file being the same file without them."""
    p = Path(path)
    if not p.is_absolute():
        p = p.expanduser()
        if not p.is_absolute():
            return clean_path(os.path.join(os.getcwd(), str(p)))
    return clean_path(str(p))


def _check_utf8(path: str, what: str, fix: str = "rename it") -> None:
    """A path with bytes that are not UTF-8 (held as surrogates) cannot go into the build's files."""
    try:
        path.encode()
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not a UTF-8 path: its name has bytes no build file can hold; {fix}") from None


RESERVED_NAME = "inline"  # the cache's directory of load_inline's sources (inline.py), beside operators'


def check_name(name: object) -> None:
    """ValueError unless ``name`` can name an operator: an ASCII Python identifier, not a keyword, not the
    cache's own ``inline``, short enough to name files in the cache."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"operator name {name!r} must be a valid Python identifier (it becomes the module name)")
    if keyword.iskeyword(name):
        raise ValueError(f"operator name {name!r} is a Python keyword, which cannot name a module (import {name} "
                         f"is a syntax error); choose another name")
    if not name.isascii():
        # Python looks for PyInitU_<punycode> in a module with a non-ASCII name, which PYBIND11_MODULE never defines
        raise ValueError(f"operator name {name!r} must be ASCII (letters, digits, _): Python cannot import an "
                         f"extension module with a non-ASCII name")
    if name == RESERVED_NAME:
        raise ValueError(f"operator name {name!r} is reserved: the cache keeps load_inline's sources in its "
                         f"directory {name}/ (and `opbuilder cache clean {name}` would remove them); choose another name")
    if len(name) > MAX_NAME:
        raise ValueError(f"operator name {name[:20]}... is {len(name)} characters long; at most {MAX_NAME} are "
                         f"accepted (it names files in the cache, whose names the file system limits)")


def check_backend(backend: object, binding: Optional[str] = None) -> str:
    """The backend, upper-cased; ValueError for an unknown backend or binding."""
    if not isinstance(backend, str) or backend.upper() not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; accepted values: {', '.join(map(repr, BACKENDS))} (the "
                         f"{backend} backend is not available: opbuilder builds for these backends only)")
    if binding is not None and binding not in BINDINGS:
        raise ValueError(f"unknown binding {binding!r}; accepted values: None (read from the sources), "
                         f"{', '.join(map(repr, BINDINGS))}")
    return backend.upper()


def check_flags(options: Dict[str, Any]) -> None:
    """TypeError or ValueError for options of a builder that cannot be used: flags (``cflags``,
    ``cuda_cflags``, ``ldflags``), ``include_paths`` that are not paths, a ``build_dir`` that is not one."""
    for what in ("cflags", "cuda_cflags", "ldflags"):
        _as_list(options.get(what), what)
    paths = options.get("include_paths")
    if paths is not None and not isinstance(paths, (str, os.PathLike)):
        for p in paths:
            if not isinstance(p, (str, os.PathLike)):
                raise TypeError(f"include_paths must be paths (str or os.PathLike), got {type(p).__name__}: {p!r}")
    if options.get("build_dir") is not None:
        cache_root(options["build_dir"])


def make_spec(name: str, sources: Union[PathLike, Sequence[PathLike]], backend: str, kind: str,
              include_paths: Optional[Sequence[PathLike]], cflags, cuda_cflags, ldflags,
              debug: bool, verbose: bool, root: Path, binding: Optional[str] = None) -> BuildSpec:
    """Check the user's arguments and resolve paths; errors say what to change."""
    check_name(name)
    backend = check_backend(backend, binding)
    if isinstance(sources, (str, Path)):
        sources = [sources]
    srcs = []
    for s in sources:
        path = _absolute_path(s)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"source file of operator '{name}' not found: {s}")
        p = Path(path)
        suffixes = CXX_SUFFIXES + (CUDA_SUFFIXES if backend == "GPU" else ())
        if p.suffix not in suffixes:
            hint = " (.cu sources need backend='GPU')" if p.suffix in CUDA_SUFFIXES else ""
            raise ValueError(f"source {s} of operator '{name}' has an unsupported suffix{hint}; "
                             f"accepted: {', '.join(suffixes)}")
        _check_utf8(path, f"source {s!r} of operator '{name}'")
        srcs.append(p)
    if not srcs:
        raise ValueError(f"operator '{name}' has no sources")
    if len(set(srcs)) != len(srcs):
        raise ValueError(f"operator '{name}' lists a source twice")
    incs = []
    if isinstance(include_paths, (str, os.PathLike)):  # one path, not its characters
        include_paths = [include_paths]
    for inc in include_paths or ():
        p = Path(_absolute_path(inc))
        if not p.is_dir():
            raise FileNotFoundError(f"include path of operator '{name}' is not a directory: {inc}")
        _check_utf8(str(p), f"include path {inc!r} of operator '{name}'")
        incs.append(p)
    _check_utf8(str(root), f"the cache directory {str(root)!r} of operator '{name}'", "set OPBUILDER_CACHE_DIR to one")
    return BuildSpec(name=name, sources=tuple(srcs), backend=backend, kind=kind, include_paths=tuple(incs),
                     cflags=_absolute_paths(_as_list(cflags, "cflags")),
                     cuda_cflags=_absolute_paths(_as_list(cuda_cflags, "cuda_cflags")),
                     ldflags=_absolute_paths(_as_list(ldflags, "ldflags"), link=True), debug=bool(debug),
                     verbose=bool(verbose), root=root, binding=binding)


def verbose_requested(verbose: bool) -> bool:
    """``verbose=``, or ``OPBUILDER_VERBOSE`` set (not to 0): print each command a build runs."""
    return bool(verbose) or os.environ.get("OPBUILDER_VERBOSE", "") not in ("", "0")


def cache_root(override: Optional[Union[str, os.PathLike]] = None) -> Path:
    """The cache directory: ``override`` (``build_dir``), else ``OPBUILDER_CACHE_DIR``, else
    ``~/.cache/opbuilder`` (cache/cache_dir.py says what is in it)."""
    if override is not None:
        if not isinstance(override, (str, os.PathLike)):
            raise TypeError(f"build_dir must be a path (a str or os.PathLike), got {type(override).__name__}")
        return Path(override).expanduser().absolute()
    env = os.environ.get("OPBUILDER_CACHE_DIR")
    if env:
        return Path(env).expanduser().absolute()
    home = os.path.expanduser("~")  # Path.home(), with one Path made, not three (every load() makes a spec)
    if home[:1] == "~":
        raise RuntimeError("Could not determine home directory.")  # as Path.home() says it
    return Path(os.path.join(home, ".cache", "opbuilder"))


def clean_path(path: str) -> str:
    """An absolute ``path`` without ``.`` and ``..`` (``src/../include/v.h`` from ``-I ../include``), so that
    keys name each file one way. Lexically when that is the same file (the usual case, and it keeps
    the checkout's own spelling); through the links otherwise (``link/..`` is the link target's parent)."""
    norm = os.path.normpath(path)
    if norm == path:
        return path
    try:
        if os.path.samefile(norm, path):
            return norm
    except OSError:
        return norm
    return os.path.realpath(path)


def find_record(sources: Sequence[Union[str, os.PathLike]]) -> Optional[Path]:
    """A wheel's record of its shipped operators (``RECORD``, read by cache/shipped.py) in the first
    source's directory or one of the ``_SEARCH_UP`` above it; None if none (a few ``stat`` calls)."""
    if not sources:
        return None
    d = os.path.dirname(str(sources[0]))
    for _ in range(_SEARCH_UP):
        path = os.path.join(d, RECORD)
        if os.path.isfile(path):
            return Path(path)
        up = os.path.dirname(d)
        if up == d:
            break
        d = up
    return None


def switch_on(name: str, default: str) -> bool:
    """An on/off environment variable of opbuilder's (``OPBUILDER_NO_BUILD``, ``OPBUILDER_PCH``,
    ``OPBUILDER_LTO``): off for ``0``, ``false``, ``no``, ``off`` (any case, spaces around) or empty."""
    return os.environ.get(name, default).strip().lower() not in ("", "0", "false", "no", "off")


def no_build() -> bool:
    """``OPBUILDER_NO_BUILD=1``: a build that would be needed is a NoBuildError."""
    return switch_on("OPBUILDER_NO_BUILD", "")


# ---- a build, found, loaded: its libraries first, then the module (importer.py hands these on) -----------
# nanobind's runtime (built by nanobind_runtime.py) and the core library (native/core_lib.py) are loaded
# here, with the process's record of them, so that a warm load() imports nothing that builds them
RUNTIME_NAME = "_nanobind"  # its cache directory: _nanobind.lib
RUNTIME_FILE = "libnanobind.so"
CORE_NAME = "_obcore"  # the core library's cache directory: _obcore.lib
CORE_FILE = "libobcore.so"
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


def dlopen_global(path: str) -> int:
    """dlopen ``path`` with RTLD_NOW | RTLD_GLOBAL (never closed); its handle. ``_ctypes.dlopen``, not
    ``ctypes.CDLL``: a CDLL object makes a class per library (~0.1 ms of a 2 ms warm load)."""
    try:
        import _ctypes
    except ImportError:  # an interpreter built without ctypes: then nothing here can load a library
        raise OSError(f"cannot load {path}: this Python has no _ctypes module") from None
    return _ctypes.dlopen(path, os.RTLD_NOW | os.RTLD_GLOBAL)


def preload_core(library: PathLike) -> None:
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


def loaded_cores() -> List[Path]:
    """The core libraries this process loaded (one per tag its operators were built with), in order."""
    return [Path(p) for p in list(_cores)]


def preload_runtime(library: PathLike) -> None:
    """Load nanobind's runtime at ``library`` into the process's global symbol scope, once per
    process (a later call with another build keeps the first: nanobind's state lives in the one loaded)."""
    global _runtime
    if _runtime is not None:
        return
    with _lock:
        if _runtime is None:
            dlopen_global(str(library))
            _runtime = str(library)


def preload(libs: Sequence[PathLike]) -> None:
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


def import_build(name: str, op_dir: str, key: str, lib: PathLike, libs: Sequence[PathLike]) -> Optional[ModuleType]:
    """The module of the cache's build ``key`` of operator ``name`` (in ``op_dir``): the one this process
    imported already, else ``libs`` loaded first and ``lib`` imported. None when that fails in any way
    (warm.py: the full lookup then runs, and says why)."""
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


def import_extension(name: str, path: PathLike, module_name: Optional[str] = None) -> ModuleType:
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

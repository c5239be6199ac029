"""What to build: the validated description of one operator build, and what every ``load()`` reads
before it looks for a build (the cache's root, a wheel's record of shipped operators, the environment).

This module imports nothing of opbuilder, and ``import opbuilder`` imports it and custom_op.py only: each
module a new process imports costs ~0.3 M instructions (~0.15 ms), a tenth of a shipped load's budget
(issue 35). So ``cache_root`` (cache/cache_dir.py), ``clean_path`` (cache/relocate.py) and ``find_record``
(cache/shipped_record.py) are defined here, and those modules hand them on under their old names.
"""
from __future__ import annotations

import keyword
import os
from operator import itemgetter
from pathlib import Path
from typing import Iterable, Optional, Sequence, Tuple, Union

__all__ = ["BuildSpec", "make_spec", "verbose_requested", "BACKENDS", "CXX_SUFFIXES", "CUDA_SUFFIXES", "MAX_NAME",
           "PATH_FLAGS", "joined_path_flag", "cache_root", "clean_path", "RECORD", "find_record", "no_build"]

BACKENDS = ("CPU", "GPU")
BINDINGS = ("nanobind", "pybind11")
CXX_SUFFIXES = (".cpp", ".cc", ".cxx", ".c++", ".C")
CUDA_SUFFIXES = (".cu",)
MAX_NAME = 100  # characters in an operator name: with suffixes and temporary-file parts, well under 255
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
    if isinstance(value, str):
        return tuple(value.split())
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


def make_spec(name: str, sources: Union[PathLike, Sequence[PathLike]], backend: str, kind: str,
              include_paths: Optional[Sequence[PathLike]], cflags, cuda_cflags, ldflags,
              debug: bool, verbose: bool, root: Path, binding: Optional[str] = None) -> BuildSpec:
    """Check the user's arguments and resolve paths; errors say what to change."""
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"operator name {name!r} must be a valid Python identifier (it becomes the module name)")
    if not name.isascii():
        # Python looks for PyInitU_<punycode> in a module with a non-ASCII name, which PYBIND11_MODULE never defines
        raise ValueError(f"operator name {name!r} must be ASCII (letters, digits, _): Python cannot import an "
                         f"extension module with a non-ASCII name")
    if len(name) > MAX_NAME:
        raise ValueError(f"operator name {name[:20]}... is {len(name)} characters long; at most {MAX_NAME} are "
                         f"accepted (it names files in the cache, whose names the file system limits)")
    if not isinstance(backend, str) or backend.upper() not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; accepted values: {', '.join(map(repr, BACKENDS))} (the "
                         f"{backend} backend is not available: opbuilder builds for these backends only)")
    backend = backend.upper()
    if binding is not None and binding not in BINDINGS:
        raise ValueError(f"unknown binding {binding!r}; accepted values: None (read from the sources), "
                         f"{', '.join(map(repr, BINDINGS))}")
    if isinstance(sources, (str, Path)):
        sources = [sources]
    srcs = []
    for s in sources:
        p = Path(clean_path(str(Path(s).expanduser().absolute())))
        if not p.is_file():
            raise FileNotFoundError(f"source file of operator '{name}' not found: {s}")
        suffixes = CXX_SUFFIXES + (CUDA_SUFFIXES if backend == "GPU" else ())
        if p.suffix not in suffixes:
            hint = " (.cu sources need backend='GPU')" if p.suffix in CUDA_SUFFIXES else ""
            raise ValueError(f"source {s} of operator '{name}' has an unsupported suffix{hint}; "
                             f"accepted: {', '.join(suffixes)}")
        srcs.append(p)
    if not srcs:
        raise ValueError(f"operator '{name}' has no sources")
    if len(set(srcs)) != len(srcs):
        raise ValueError(f"operator '{name}' lists a source twice")
    incs = []
    for inc in include_paths or ():
        p = Path(clean_path(str(Path(inc).expanduser().absolute())))
        if not p.is_dir():
            raise FileNotFoundError(f"include path of operator '{name}' is not a directory: {inc}")
        incs.append(p)
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
        return Path(override).expanduser().absolute()
    env = os.environ.get("OPBUILDER_CACHE_DIR")
    if env:
        return Path(env).expanduser().absolute()
    return Path.home() / ".cache" / "opbuilder"


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


def no_build() -> bool:
    """``OPBUILDER_NO_BUILD=1``: a build that would be needed is a NoBuildError."""
    return os.environ.get("OPBUILDER_NO_BUILD", "") not in ("", "0")

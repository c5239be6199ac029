"""Finding an aot kernel: ``"path:Symbol"`` -> (built) library -> resolved addresses.

A path ending in a source suffix (.cpp .cc .cxx .C; .cu with the GPU backend)
is built by the builder as a plain shared library, cached by content like
every build, with the build options given (include paths, compile and link
flags: part of the cache key); anything else is taken as a shared library. The library is
opened once per path (and again when the file there was rebuilt since: a
changed library is new code, never the old one the loader still holds) and
``Symbol`` (and the optional ``SymbolInit``) resolved once, so a call only
passes addresses. A library that uses CUDA (built from
.cu, or a prebuilt one carrying device code or linking the CUDA runtime: see
cuda_elf.py) is marked so, and only ever gets device tensors.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple, Union

from .cuda_elf import cuda_use

__all__ = ["AotKernel", "BuildOptions", "resolve_aot", "split_func"]

CXX_SOURCES = (".cpp", ".cc", ".cxx", ".C")
CUDA_SOURCES = (".cu",)

_libraries: Dict[str, Tuple[Tuple[int, int, int, int], ctypes.CDLL]] = {}  # path -> (its identity, library)
_lock = threading.Lock()


@dataclass(frozen=True)
class AotKernel:
    """A resolved aot function: where it lives and the addresses to call."""

    symbol: str
    library: str
    fn: int
    init: Optional[int]
    backend: str  # "CPU", or "GPU" for a kernel built from .cu
    cuda: Optional[str] = None  # why the library is CUDA code (its params must be device pointers), or None


@dataclass(frozen=True)
class BuildOptions:
    """How to build an aot source: ``opbuilder.build_library``'s include_paths, cflags and ldflags."""

    include_paths: Optional[Sequence[Any]] = None
    cflags: Optional[Union[str, Sequence[str]]] = None
    ldflags: Optional[Union[str, Sequence[str]]] = None

    def __bool__(self) -> bool:
        return bool(self.include_paths or self.cflags or self.ldflags)


def split_func(func: str) -> "tuple[str, str]":
    """``"path/lib.so:Symbol"`` -> (path, symbol); ValueError naming the expected form."""
    path, sep, symbol = func.rpartition(":")
    if not sep or not path or not symbol:
        raise ValueError(f"aot func {func!r} must be 'path/to/lib.so:Symbol' or 'path/to/op.cpp:Symbol'")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", symbol):
        raise ValueError(f"aot func {func!r}: {symbol!r} is not a C symbol name")
    return path, symbol


def _library_name(source: Path) -> str:
    """A builder name for a source: its stem plus a hash of its path (two op.cpp do not collide)."""
    stem = re.sub(r"\W", "_", source.stem) or "op"
    tag = hashlib.blake2b(str(source).encode(), digest_size=4).hexdigest()
    return f"aot_{stem}_{tag}"


def _build(source: Path, backend: str, options: BuildOptions) -> str:
    from opbuilder import build_library
    return build_library(_library_name(source), [source], backend=backend, include_paths=options.include_paths,
                         cflags=options.cflags, ldflags=options.ldflags)


def _identity(path: str) -> Tuple[int, int, int, int]:
    """What tells one build of a file from the next: device, inode, size, modification time."""
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _load_copy(path: str) -> ctypes.CDLL:
    """``path`` loaded from a private copy (removed again once loaded: the mapping stays).

    The dynamic loader hands back the library it already has for a path (or
    for the same inode, which a file overwritten in place keeps), so a library
    rebuilt at a path this process has loaded from is only ever new code when
    it is loaded under another name."""
    tmp = tempfile.mkdtemp(prefix="opbuilder-aot-")
    try:
        copy = os.path.join(tmp, os.path.basename(path))
        shutil.copyfile(path, copy)
        return ctypes.CDLL(copy)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _open(path: str) -> ctypes.CDLL:
    """The library at ``path``, opened once per build of it: a file changed since it was loaded is loaded anew."""
    ident = _identity(path)
    with _lock:
        known = _libraries.get(path)
        if known is not None and known[0] == ident:
            return known[1]
        try:
            lib = ctypes.CDLL(path) if known is None else _load_copy(path)
        except OSError as e:
            raise OSError(f"aot library {path} could not be loaded: {e}") from None
        _libraries[path] = (ident, lib)
    return lib


def _address(lib: ctypes.CDLL, symbol: str) -> Optional[int]:
    try:
        return ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value
    except AttributeError:
        return None


def resolve_aot(func: str, options: BuildOptions = BuildOptions()) -> AotKernel:
    """Build (for a source, with ``options``) and open the library of ``func``, and resolve its symbols."""
    path_s, symbol = split_func(func)
    path = Path(os.path.expanduser(path_s)).absolute()
    backend = "GPU" if path.suffix in CUDA_SOURCES else "CPU"
    if path.suffix in CXX_SOURCES + CUDA_SOURCES:
        if not path.is_file():
            raise FileNotFoundError(f"aot source {path} (from func {func!r}) not found")
        library = _build(path, backend, options)
    else:
        if options:
            raise ValueError(f"include_paths, cflags and ldflags build an aot source; {path} (from func {func!r}) "
                             f"is a prebuilt library: pass its source ({', '.join(CXX_SOURCES + CUDA_SOURCES)}) "
                             f"to build it with them")
        if not path.is_file():
            raise FileNotFoundError(f"aot library {path} (from func {func!r}) not found; give a shared library, "
                                    f"or a source ({', '.join(CXX_SOURCES + CUDA_SOURCES)}) to build")
        library = str(path)
    lib = _open(library)
    fn = _address(lib, symbol)
    if fn is None:
        raise AttributeError(f"symbol '{symbol}' not found in aot library {library} (from func {func!r}); "
                             f"is it defined there, spelled the same, and declared extern \"C\"?")
    cuda = "built from a .cu source by nvcc" if backend == "GPU" else cuda_use(library)
    return AotKernel(symbol=symbol, library=library, fn=fn, init=_address(lib, symbol + "Init"), backend=backend,
                     cuda=cuda)

"""The core library: opbuilder's non-template C++ core, compiled once for every nanobind operator.

Most of what an operator used to compile was the same in every operator: the runtime bridge,
the recorded node, RecordOutputs, the fingerprints, error translation (the functions marked
``OB_CORE_FN`` in include/opbuilder). A nanobind operator now only declares them (it is built with
``-DOB_CORE_TAG=<tag>``, see include/opbuilder/detail/core_lib.h) and this library, built from
include/opbuilder/core_lib.cpp, defines them. It is built through the same pipeline as an
operator (keyed, locked, verified, published atomically; ``_obcore.lib`` in the cache, listed by
``cache list``, carried by ``build --into`` stores and bundles, like nanobind's runtime) and loaded
with RTLD_GLOBAL before the operator is imported.

The tag is a digest of opbuilder's headers, the C++ compiler and the Python ABI, and it is part of
every exported symbol's name (an ``abi_tag``): an operator built from other headers needs, and
binds to, the core library built from those, so two versions loaded in one process never mix.
Builds that must see every function (pybind11 operators, sanitizer builds, CUDA sources, flags that
change the C++ library's ABI) keep compiling them inline, as before.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Dict, Sequence

from .fingerprint import digest_of
from .headers import include_dir
from .spec import BuildSpec

__all__ = ["CORE_NAME", "CORE_FILE", "core_tag", "core_spec", "uses_core", "preload"]

CORE_NAME = "_obcore"  # its cache directory: _obcore.lib
CORE_FILE = "libobcore.so"
# user flags after which the operator must compile the core itself: instrumented code, another
# C++ library ABI (debug containers, the old string ABI, libc++), no exceptions or RTTI, or asked for
_INLINE_FLAGS = ("-fsanitize", "-D_GLIBCXX", "-U_GLIBCXX", "-D_LIBCPP", "-stdlib=", "-fno-exceptions",
                 "-fno-rtti", "-DOB_CORE_INLINE")
_loaded: Dict[str, int] = {}  # path -> dlopen handle, the core libraries this process loaded
_lock = threading.Lock()


def core_tag(headers: str, cxx_identity: str, python_abi: str) -> str:
    """The tag of the core built from headers of digest ``headers`` (headers.headers_digest) by this
    compiler for this Python (a C++ identifier: it names the symbols)."""
    return "obcore_" + digest_of([headers, cxx_identity, python_abi])[:16]


def uses_core(spec: BuildSpec) -> bool:
    """Whether a nanobind operator ``spec`` links to the core library: CPU C++ sources built with
    flags that keep the C++ ABI and no instrumentation; otherwise it compiles the core inline."""
    return spec.backend == "CPU" and not _inline_flags(spec.cflags)


def _inline_flags(flags: Sequence[str]) -> bool:
    return any(f.startswith(_INLINE_FLAGS) for f in flags)


def core_spec(root: Path, verbose: bool = False) -> BuildSpec:
    """The build of the core library from the installed headers, in the cache ``root``."""
    return BuildSpec(name=CORE_NAME, sources=(include_dir() / "opbuilder" / "core_lib.cpp",), backend="CPU",
                     kind="core", include_paths=(), cflags=(), cuda_cflags=(), ldflags=(), debug=False,
                     verbose=verbose, root=root)


def preload(library: Path) -> None:
    """Load the core library at ``library`` into the process's global symbol scope, once per file.
    Libraries of other tags may be loaded beside it: their symbols have other names."""
    path = str(library)
    if path in _loaded:
        return
    with _lock:
        if path not in _loaded:
            _loaded[path] = dlopen_global(path)


def dlopen_global(path: str) -> int:
    """dlopen ``path`` with RTLD_NOW | RTLD_GLOBAL (never closed); its handle. ``_ctypes.dlopen``, not
    ``ctypes.CDLL``: a CDLL object makes a class per library (~0.1 ms of a 2 ms warm load)."""
    try:
        import _ctypes
    except ImportError:  # an interpreter built without ctypes: then nothing here can load a library
        raise OSError(f"cannot load {path}: this Python has no _ctypes module") from None
    return _ctypes.dlopen(path, os.RTLD_NOW | os.RTLD_GLOBAL)

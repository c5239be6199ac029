"""Generated C++ -> a cached shared library -> the aot kernel ``ops.Custom`` calls.

The source is written to ``<cache>/hybrid/<symbol>-<hash>.cpp`` (its hash is
of its contents, so the file is written once per distinct kernel and kept as
the inspectable generated code) and built by ``opbuilder.build_library``,
which caches by content: a process that finds it built compiles nothing.
"""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from ..ops.aot_library import AotKernel, resolve_aot

__all__ = ["build_kernel", "source_path", "CFLAGS"]

# -fwrapv: integer overflow wraps, as numpy's does; -fno-math-errno: sqrt & co need no errno, so loops vectorize
CFLAGS = ("-fwrapv", "-fno-math-errno")


def source_path(symbol: str, text: str) -> Path:
    """Where the generated source of ``symbol`` with contents ``text`` is kept."""
    from opbuilder.cache_dir import cache_root, ensure_private_dir
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return ensure_private_dir(cache_root() / "hybrid") / f"{symbol}-{digest}.cpp"


def build_kernel(symbol: str, text: str) -> AotKernel:
    """Write (once) and build the source ``text``, and resolve ``symbol`` in the library."""
    path = source_path(symbol, text)
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        # the builder redoes a build whose inputs changed in the tick it started in; start in a later one
        time.sleep(0.02)
    from ..ops.aot_library import BuildOptions
    return resolve_aot(f"{path}:{symbol}", BuildOptions(cflags=list(CFLAGS)))

"""nanobind's shared runtime: built once per toolchain, loaded before every nanobind operator.

nanobind keeps its runtime (``src/nb_combined.cpp``: function dispatch, type casters' support,
the exception translators) in one library instead of compiling it into every module, which is
what makes a nanobind operator compile in about a second. It is built through the same pipeline
as an operator (keyed, locked, verified, published atomically; ``_nanobind.lib`` in the cache,
listed by ``cache list``, carried by ``build --into`` stores and bundles). Operators do not name
it in their binary (no path is baked in, so stores and bundles stay relocatable): it is loaded
with RTLD_GLOBAL before the first nanobind operator of a process is imported, and the
operator's undefined ``nanobind::detail`` symbols resolve to it.

It is compiled at ``-Os`` (``RUNTIME_OPT``), as nanobind's own CMake builds it, and without LTO.
It is on a newcomer's critical path: the first ``load()`` of a nanobind operator compiles it
beside the operator and the core library, three compiles on (say) 2 cores, so its CPU time is
what counts. nb_combined.cpp alone: -O2 -flto 1.8 s compile + 2.6 s CPU link, -Os -flto
1.7 s + 1.9 s, -Os 3.2 s. A fresh-cache first load of custom_src/function_ops.cpp, 2 shared
cores, 4 interleaved rounds: CPU 10.3 s (-O2 -flto) -> 9.1 s (-Os) against 9.5 s (-Os -flto);
the 1-element call of a nanobind operator stayed at 0.64-0.67 us (it was 0.64 us). Flags
are in the runtime's key (builder.py), so a runtime built with others is not reused.
"""
from __future__ import annotations

from pathlib import Path

from ..importer import RUNTIME_NAME, loaded_runtime as loaded, preload_runtime as preload
from ..spec import BuildSpec
from ..tools.toolchain import nanobind_info

__all__ = ["RUNTIME_NAME", "RUNTIME_OPT", "runtime_spec", "preload", "loaded"]  # loading it: importer.py

RUNTIME_OPT = "-Os"  # upstream's choice; see above


def runtime_spec(root: Path, verbose: bool = False) -> BuildSpec:
    """The build of nanobind's runtime for the installed nanobind, in the cache ``root``."""
    nb = nanobind_info(root)
    return BuildSpec(name=RUNTIME_NAME, sources=(Path(nb.source) / "nb_combined.cpp",), backend="CPU",
                     kind="runtime", include_paths=(), cflags=(), cuda_cflags=(), ldflags=(), debug=False,
                     verbose=verbose, root=root)

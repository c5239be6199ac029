"""nanobind's shared runtime: built once per toolchain, loaded before every nanobind operator.

nanobind keeps its runtime (``src/nb_combined.cpp``: function dispatch, type casters' support,
the exception translators) in one library instead of compiling it into every module, which is
what makes a nanobind operator compile in about a second. It is built through the same pipeline
as an operator (keyed, locked, verified, published atomically; ``_nanobind.lib`` in the cache,
listed by ``cache list``, carried by ``build --into`` stores and bundles). Operators do not name
it in their binary (no path is baked in, so stores and bundles stay relocatable): it is loaded
with RTLD_GLOBAL before the first nanobind operator of a process is imported, and the
operator's undefined ``nanobind::detail`` symbols resolve to it.
"""
from __future__ import annotations

from pathlib import Path

from .needs import RUNTIME_NAME, loaded_runtime as loaded, preload_runtime as preload
from .spec import BuildSpec
from .toolchain import nanobind_info

__all__ = ["RUNTIME_NAME", "runtime_spec", "preload", "loaded"]  # loading it: needs.py (the warm path)


def runtime_spec(root: Path, verbose: bool = False) -> BuildSpec:
    """The build of nanobind's runtime for the installed nanobind, in the cache ``root``."""
    nb = nanobind_info(root)
    return BuildSpec(name=RUNTIME_NAME, sources=(Path(nb.source) / "nb_combined.cpp",), backend="CPU",
                     kind="runtime", include_paths=(), cflags=(), cuda_cflags=(), ldflags=(), debug=False,
                     verbose=verbose, root=root)

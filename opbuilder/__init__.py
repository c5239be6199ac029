"""opbuilder: build C++/CUDA tensor operators on first use and load them.

``CustomOpBuilder(name, sources, backend="CPU").load()`` compiles the sources
(once; cached by content) into a Python extension module (nanobind, or pybind11
for ``PYBIND11_MODULE`` sources) written against the C++ API in
``opbuilder/extension.h``, and returns it. See docs/builder.md.

This package is the builder, the bottom layer: it never imports ``runtime``.
``to_torch`` and ``to_jax`` live in ``opbuilder.bridges``, a layer above the
runtime; they are handed out here when first asked for (PEP 562).

``CustomOpBuilder`` is defined here, not in a module of its own (``opbuilder.custom_op`` still gives
it): ``import opbuilder`` is then this package and spec.py, and every module a new process imports
costs ~0.3 M instructions (~0.15 ms) before its first line runs, a tenth of a shipped load's budget
(issue 35). What it needs to look for a build is imported by ``load()`` when it runs: a shipped
binary's check (importer.py) when a wheel's record is beside the sources, the warm record's (warm.py)
otherwise, and the build pipeline (builder.py) when something must be looked up in full or built.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .spec import cache_root, find_record, make_spec, no_build, verbose_requested

from types import ModuleType  # (imported by site already: load()'s hints resolve, typing.get_type_hints)

if TYPE_CHECKING:  # typing names and aliases made at import cost every new process tens of microseconds
    import os
    from typing import Any, List, Optional, Sequence, Union

    PathLike = Union[str, os.PathLike]

# to_torch and to_jax are not in __all__: `from opbuilder import *` would import torch and jax (and fail
# where either is missing); they are public as opbuilder.to_torch and opbuilder.to_jax
__all__ = ["CustomOpBuilder", "build_library", "BuildError", "BuildTimeout", "ToolchainError", "UnsafeCacheDirError",
           "include_dir", "load", "load_inline", "Spec", "Inline", "load_many", "LoadResult", "Diagnostic"]
__version__ = "0.1.0"


# name -> the module that defines it, imported when the name is first asked for
_LAZY = {"BuildError": ".errors", "BuildTimeout": ".errors", "ToolchainError": ".errors",
         "UnsafeCacheDirError": ".errors", "NoBuildError": ".errors", "build_library": ".builder",
         "include_dir": ".native.headers", "load_inline": ".inline", "Spec": ".bridges.interop_common",
         "to_torch": ".bridges.interop_torch", "to_jax": ".bridges.interop_jax", "Inline": ".inline",
         "load_many": ".many", "LoadResult": ".many", "Diagnostic": ".compile.diagnostics",
         "_torch_tensor_seen": ".bridges.torch_bridge"}  # called by the core library (dlpack_exchange.h)
_EXTRAS = {"to_torch": "torch", "to_jax": "jax"}  # the optional package (and pip extra) each one needs


def __getattr__(name: str) -> Any:
    """The error classes, ``build_library`` (the build pipeline), ``include_dir``, ``load_inline``
    (hashlib's OpenSSL), ``Spec`` (the bridges' shape records), ``to_torch`` (torch and the runtime) and
    ``to_jax`` (jax and the runtime), and ``_torch_tensor_seen`` (what the core library calls to ask for
    to_torch's C++ bridge: bridges/torch_bridge.py) import their modules on first use: a process that only loads
    shipped operators never needs them, and one that loads built ones imports the pipeline in its first
    ``load()`` (PEP 562)."""
    if name in _LAZY:
        import importlib
        try:
            module = importlib.import_module(_LAZY[name], __name__)
        except ModuleNotFoundError as e:
            extra = _EXTRAS.get(name)
            if extra is None or e.name != extra:
                raise
            raise ModuleNotFoundError(f"opbuilder.{name} needs {extra}, which is not installed: "
                                      f"python -m pip install 'opbuilder[{extra}]'", name=extra) from None
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_LAZY))


def load(name, sources, **kwargs):
    """Shorthand for ``CustomOpBuilder(name, sources, **kwargs).load()``."""
    return CustomOpBuilder(name, sources, **kwargs).load()


__all__.append("NoBuildError")  # shipping: docs/shipping.md


# CustomOpBuilder's arguments after name and sources, in its order (load_inline and Inline pass them on)
BUILDER_KEYWORDS = ("backend", "include_paths", "cflags", "ldflags", "cuda_cflags", "cuda_arch", "build_dir",
                    "debug_mode", "verbose", "binding")


class CustomOpBuilder:
    """Build C++ (or CUDA) sources into a Python extension module, on first use, and load it.

    ``CustomOpBuilder("my_ops", ["ops.cpp"]).load()`` returns the module. The first call compiles
    (seconds); later ones, in any process, import the cached library (about a millisecond, no
    subprocess). Editing a source, or a header it includes, makes the next ``load()`` build again and
    return the new code. The module is bound with nanobind (``OB_MODULE``) or pybind11
    (``PYBIND11_MODULE``), as the sources say.

    Args:
        name: the module's name, a Python identifier (ASCII, at most 100 characters). The sources'
            ``OB_MODULE`` / ``PYBIND11_MODULE(OB_EXTENSION_NAME, m)`` gets it; the cache keeps one
            directory per name.
        sources: a path, or a list of paths, of C++ sources (``.cpp``, ``.cc``, ``.cxx``, ``.c++``,
            ``.C``); with ``backend="GPU"`` also CUDA sources (``.cu``). Relative paths are read
            against the current directory.
        backend: ``"CPU"`` (the host compiler: g++ or clang++) or ``"GPU"`` (nvcc for ``.cu``, the
            host compiler for the rest); any other value is a ``ValueError`` that lists these two.
        include_paths: extra directories to search for headers (``-I``); opbuilder's own headers
            (``#include "opbuilder/extension.h"``) are always found.
        cflags: extra flags for the C++ compiler, a list or one string split on spaces (relative
            paths in ``-I``, ``-isystem``, ``-include`` ... are made absolute). A flag that changes
            every struct's layout (``-fpack-struct``...) is a ``ValueError``.
        ldflags: extra flags for the link (``-L``, ``-l``, libraries and objects by path).
        build_dir: the cache directory to build in and load from; default ``OPBUILDER_CACHE_DIR``,
            else ``~/.cache/opbuilder``. A directory other users can write to is refused
            (``UnsafeCacheDirError``).
        debug_mode: compile with ``-O0 -g`` instead of ``-O2`` (a separate build, cached apart).
        verbose: print each command the build runs (also ``OPBUILDER_VERBOSE=1``); otherwise one
            progress line while compiling, and nothing on the warm path.
        cuda_cflags: (keyword) extra flags for nvcc, for ``.cu`` sources.
        cuda_arch: (keyword) the GPU architectures to compile ``.cu`` sources for, as
            ``OPBUILDER_CUDA_ARCH_LIST`` takes them (``"8.0"``, ``"8.6;9.0+PTX"``, ``"Hopper"``); no GPU
            is needed to compile then. Default: that variable, else the visible GPUs, else 8.0 with PTX.
        binding: (keyword) ``"nanobind"`` or ``"pybind11"``; default None: read from the sources.

    Everything that decides the binary (the sources' and included headers' contents, flags,
    backend, compiler and its version, Python's ABI) is in the cache key, never modification times.
    A failed compile raises ``BuildError`` (a ``RuntimeError``) naming the operator and showing the
    compiler's first errors; no compiler found, ``ToolchainError``; an unknown keyword, ``TypeError``.
    """

    def __init__(self, name: str, sources: Union[PathLike, Sequence[PathLike]], backend: str = "CPU",
                 include_paths: Optional[Sequence[PathLike]] = None, cflags: Optional[Sequence[str]] = None,
                 ldflags: Optional[Sequence[str]] = None, build_dir: Optional[PathLike] = None,
                 debug_mode: bool = False, verbose: bool = False, **kwargs) -> None:
        cuda_cflags = kwargs.pop("cuda_cflags", None)
        binding = kwargs.pop("binding", None)
        if "cuda_arch" in kwargs:  # "8.0;9.0+PTX": -gencode flags, so nvcc needs no GPU to ask (cuda_arch.py)
            from .tools.cuda_arch import option_flags
            cuda_cflags = option_flags(kwargs.pop("cuda_arch"), cuda_cflags)
        if kwargs:
            raise TypeError(f"CustomOpBuilder got unexpected keyword argument(s) {', '.join(sorted(kwargs))}; "
                            f"accepted: name, sources, {', '.join(BUILDER_KEYWORDS)}")
        try:
            self.spec = make_spec(name, sources, backend, "module", include_paths, cflags, cuda_cflags, ldflags,
                                  debug_mode, verbose_requested(verbose), cache_root(build_dir), binding)
        except FileNotFoundError as e:
            if not no_build():
                raise
            # production (a wheel whose sources were deleted): nothing can be loaded or built, say so as
            # every other "would have to be built" is said, naming the operator and the fix
            from .errors import NoBuildError
            raise NoBuildError(name, f"{e}, and a shipped binary is used only when the sources it was built "
                                     f"from are there to check it against (its wheel ships them)") from None
        if self.spec.cflags or self.spec.cuda_cflags:  # no flags, nothing to check (and nothing imported)
            from .native.core_lib import check_layout_flags
            check_layout_flags(self.spec)
        self.name = name

    def build(self) -> str:
        """Build if needed (with nanobind's shared runtime, for a nanobind operator); the path of the
        shared library."""
        from .builder import build_module
        return build_module(self.spec)

    def core_library(self) -> Optional[str]:
        """The path of the core library this operator loads (built if needed; core_lib.py), or None
        for an operator that compiles the core itself (pybind11, sanitizers, CUDA)."""
        from .builder import _core_for
        lib = _core_for(self.spec)
        return None if lib is None else str(lib)

    def runtime_library(self) -> Optional[str]:
        """The path of nanobind's shared runtime this operator loads (built if needed), or None for
        an operator bound with pybind11."""
        from .builder import _runtime_for
        rt = _runtime_for(self.spec)
        return None if rt is None else str(rt)

    def load(self) -> ModuleType:
        """The module for the sources as they are now (the same object if unchanged): the binary a wheel
        ships for them when it fits (importer.shipped_module: no compiler, no process, no cache write), else the
        cache's build (its warm record: warm.py), else built (builder.py, imported only then)."""
        record = find_record(self.spec.sources)
        if record is not None or no_build():
            from .importer import shipped_module  # the check and the load: no other module (issue 35)
            mod = shipped_module(self.spec, record, _installed)
            if mod is None:
                from .cache.shipped import built_instead  # says why, or builds
                mod = built_instead(self.spec, self._built)
            return mod
        return self._built()

    def _built(self) -> ModuleType:
        from .warm import module
        mod = module(self.spec)  # its warm record, if nothing it depends on changed (a few dozen stats)
        if mod is not None:
            return mod
        from .builder import load_module
        return load_module(self.spec)


# importlib.reload(opbuilder) keeps the class of the first import: builders made before a reload stay
# instances of opbuilder.CustomOpBuilder, and modules that took the class (many.py) keep accepting them
CustomOpBuilder = globals().get("_first_class") or CustomOpBuilder
_first_class = CustomOpBuilder


def _installed() -> ModuleType:
    """opbuilder.native.installed, imported only when a shipped load needs it (the installed runtime's
    owned record does not do): importer.py cannot import it, which imports importer.py."""
    from .native import installed
    return installed

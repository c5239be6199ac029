"""opbuilder: build C++/CUDA tensor operators on first use and load them.

``CustomOpBuilder(name, sources, backend="CPU").load()`` compiles the sources
(once; cached by content) into a Python extension module (nanobind, or pybind11
for ``PYBIND11_MODULE`` sources) written against the C++ API in
``opbuilder/extension.h``, and returns it. See docs/builder.md.

This package is the builder, the bottom layer: it never imports ``runtime``.
``to_torch`` and ``to_jax`` live in ``opbuilder.bridges``, a layer above the
runtime; they are handed out here when first asked for (PEP 562).
"""
from typing import Any, List

from .custom_op import CustomOpBuilder

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
         "load_many": ".many", "LoadResult": ".many", "Diagnostic": ".compile.diagnostics"}
_EXTRAS = {"to_torch": "torch", "to_jax": "jax"}  # the optional package (and pip extra) each one needs


def __getattr__(name: str) -> Any:
    """The error classes, ``build_library`` (the build pipeline), ``include_dir``, ``load_inline``
    (hashlib's OpenSSL), ``Spec`` (the bridges' shape records), ``to_torch`` (torch and the runtime) and
    ``to_jax`` (jax and the runtime) import their modules on first use: a process that only loads
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

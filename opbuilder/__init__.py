"""opbuilder: build C++/CUDA tensor operators on first use and load them.

``CustomOpBuilder(name, sources, backend="CPU").load()`` compiles the sources
(once; cached by content) into a pybind11 module written against the C++ API
in ``opbuilder/extension.h`` and returns it. See docs/builder.md.
"""
from typing import Any, Callable, Dict, Optional

from .builder import CustomOpBuilder, build_library
from .errors import BuildError, ToolchainError, UnsafeCacheDirError
from .headers import include_dir

__all__ = ["CustomOpBuilder", "build_library", "BuildError", "ToolchainError", "UnsafeCacheDirError", "include_dir",
           "load", "load_inline", "to_torch", "to_jax", "Spec"]
__version__ = "0.1.0"


_LAZY = {"load_inline": ".inline", "Spec": ".interop_common"}


def __getattr__(name: str) -> Any:
    """``load_inline`` (hashlib's OpenSSL) and ``Spec`` (the interop shape records) import their modules
    on first use: a process that only loads built operators never needs them (PEP 562)."""
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load(name, sources, **kwargs):
    """Shorthand for ``CustomOpBuilder(name, sources, **kwargs).load()``."""
    return CustomOpBuilder(name, sources, **kwargs).load()


def to_torch(module: Any, shape_fn: Optional[Dict[str, Callable]] = None, backend: str = "CPU",
             mutates: Optional[Dict[str, Any]] = None) -> Any:
    """``module``'s functions as PyTorch operators; imports torch (see docs/interop.md)."""
    from .bridges.interop_torch import to_torch as _to_torch
    return _to_torch(module, shape_fn=shape_fn, backend=backend, mutates=mutates)


def to_jax(module: Any, shape_fn: Optional[Dict[str, Callable]] = None,
           mutates: Optional[Dict[str, Any]] = None) -> Any:
    """``module``'s functions as JAX functions; imports jax (see docs/interop.md)."""
    from .bridges.interop_jax import to_jax as _to_jax
    return _to_jax(module, shape_fn=shape_fn, mutates=mutates)

"""Backends by name: the built-in ``ms_backend``, Python ones, C++ plugins.

A backend is a factory ``factory(graph, config) -> run`` where ``run(inputs)``
takes the graph's input tensors and returns its output tensors; ``config``
holds ``jit_level`` and the options given to ``jit``. A backend that declares
``differentiable=False`` is used only when no gradient is being recorded; a
call that records one runs on ``ms_backend`` instead.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Sequence

from .graph import Graph

__all__ = ["Backend", "register_backend", "list_backends", "get_backend"]

Runner = Callable[[Sequence[Any]], List[Any]]
Factory = Callable[[Graph, Dict[str, Any]], Runner]


@dataclass(frozen=True)
class Backend:
    name: str
    factory: Factory
    differentiable: bool = True
    origin: str = "python"  # "builtin", "python" or the path of a plugin library


_backends: Dict[str, Backend] = {}
_lock = threading.Lock()


def _add(backend: Backend) -> None:
    with _lock:
        if backend.name in _backends:
            raise ValueError(f"a backend named {backend.name!r} is already registered "
                             f"(from {_backends[backend.name].origin}); choose another name")
        _backends[backend.name] = backend


def register_backend(name: str, factory: Factory, *, differentiable: bool = True) -> None:
    """Register a backend written in Python: ``factory(graph, config)`` returns ``run(inputs) -> outputs``.

    ``differentiable=False`` says its ``run`` records no gradient; calls that
    need one then run on ``ms_backend``.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"backend name must be a non-empty str, got {name!r}")
    if not callable(factory):
        raise TypeError(f"backend {name!r}: factory must be callable (factory(graph, config) -> run), "
                        f"got {type(factory).__name__}")
    _add(Backend(name, factory, bool(differentiable), "python"))


def list_backends() -> List[str]:
    """The names of the registered backends, in registration order."""
    with _lock:
        return list(_backends)


def get_backend(name: str) -> Backend:
    """The backend called ``name``; a ValueError listing the registered ones when there is none."""
    b = _backends.get(name)
    if b is None:
        raise ValueError(f"unknown backend {name!r}; registered backends: {', '.join(_backends)} "
                         f"(add one with runtime.graph.register_backend or register_custom_backend)")
    return b

"""The autograd engine: grad mode, graph nodes, the backward pass.

Ops import ``grad_mode`` and ``node`` while ``import runtime`` runs; the engine and ``Function``
(which a first op call does not need) import on first use through ``__getattr__`` (PEP 562).
"""
from importlib import import_module
from typing import Any, Dict

from .grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .node import Node

# name -> submodule defining it; the submodules themselves ("engine" ...) are lazy attributes too
LAZY_NAMES: Dict[str, str] = {"backward": "engine", "grad": "engine", "Function": "function",
                              "FunctionCtx": "function", "once_differentiable": "function",
                              "saved_tensors_hooks": "saved_hooks"}
LAZY_MODULES = ("engine", "function", "functional", "gradcheck", "callback", "saved_hooks")


def __getattr__(name: str) -> Any:
    if name in LAZY_NAMES:
        value = getattr(import_module(f"{__name__}.{LAZY_NAMES[name]}"), name)
    elif name in LAZY_MODULES:
        value = import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = ["backward", "grad", "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled", "Node",
           "Function", "FunctionCtx", "once_differentiable", "saved_tensors_hooks"]

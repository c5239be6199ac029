"""Graphs captured by ``runtime.jit`` and the backends that run them.

``Graph`` (graph.py) is what a trace recorded; ``register_backend`` /
``list_backends`` (registry.py) name the backends; ``ms_backend`` (built in)
runs a graph with the runtime's kernels and, at ``jit_level="O1"``, with
fused C++ kernels; ``register_custom_backend`` (plugin.py) loads a backend
written in C++ against ``mindspore/include/custom_backend_api.h`` or
``opbuilder/backend.h``. See docs/jit.md.
"""
from .graph import Const, Graph, Input, Node, Output  # noqa: F401
from .registry import get_backend, list_backends, register_backend  # noqa: F401
from . import ms_backend  # noqa: F401  (registers "ms_backend")
from .plugin import register_custom_backend  # noqa: F401

__all__ = ["Graph", "Node", "Input", "Const", "Output", "register_backend", "list_backends",
           "get_backend", "register_custom_backend"]

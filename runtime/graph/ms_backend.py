"""The built-in backend, ``ms_backend``.

``O0`` runs the graph node by node with the runtime's own kernels (the
recorded targets), so autograd records each op as it would eagerly. ``O1``
first replaces runs of elementwise/broadcast nodes by generated C++ kernels
(fusion.py, kernel_source.py, fused_op.py), then runs the result the same way.
"""
from __future__ import annotations

from typing import Any, Dict

from .graph import Graph
from .registry import Backend, Runner, _add
from .runner import make_runner

__all__ = ["build"]

from ..jit import JIT_LEVELS


def build(graph: Graph, config: Dict[str, Any]) -> Runner:
    """A runner for ``graph`` at ``config["jit_level"]`` (``O0`` when absent)."""
    level = config.get("jit_level", "O0")
    if level == "O1":
        from .fusion import fuse
        graph = fuse(graph)
    elif level != "O0":
        raise ValueError(f"ms_backend: jit_level {level!r} is not one of {', '.join(JIT_LEVELS)}")
    return make_runner(graph)


_add(Backend("ms_backend", build, True, "builtin"))

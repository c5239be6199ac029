"""What the inliner and the Python target know of DSL functions, below kernel.py.

``DslKernel`` is the base of ``HybridKernel``: the inliner recognises a ``@kernel`` callee by it and
takes its ``func``, without importing kernel.py (which imports the inliner). ``Callee`` is one called
DSL function, as inline.py finds it and pytarget.py runs it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict

__all__ = ["Callee", "DslKernel"]


class DslKernel:
    """A DSL function marked ``@kernel``: ``func`` is the plain Python function (set by the subclass)."""

    func: Callable[..., Any]


@dataclass
class Callee:
    """A DSL function a kernel calls (by name), with the DSL functions it calls in turn."""

    func: Callable[..., Any]
    calls: Dict[str, "Callee"] = field(default_factory=dict)

"""``JitFunction``: a function (or Cell method) run through a captured graph.

A call computes its signature (signature.py); the first call with a
signature traces the function (tracer.py) and has the backend build the
graph; every later call with it runs the built graph, tracing and building
nothing. Called while another trace is recording, a jitted function is
inlined into that trace.
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..autograd.grad_mode import _state, no_grad
from ..graph.graph import Const, Graph
from ..graph.registry import Backend, Runner, get_backend
from ..tensor import Tensor
from .signature import flatten_result, signature, unflatten_result
from .tracer import Tracer
from .tracing import hook

__all__ = ["JitFunction", "CAPTURE_MODES"]



@dataclass
class _Entry:
    graph: Graph
    run: Runner
    out_spec: Any
    grad_consts: bool  # a captured tensor (a Parameter, say) requires grad
    fallback: Optional[Runner] = None  # ms_backend O0, for a backend that cannot differentiate
    calls: int = field(default=0)


class JitFunction:
    """What ``jit(fn)`` returns: callable like ``fn``, with one built graph per signature."""

    def __init__(self, fn: Callable[..., Any], backend: str, config: Dict[str, Any]) -> None:
        self.fn = fn
        self.backend: Backend = get_backend(backend)
        self.config = config
        self._cache: Dict[Tuple[Any, ...], _Entry] = {}
        self._lock = threading.Lock()
        self.traces = 0  # how many times the function was traced (one per new signature)
        functools.update_wrapper(self, fn)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return functools.partial(self, obj)  # a Cell method: the instance is part of the signature

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if hook.tracer is not None:  # inside another trace: inline
            return self.fn(*args, **kwargs)
        key, tensors = signature(args, kwargs)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._build(key, tensors, args, kwargs)
        run = entry.run
        if entry.fallback is not None and _state.enabled and (entry.grad_consts or any(
                t.requires_grad for t in tensors)):
            run = entry.fallback
        entry.calls += 1
        outs = run(tensors)
        spec = entry.out_spec
        if type(spec) is int:
            return outs[spec]
        return unflatten_result(spec, outs)

    def graph(self, *args: Any, **kwargs: Any) -> Graph:
        """The graph for this signature as its backend runs it (traced and built now if it was not)."""
        key, tensors = signature(args, kwargs)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._build(key, tensors, args, kwargs)
        return entry.graph

    def _build(self, key: Tuple[Any, ...], tensors: List[Tensor], args: Tuple[Any, ...],
               kwargs: Dict[str, Any]) -> _Entry:
        with self._lock:
            entry = self._cache.get(key)
            if entry is not None:
                return entry
            name = getattr(self.fn, "__qualname__", "graph")
            tracer = Tracer(tensors, name)
            with no_grad(), tracer:
                out = self.fn(*args, **kwargs)
            leaves: List[Any] = []
            spec = flatten_result(out, leaves)
            graph = tracer.finish(leaves)
            self.traces += 1
            run = self.backend.factory(graph, dict(self.config))
            grad_consts = any(isinstance(r, Const) and isinstance(r.value, Tensor) and r.value.requires_grad
                              for n in graph.nodes for r in n.inputs)
            fallback = None
            if not self.backend.differentiable:
                from ..graph.ms_backend import build
                fallback = build(graph, {"jit_level": "O0"})
            entry = _Entry(getattr(run, "graph", graph), run, spec, grad_consts, fallback)
            self._cache[key] = entry
            return entry

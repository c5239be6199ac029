"""Straight-line Python for a graph: one call per node, no interpreter loop.

``make_runner(graph)`` writes the graph as a Python function (``v3 =
t3(inputs[0], v2)``...) and compiles it once, so a cached jitted call costs
about what calling the same ops by hand costs.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence

from .graph import Const, Graph, Input, Ref

__all__ = ["make_runner"]


def make_runner(graph: Graph) -> Callable[[Sequence[Any]], List[Any]]:
    """A function ``run(inputs) -> outputs`` that runs ``graph``'s nodes with their own targets."""
    ns: Dict[str, Any] = {}
    multi = {n.id for n in graph.nodes if n.multi}

    def name(r: Ref) -> str:
        if isinstance(r, Input):
            return f"inputs[{r.index}]"
        if isinstance(r, Const):
            key = f"c{len(ns)}"
            ns[key] = r.value
            return key
        return f"v{r.node}[{r.index}]" if r.node in multi else f"v{r.node}"

    lines = ["def run(inputs):"]
    for n in graph.nodes:
        ns[f"t{n.id}"] = n.target
        args = [name(r) for r in n.inputs]
        if n.attrs:
            ns[f"k{n.id}"] = n.attrs
            args.append(f"**k{n.id}")
        lines.append(f"    v{n.id} = t{n.id}({', '.join(args)})")
    lines.append(f"    return [{', '.join(name(r) for r in graph.outputs)}]")
    exec(compile("\n".join(lines), f"<jit {graph.name}>", "exec"), ns)  # noqa: S102 (our own text)
    run = ns["run"]
    run.graph = graph  # what it runs (after a backend's rewrites), for JitFunction.graph
    return run

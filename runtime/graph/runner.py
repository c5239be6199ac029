"""Straight-line Python for a graph: one call per node, no interpreter loop.

``make_runner(graph)`` writes the graph as a Python function (``v3 =
t3(inputs[0], v2)``...) and compiles it once, so a cached jitted call costs
about what calling the same ops by hand costs. Each value is dropped
(``del``) right after its last use, as it would be eagerly: holding every
intermediate until the end makes each op take fresh memory (page faults on
every large array) and costs more than the ops themselves.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence

from .graph import Const, Graph, Input, Output, Ref

__all__ = ["make_runner"]


def _last_uses(graph: Graph) -> Dict[int, List[int]]:
    """Per node position, the node ids whose values are used for the last time there (outputs: never)."""
    last: Dict[int, int] = {}
    for pos, n in enumerate(graph.nodes):
        last[n.id] = pos  # a value nobody uses dies where it is made
        for r in n.inputs:
            if isinstance(r, Output):
                last[r.node] = pos
    for r in graph.outputs:
        if isinstance(r, Output):
            last.pop(r.node, None)
    dying: Dict[int, List[int]] = {}
    for node_id, pos in last.items():
        dying.setdefault(pos, []).append(node_id)
    return dying


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

    dying = _last_uses(graph)
    lines = ["def run(inputs):"]
    for pos, n in enumerate(graph.nodes):
        ns[f"t{n.id}"] = n.target
        args = [name(r) for r in n.inputs]
        if n.attrs:
            ns[f"k{n.id}"] = n.attrs
            args.append(f"**k{n.id}")
        lines.append(f"    v{n.id} = t{n.id}({', '.join(args)})")
        if pos in dying:
            lines.append("    del " + ", ".join(f"v{i}" for i in sorted(dying[pos])))
    lines.append(f"    return [{', '.join(name(r) for r in graph.outputs)}]")
    source = "\n".join(lines)
    exec(compile(source, f"<jit {graph.name}>", "exec"), ns)  # noqa: S102 (our own text)
    run = ns["run"]
    run.graph = graph  # what it runs (after a backend's rewrites), for JitFunction.graph
    run.source = source  # the generated text, for tests and debugging
    return run

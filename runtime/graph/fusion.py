"""O1's fusion pass: runs of elementwise/broadcast nodes become one fused node each.

A node can fuse when it is a built-in elementwise op (kernel_source.OPS) on
float32 or float64 tensors of one dtype. A group is a run of such nodes that
are consecutive in the graph's (topological) order and share one output shape,
so putting the fused node where the run was keeps the order valid. The node
right after a run may join it when it is a sum or mean of one of the run's
values over the last axis or over all axes: the kernel reduces in the same
loop (``reduction``). Groups of
one node are left alone (fusing them saves nothing). The fused node's target
is a generated C++ kernel (fused_op.py); the nodes it replaces are kept in
``node.sub`` and give its gradient.
"""
from __future__ import annotations

from typing import Dict, List, Set, Tuple

import numpy as np

from .graph import Const, Graph, Input, Node, Output, Ref
from .kernel_source import MAX_DIMS, OPS, REDUCTIONS

__all__ = ["fuse", "fusible", "reduction"]

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _dtype_of(graph: Graph, r: Ref, nodes: Dict[int, Node]):
    if isinstance(r, Input):
        return graph.input_dtypes[r.index]
    if isinstance(r, Const):
        data = getattr(r.value, "_data", None)
        return None if data is None else data.dtype
    return nodes[r.node].out_dtypes[r.index]


def fusible(graph: Graph, node: Node, nodes: Dict[int, Node]) -> bool:
    """Whether ``node`` is a built-in elementwise op on floating tensors of one dtype."""
    if node.kind != "primitive" or node.op not in OPS or node.attrs or len(node.out_dtypes) != 1:
        return False
    if len(node.out_shapes[0]) > MAX_DIMS:  # past the generated kernel's loop nest: the runtime's op runs it
        return False
    dt = node.out_dtypes[0]
    return dt in _FLOATS and all(_dtype_of(graph, r, nodes) == dt for r in node.inputs)


def reduction(node: Node, run: List[Node]) -> str:
    """``"last"`` or ``"all"`` when ``node`` is a sum/mean of a value of ``run`` over its last axis or all
    axes (so it can end the run's kernel), else ``""``."""
    if not run or node.kind != "primitive" or node.op not in REDUCTIONS or len(node.inputs) != 1:
        return ""
    r = node.inputs[0]
    shape = run[0].out_shapes[0]
    if not isinstance(r, Output) or r.node not in {m.id for m in run} or node.out_dtypes[0] != run[0].out_dtypes[0]:
        return ""
    if set(node.attrs) - {"axis", "keepdims"} or not shape:
        return ""
    axis = node.attrs.get("axis")
    if axis is None or tuple(axis) == tuple(range(len(shape))):
        return "all"
    return "last" if tuple(axis) == (len(shape) - 1,) else ""


def _groups(graph: Graph) -> List[List[Node]]:
    nodes = {n.id: n for n in graph.nodes}
    used = _uses(graph)
    groups: List[List[Node]] = []
    run: List[Node] = []
    for n in graph.nodes:
        if fusible(graph, n, nodes) and (not run or (run[0].out_shapes[0] == n.out_shapes[0]
                                                     and run[0].out_dtypes[0] == n.out_dtypes[0])):
            run.append(n)
            continue
        # a trailing sum/mean ends the run inside its kernel, if something uses it: the kernel writes the
        # reduction to its last output, which for an unused one would be another output's memory
        if reduction(n, run) and used.get(n.id):
            groups.append(run + [n])
            run = []
            continue
        groups.append(run)
        run = [n] if fusible(graph, n, nodes) else []
    groups.append(run)
    return [g for g in groups if len(g) > 1]


def _uses(graph: Graph) -> Dict[int, Set[int]]:
    """node id -> ids of the nodes that use one of its outputs (-1: a graph output)."""
    users: Dict[int, Set[int]] = {}
    for n in graph.nodes:
        for r in n.inputs:
            if isinstance(r, Output):
                users.setdefault(r.node, set()).add(n.id)
    for r in graph.outputs:
        if isinstance(r, Output):
            users.setdefault(r.node, set()).add(-1)
    return users


def _subgraph(graph: Graph, group: List[Node], users: Dict[int, Set[int]]) -> Tuple[Graph, List[Ref], List[int]]:
    """The group as a graph of its own: (subgraph, its inputs in the outer graph, outer ids of its outputs)."""
    ids = {n.id for n in group}
    outer_inputs: List[Ref] = []
    index: Dict[object, int] = {}
    renum = {n.id: k for k, n in enumerate(group)}
    sub = Graph([], [], name=f"fused{group[0].id}")
    for n in group:
        inputs: List[Ref] = []
        for r in n.inputs:
            if isinstance(r, Output) and r.node in ids:
                inputs.append(Output(renum[r.node], 0))
                continue
            k = index.get(id(r.value) if isinstance(r, Const) else r)
            if k is None:
                k = len(outer_inputs)
                index[id(r.value) if isinstance(r, Const) else r] = k
                outer_inputs.append(r)
                data = r.value._data if isinstance(r, Const) else None
                shape = data.shape if data is not None else (
                    graph.input_shapes[r.index] if isinstance(r, Input) else
                    graph.nodes[r.node].out_shapes[r.index])  # type: ignore[union-attr]
                sub.input_shapes.append(tuple(shape))
                sub.input_dtypes.append(n.out_dtypes[0])
            inputs.append(Input(k))
        sub.nodes.append(Node(renum[n.id], n.op, n.kind, n.target, inputs, dict(n.attrs), n.out_shapes,
                              n.out_dtypes))
    out_ids = [n.id for n in group if users.get(n.id, set()) - ids]
    sub.outputs = [Output(renum[i], 0) for i in out_ids]
    return sub, outer_inputs, out_ids


def fuse(graph: Graph) -> Graph:
    """A copy of ``graph`` with each fusible run replaced by one fused node."""
    from .fused_op import fused_target
    groups = _groups(graph)
    if not groups:
        return graph
    users = _uses(graph)
    by_id = {n.id: n for n in graph.nodes}
    first = {g[0].id: g for g in groups}
    dropped = {n.id for g in groups for n in g}
    moved: Dict[Tuple[int, int], Ref] = {}
    out = Graph(graph.input_shapes, graph.input_dtypes, name=graph.name)
    new_id: Dict[int, int] = {}

    def remap(r: Ref) -> Ref:
        if isinstance(r, Output):
            if (r.node, r.index) in moved:
                return moved[(r.node, r.index)]
            return Output(new_id[r.node], r.index)
        return r

    for n in graph.nodes:
        if n.id in first:
            sub, ins, out_ids = _subgraph(graph, first[n.id], users)
            if not out_ids:  # nothing outside uses the run: it is dead code
                continue
            nid = len(out.nodes)
            target = fused_target(sub)
            shapes = [by_id[i].out_shapes[0] for i in out_ids]
            out.nodes.append(Node(nid, f"fused[{'+'.join(s.op for s in sub.nodes)}]", "fused", target,
                                  [remap(r) for r in ins], {}, shapes, [sub.nodes[0].out_dtypes[0]] * len(out_ids),
                                  multi=len(out_ids) > 1, sub=sub))
            for k, i in enumerate(out_ids):
                moved[(i, 0)] = Output(nid, k)
        elif n.id not in dropped:
            nid = len(out.nodes)
            new_id[n.id] = nid
            out.nodes.append(Node(nid, n.op, n.kind, n.target, [remap(r) for r in n.inputs], n.attrs,
                                  n.out_shapes, n.out_dtypes, n.multi, n.sub))
    out.outputs = [remap(r) for r in graph.outputs]
    return out

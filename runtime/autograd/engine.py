"""The backward pass: reverse topological order over recorded nodes.

One routine, ``run_backward``, serves both ``Tensor.backward`` (accumulate into
``.grad`` of every leaf) and ``grad`` (return gradients for given tensors,
leaves or not). Gradients flowing into an edge are summed; a gradient whose
shape the input broadcasts to is summed down to the input's shape; anything
else a node returns that does not fit its inputs is an error naming the node.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from . import grad_mode as _gm
from .node import Node

__all__ = ["backward", "grad", "run_backward"]


def _tensor_type():
    from ..tensor import Tensor
    return Tensor


def _ones_like(t) -> Any:
    return _tensor_type()._from_array(np.ones(t._data.shape, dtype=t._data.dtype))


def _zeros(meta) -> Any:
    shape, dtype = meta
    return _tensor_type()._from_array(np.zeros(shape, dtype=dtype))


def _accumulate(a, b):
    if a is None:
        return b
    from ..ops import math as m
    return m.add(a, b)


def _reduce_to(node, i: int, g, meta):
    """Check gradient ``g`` for argument ``i`` of ``node`` against its input."""
    Tensor = _tensor_type()
    if not isinstance(g, Tensor):
        if isinstance(g, np.ndarray):
            g = Tensor._from_array(g)
        else:
            raise TypeError(f"backward of {node.name} returned {type(g).__name__} for argument {i}; "
                            f"expected a Tensor or None")
    if meta is None:
        raise RuntimeError(f"backward of {node.name} returned a gradient for argument {i}, "
                           f"which is not a tensor")
    shape, dtype = meta
    gshape = g._data.shape
    if gshape != shape:
        from ..ops import math as m
        if not _broadcasts_to(shape, gshape):
            raise RuntimeError(f"backward of {node.name} returned a gradient of shape {list(gshape)} "
                               f"for argument {i}, whose shape is {list(shape)} (not a broadcast of it)")
        g = m.sum_to(g, shape)
    if g._data.dtype != dtype:
        if node.strict:
            raise TypeError(f"backward of {node.name} returned a gradient of dtype {g._data.dtype} "
                            f"for argument {i}, whose dtype is {dtype}")
        from ..ops import math as m
        from ..dtypes import from_numpy_dtype
        g = m.cast(g, from_numpy_dtype(dtype))
    return g


def _broadcasts_to(shape, target) -> bool:
    if len(shape) > len(target):
        return False
    for s, t in zip(reversed(shape), reversed(target)):
        if s != t and s != 1:
            return False
    return True


class _OnceDifferentiable(Node):
    """Stands behind gradients computed by a once-differentiable backward."""

    __slots__ = ("_what",)
    strict = True

    def __init__(self, what: str, sources: Sequence[Any]) -> None:
        self._what = what
        self.next_edges = tuple(sources)
        self.input_meta = tuple(None for _ in sources)
        self.out_meta = ()

    @property
    def name(self) -> str:  # type: ignore[override]
        return self._what

    def apply(self, grads, create_graph):
        raise RuntimeError(f"{self._what} is once-differentiable: its backward is C++ code that "
                           f"records no graph, so a higher-order gradient through it cannot be taken")


def _topo_order(roots: Sequence[Node]) -> List[Node]:
    """Nodes reachable from ``roots``, each after every node that feeds it grads."""
    order: List[Node] = []
    seen = set()
    for root in roots:
        if id(root) in seen:
            continue
        seen.add(id(root))
        stack = [(root, iter(root.next_edges))]
        while stack:
            node, it = stack[-1]
            for e in it:
                if type(e) is tuple:
                    child = e[0]
                    if id(child) not in seen:
                        seen.add(id(child))
                        stack.append((child, iter(child.next_edges)))
                        break
            else:
                stack.pop()
                order.append(node)
    order.reverse()
    return order


def run_backward(outputs: Sequence[Any], grad_outputs: Sequence[Any], targets: Optional[Sequence[Any]],
                 retain_graph: bool, create_graph: bool) -> Optional[List[Any]]:
    """Propagate ``grad_outputs`` from ``outputs`` back through the graph.

    ``targets is None``: accumulate into ``.grad`` of every leaf reached.
    Otherwise return one gradient (or ``None`` if unreached) per target tensor.
    """
    Tensor = _tensor_type()
    buffers: Dict[int, List[Any]] = {}
    leaf_grads: Dict[int, Any] = {}
    leaves: Dict[int, Any] = {}
    roots: List[Node] = []
    for out, g in zip(outputs, grad_outputs):
        node = out._node
        if node is None:
            if out.requires_grad:
                leaf_grads[id(out)] = _accumulate(leaf_grads.get(id(out)), g)
                leaves[id(out)] = out
            continue
        buf = buffers.get(id(node))
        if buf is None:
            buf = buffers[id(node)] = [None] * len(node.out_meta)
            roots.append(node)
        buf[out._out_index] = _accumulate(buf[out._out_index], g)

    # targets that are outputs of nodes: capture the grad arriving at (node, index)
    captured: Dict[tuple, Any] = {}
    target_nodes: Dict[int, List[int]] = {}
    target_leaf_ids = None
    if targets is not None:
        target_leaf_ids = set()
        for t in targets:
            if t._node is None:
                target_leaf_ids.add(id(t))
            else:
                target_nodes.setdefault(id(t._node), []).append(t._out_index)

    order = _topo_order(roots)
    needed = _needed(order, target_leaf_ids, target_nodes) if targets is not None else None

    with _gm.set_grad_enabled(create_graph):
        for node in order:
            buf = buffers.pop(id(node), None)
            if buf is None:
                continue
            idxs = target_nodes.get(id(node))
            if idxs:
                for k in idxs:
                    captured[(id(node), k)] = buf[k]
            if needed is not None and id(node) not in needed:
                continue
            if node.materialize_grads:
                buf = [_zeros(node.out_meta[k]) if g is None else g for k, g in enumerate(buf)]
            results = node.apply(buf, create_graph)
            if not retain_graph:
                node.release()
            edges = node.next_edges
            results = list(results) if results is not None else []
            if len(results) > len(edges):
                raise RuntimeError(f"backward of {node.name} returned {len(results)} gradients, "
                                   f"but its forward took {len(edges)} arguments")
            once = create_graph and not node.differentiable
            metas = node.input_meta
            for i, g in enumerate(results):
                e = edges[i]
                if g is None or e is None:
                    continue
                g = _reduce_to(node, i, g, metas[i])
                if once:
                    g = Tensor._from_array(g._data)
                    grad_sources = [(x._node, x._out_index) if x._node is not None else x
                                    for x in buf if x is not None and x.requires_grad]
                    if grad_sources:
                        g.requires_grad = True
                        g._node = _OnceDifferentiable(node.name, grad_sources)
                if type(e) is tuple:
                    child, k = e
                    cb = buffers.get(id(child))
                    if cb is None:
                        cb = buffers[id(child)] = [None] * len(child.out_meta)
                    cb[k] = _accumulate(cb[k], g)
                else:
                    if target_leaf_ids is not None and id(e) not in target_leaf_ids:
                        continue
                    leaf_grads[id(e)] = _accumulate(leaf_grads.get(id(e)), g)
                    leaves[id(e)] = e

    if targets is None:
        for key, g in leaf_grads.items():
            leaf = leaves[key]
            if not create_graph:
                g = Tensor._from_array(g._data)
            leaf.grad = g if leaf.grad is None else _accumulate(leaf.grad, g)
        return None
    result = []
    for t in targets:
        if t._node is None:
            result.append(leaf_grads.get(id(t)))
        else:
            result.append(captured.get((id(t._node), t._out_index)))
    return result


def _needed(order: List[Node], leaf_ids, target_nodes) -> set:
    """Ids of nodes whose backward must run to reach some target."""
    needed = set()
    for node in reversed(order):  # inputs before consumers
        for e in node.next_edges:
            if e is None:
                continue
            if type(e) is tuple:
                child, k = e
                if id(child) in needed or k in target_nodes.get(id(child), ()):
                    needed.add(id(node))
                    break
            elif id(e) in leaf_ids:
                needed.add(id(node))
                break
    return needed


def _as_grad(g, like):
    Tensor = _tensor_type()
    if g is None:
        return _ones_like(like)
    if isinstance(g, Tensor):
        return g
    return Tensor._from_array(np.asarray(g, dtype=like._data.dtype))


def backward(tensors: Sequence[Any], grad_tensors: Optional[Sequence[Any]] = None,
             retain_graph: bool = False, create_graph: bool = False) -> None:
    """Accumulate gradients of ``tensors`` into ``.grad`` of the leaves they depend on."""
    if grad_tensors is None:
        grad_tensors = [None] * len(tensors)
    for t, g in zip(tensors, grad_tensors):
        if not t.requires_grad:
            raise RuntimeError("backward() on a tensor that does not require grad and has no history; "
                               "mark an input with requires_grad_() before computing it")
        if g is None and t._data.size != 1:
            raise RuntimeError(f"backward() without a gradient needs a one-element output, got shape "
                               f"{list(t._data.shape)}; pass gradient=")
    gs = [_as_grad(g, t) for t, g in zip(tensors, grad_tensors)]
    run_backward(tensors, gs, None, retain_graph, create_graph)


def grad(outputs: Sequence[Any], inputs: Sequence[Any], grad_outputs: Optional[Sequence[Any]] = None,
         retain_graph: Optional[bool] = None, create_graph: bool = False,
         allow_unused: bool = True) -> List[Any]:
    """Gradients of ``outputs`` with respect to ``inputs`` (``None`` where unreached)."""
    outputs = list(outputs)
    if grad_outputs is None:
        grad_outputs = [None] * len(outputs)
    gs = [_as_grad(g, t) for t, g in zip(outputs, grad_outputs)]
    if retain_graph is None:
        retain_graph = create_graph
    res = run_backward(outputs, gs, list(inputs), retain_graph, create_graph)
    if not allow_unused and any(r is None for r in res):
        raise RuntimeError("one of the inputs was not used to compute the outputs")
    return res

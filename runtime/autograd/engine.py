"""The backward pass: reverse topological order over recorded nodes.

One routine, ``run_backward``, serves both ``Tensor.backward`` (accumulate into
``.grad`` of every leaf) and ``grad`` (return gradients for given tensors,
leaves or not). Gradients flowing into an edge are summed; a gradient whose
shape the input broadcasts to is summed down to the input's shape; anything
else a node returns that does not fit its inputs is an error naming the node.

It is written for small graphs as much as big ones: every node attribute is
read once per pass, a gradient that already fits its input is checked with two
comparisons, and a graph of one node skips the topological sort.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import threading

import numpy as np

from . import grad_mode as _gm
from .node import Node, double_backward_message, meta_of
from .ownership import claim, private_copy
from .. import device as _device
from .. import dtypes as _dt
from ..ops import math as _math
from .views import has_internal_overlap, refresh_view as _refresh_view
from ..tensor import Tensor

__all__ = ["backward", "grad", "run_backward"]


def _ones(shape, dtype, like: Any = None) -> Any:
    """Ones on the device of the array ``like`` (the host when None or a numpy array)."""
    a = (np if like is None or type(like) is np.ndarray else _device.array_module(like)).empty(shape, dtype)
    a.fill(1)
    return Tensor._from_array(a)


def _zeros(meta, like: Any = None) -> Any:
    """Zeros for ``meta`` on the device of the Tensor ``like`` (a gradient beside the missing one)."""
    shape, dtype = meta
    xp = np if like is None or type(like._data) is np.ndarray else _device.array_module(like._data)
    return Tensor._from_array(xp.zeros(shape, dtype=dtype))


def _accumulate(a, b):
    return b if a is None else _math.add(a, b)


def _reduce_to(node, i: int, g, meta):
    """Gradient ``g`` for argument ``i`` of ``node``, made to fit the argument or rejected."""
    if not isinstance(g, Tensor):
        if isinstance(g, np.ndarray):
            g = Tensor._from_array(g)
        else:
            raise TypeError(f"backward of {node.name} returned {type(g).__name__} for argument {i}; "
                            f"expected a Tensor or None")
    shape, dtype = meta
    gshape = g._data.shape
    if gshape != shape:
        if not _broadcasts_to(shape, gshape):
            raise RuntimeError(f"backward of {node.name} returned a gradient of shape {list(gshape)} "
                               f"for argument {i}, whose shape is {list(shape)} (not a broadcast of it)")
        g = _math.sum_to(g, shape)
    if g._data.dtype != dtype:
        if node.strict:
            raise TypeError(f"backward of {node.name} returned a gradient of dtype {g._data.dtype} "
                            f"for argument {i}, whose dtype is {dtype}")
        if g._data.dtype.kind == "c" and dtype.kind != "c":  # a real input of a complex op: the real part
            g = _math.real(g)
        g = _math.cast(g, _dt.from_numpy_dtype(dtype))
    return g


def _broadcasts_to(shape, target) -> bool:
    if len(shape) > len(target):
        return False
    for s, t in zip(reversed(shape), reversed(target)):
        if s != t and s != 1:
            return False
    return True


def _check_count(node, results, edges) -> list:
    """One gradient per argument, as a list. Trailing entries may be left off
    when their arguments need no gradient, and extra entries must be None."""
    results = [] if results is None else list(results)
    n, n_args = len(results), len(edges)
    if n < n_args:
        missing = [i for i in range(n, n_args) if edges[i] is not None]
        if missing:
            raise RuntimeError(f"backward of {node.name} returned {n} gradients, but its forward took {n_args} "
                               f"arguments and argument {missing[0]} needs a gradient (return one gradient, "
                               f"or None, per argument)")
        results += [None] * (n_args - n)
    elif n > n_args:
        if any(r is not None for r in results[n_args:]):
            raise RuntimeError(f"backward of {node.name} returned {n} gradients, but its forward took "
                               f"{n_args} arguments (expected one gradient, or None, per argument)")
        del results[n_args:]
    return results


class _OnceDifferentiable(Node):
    """Stands behind gradients computed by a backward that records no graph.

    Its edges lead to everything those gradients depend on (the node's inputs
    and the incoming gradients that require grad), so a higher-order gradient
    that would flow through them reaches this node and fails clearly instead
    of coming out silently zero.
    """

    __slots__ = ("_what",)
    strict = True

    def __init__(self, what: str, sources: Sequence[Any], grad: Any) -> None:
        self._what = what
        self.next_edges = tuple(sources)
        self.input_meta = tuple(None for _ in sources)
        self.out_meta = (meta_of(grad),)

    @property
    def name(self) -> str:  # type: ignore[override]
        return self._what

    def apply(self, grads, create_graph):
        raise RuntimeError(f"{double_backward_message(self._what)}. {self._what} is once-differentiable: its "
                           f"backward records no graph (C++ code, or numpy), so a higher-order gradient through "
                           f"it cannot be taken")


def once_differentiable_sources(node, grads) -> list:
    """What the gradients computed by ``node`` from ``grads`` depend on, as edges."""
    sources = [e for e in node.next_edges if e is not None]
    sources += [(g._node, g._out_index) if g._node is not None else g
                for g in grads if g is not None and g.requires_grad]
    return sources


def _topo_order(roots: Sequence[Node], leaf_ids: Optional[set] = None,
                target_nodes: Optional[Dict[Node, List[int]]] = None):
    """Nodes reachable from ``roots``, each after every node that feeds it grads.

    With ``leaf_ids`` (the ids of the target leaves) and ``target_nodes`` (target
    output indices per node) also the set of nodes whose backward must run to
    reach some target, found as each node is finished (its inputs' nodes are by
    then): ``(order, needed)``; without, ``(order, None)``. Nodes are keys by
    identity (no node type defines ``__eq__``).
    """
    order: List[Node] = []
    seen = set()
    needed = None if leaf_ids is None else set()
    for root in roots:
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, iter(root.next_edges))]
        while stack:
            node, it = stack[-1]
            for e in it:
                if type(e) is tuple:
                    child = e[0]
                    if child not in seen:
                        seen.add(child)
                        stack.append((child, iter(child.next_edges)))
                        break
            else:
                stack.pop()
                order.append(node)
                if needed is not None:
                    for e in node.next_edges:
                        if e is None:
                            continue
                        if type(e) is tuple:
                            child, k = e
                            if child in needed or (target_nodes and k in target_nodes.get(child, ())):
                                needed.add(node)
                                break
                        elif id(e) in leaf_ids:
                            needed.add(node)
                            break
    order.reverse()
    return order, needed


def _node_backward(node, buf: List[Any], retain_graph: bool, create_graph: bool):
    """Run one node's backward on its output gradients ``buf``.

    Returns ``(edges, grads)``: ``grads[i]`` is the gradient for ``edges[i]``,
    checked and fitted to argument ``i`` (``None`` where there is no edge or
    no gradient).
    """
    for g in buf:
        if g is None:  # (not `None in buf`: that would call Tensor.__eq__)
            if node.materialize_grads:
                metas = node.out_meta
                present = next((x for x in buf if x is not None), None)
                buf = [_zeros(metas[k], present) if g is None else g for k, g in enumerate(buf)]
            break
    results = node.apply(buf, create_graph)
    metas = node.input_meta  # before release: a node may build it from what release frees
    if not retain_graph:
        node.release()
    edges = node.next_edges
    if results is not None and type(results) in (list, tuple) and len(results) == len(edges):
        results = list(results)  # the common case: one gradient per argument
    else:
        results = _check_count(node, results, edges)
    once = None
    i = -1
    for g in results:
        i += 1
        if g is None:
            continue
        if edges[i] is None:
            results[i] = None
            continue
        meta = metas[i]
        plain = create_graph and type(g) is np.ndarray  # computed outside the runtime: it has no graph
        d = g._data if type(g) is Tensor else None
        if d is None or d.shape != meta[0] or (d.dtype is not meta[1] and d.dtype != meta[1]):
            g = _reduce_to(node, i, g, meta)
        if create_graph and (plain or not node.differentiable):
            if once is None:
                once = once_differentiable_sources(node, buf)
            g = Tensor._from_array(g._data)
            if once:
                g.requires_grad = True
                g._node = _OnceDifferentiable(node.name, once, g)
        results[i] = g
    return edges, results


def _one_node(node, k: int, g, targets: Sequence[Any], retain_graph: bool, create_graph: bool) -> List[Any]:
    """``run_backward`` for one output of a node whose arguments are all leaves, targets all leaves."""
    wanted = {id(t) for t in targets}
    for e in node.next_edges:
        if e is not None and id(e) in wanted:
            break
    else:
        return [None] * len(targets)  # no target is reached: the node need not run
    buf = [None] * len(node.out_meta)
    buf[k] = g
    edges, results = _node_backward(node, buf, retain_graph, create_graph)
    by_leaf: Dict[int, Any] = {}
    for e, r in zip(edges, results):
        if r is not None and id(e) in wanted:
            prev = by_leaf.get(id(e))
            by_leaf[id(e)] = r if prev is None else _accumulate(prev, r)
    return [by_leaf.get(id(t)) for t in targets]


def _is_one_node(outputs: Sequence[Any], targets: Optional[Sequence[Any]]) -> bool:
    if targets is None or len(outputs) != 1 or outputs[0]._node is None:
        return False
    for e in outputs[0]._node.next_edges:
        if type(e) is tuple:
            return False
    for t in targets:
        if t._node is not None:
            return False
    return True


def run_backward(outputs: Sequence[Any], grad_outputs: Sequence[Any], targets: Optional[Sequence[Any]],
                 retain_graph: bool, create_graph: bool) -> Optional[List[Any]]:
    """Propagate ``grad_outputs`` from ``outputs`` back through the graph.

    ``targets is None``: accumulate into ``.grad`` of every leaf reached.
    Otherwise return one gradient (or ``None`` if unreached) per target tensor.
    """
    for t in outputs:  # a view read after a write into its base: its history anew (runtime/call_rules.py)
        if t._base_ref is not None and t._vc.value != t._view_version:
            _refresh_view(t)
    for t in targets or ():  # (a second loop: cheaper than one over a tuple of both)
        if t._base_ref is not None and t._vc.value != t._view_version:
            _refresh_view(t)
    state = _gm._state
    prev_mode = state.enabled
    state.enabled = create_graph
    try:
        if _is_one_node(outputs, targets):
            out = outputs[0]
            res = _one_node(out._node, out._out_index, grad_outputs[0], targets, retain_graph, create_graph)
        else:
            res = _run_graph(outputs, grad_outputs, targets, retain_graph, create_graph)
        if res is None:
            return None
        claimed: Dict[int, List[Any]] = {}
        for g in grad_outputs:
            claim(claimed, g._data)
        return [None if g is None else _own(g, claimed, create_graph) for g in res]
    finally:
        state.enabled = prev_mode


def _run_graph(outputs: Sequence[Any], grad_outputs: Sequence[Any], targets: Optional[Sequence[Any]],
               retain_graph: bool, create_graph: bool) -> Optional[List[Any]]:
    """``run_backward`` for any graph (recording mode already set)."""
    buffers: Dict[Node, List[Any]] = {}  # nodes are keys by identity
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
        buf = buffers.get(node)
        if buf is None:
            buf = buffers[node] = [None] * len(node.out_meta)
            roots.append(node)
        k = out._out_index
        buf[k] = _accumulate(buf[k], g)

    # targets that are outputs of nodes: capture the grad arriving at (node, index)
    captured: Dict[tuple, Any] = {}
    target_nodes: Dict[Node, List[int]] = {}
    target_leaf_ids = None
    if targets is not None:
        target_leaf_ids = set()
        for t in targets:
            if t._node is None:
                target_leaf_ids.add(id(t))
            else:
                target_nodes.setdefault(t._node, []).append(t._out_index)

    order, needed = _topo_order(roots, target_leaf_ids, target_nodes)

    pop = buffers.pop
    get = buffers.get
    node_backward = _node_backward
    for node in order:
        buf = pop(node, None)
        if buf is None:
            continue
        if target_nodes:
            for k in target_nodes.get(node, ()):
                captured[(node, k)] = buf[k]
        if needed is not None and node not in needed:
            continue
        edges, results = node_backward(node, buf, retain_graph, create_graph)
        for e, g in zip(edges, results):
            if g is None:
                continue
            if type(e) is tuple:
                child, k = e
                cb = get(child)
                if cb is None:
                    n_out = len(child.out_meta)
                    if n_out == 1 and k == 0:  # one output: its buffer is complete at once
                        buffers[child] = [g]
                        continue
                    cb = buffers[child] = [None] * n_out
                cb[k] = g if cb[k] is None else _accumulate(cb[k], g)
            elif target_leaf_ids is None or id(e) in target_leaf_ids:
                eid = id(e)
                lg = leaf_grads.get(eid)
                leaf_grads[eid] = g if lg is None else _accumulate(lg, g)
                leaves[eid] = e

    # Each gradient handed out owns its memory: a rule may return one tensor for two
    # inputs (add) or a view of another gradient (transpose), and a caller's gradient=
    # may reach a leaf unchanged.
    if targets is None:
        claimed: Dict[int, List[Any]] = {}
        for g in grad_outputs:
            claim(claimed, g._data)
        for key, g in leaf_grads.items():  # every .grad checked first: an error leaves all of them as they were
            _check_grad_shape(leaves[key], g)
        for key, g in leaf_grads.items():
            _accumulate_grad(leaves[key], _own(g, claimed, create_graph), create_graph)
        return None
    return [leaf_grads.get(id(t)) if t._node is None else captured.get((t._node, t._out_index))
            for t in targets]


def _check_grad_shape(leaf, g) -> None:
    """A .grad of another shape than the gradient is an error, as torch's (never a broadcast sum)."""
    old = leaf._grad  # a Tensor of the leaf's shape when set (Tensor.grad's setter): the leaf's changed since
    if old is None:
        return
    shape = old._data.shape
    if shape != g._data.shape:  # torch: "output with shape [3] doesn't match the broadcast shape [2, 3]"
        raise RuntimeError(f"backward(): a gradient of shape {list(g._data.shape)} cannot be added to .grad of "
                           f"shape {list(shape)} (a .grad left from before the tensor's shape changed, or set by "
                           f"hand); set .grad = None first. No .grad was changed")


_GRAD_LOCK = threading.Lock()  # one accumulation into a .grad at a time (torch locks AccumulateGrad)


def _accumulate_grad(leaf, g, create_graph: bool) -> None:
    """Add ``g`` to ``leaf.grad`` as torch's AccumulateGrad does: the first gradient is stored; later ones
    are added into the same tensor (a reference to ``leaf.grad`` taken before sees the sum, and its
    write count goes up), except with ``create_graph`` or where the old one cannot take the sum in
    place (requires grad, read-only, elements sharing memory, another dtype or device after set_data):
    then a new tensor (a .grad of another shape was refused before: ``_check_grad_shape``). Backwards on
    several threads into one leaf add whole gradients, one at a time."""
    with _GRAD_LOCK:
        old = leaf._grad  # set past the assignment's checks: g is made for this leaf
        if old is None:
            leaf._grad = g
            return
        a, b = old._data, g._data
        if (create_graph or old.requires_grad or a.dtype != b.dtype or type(a) is not type(b)
                or not getattr(getattr(a, "flags", None), "writeable", True) or has_internal_overlap(a)):
            leaf._grad = _accumulate(old, g)
            return
        a += b
        old._version += 1


def _own(g, claimed: Dict[int, List[Any]], create_graph: bool):
    """``g`` as a tensor whose memory no other result (or caller's array) overlaps."""
    if not claim(claimed, g._data):
        return private_copy(g, create_graph)  # a copy that keeps the gradient's graph
    return g if create_graph else Tensor._from_array(g._data)


def _as_grad(g, like, who: str = "backward()", k: int = 0):
    """The gradient given for output ``k`` (``like``), as a Tensor; ones for None. One of another shape
    is refused, as torch refuses it (summed down or broadcast, it gave a wrong gradient silently)."""
    if g is None:
        return _ones(like._data.shape, like._data.dtype, like._data)
    if not isinstance(g, Tensor):
        g = Tensor(g, _dt.from_numpy_dtype(like._data.dtype), like.device)
    if g._data.shape != like._data.shape:
        raise RuntimeError(f"{who}: the gradient given for output {k} has shape {list(g._data.shape)}, the output "
                           f"{list(like._data.shape)}; they must match")
    return g


def _grads_for(outputs: Sequence[Any], grads: Any, who: str, what: str) -> List[Any]:
    """One gradient (or None) per output: ``grads`` may be None, one tensor or array (for a single
    output; an array is not a sequence of gradients), or a sequence as long as ``outputs``."""
    if grads is None:
        return [None] * len(outputs)
    if isinstance(grads, (Tensor, np.ndarray)) or _device.is_device_array(grads):
        grads = [grads]
    grads = list(grads)
    if len(grads) != len(outputs):
        raise RuntimeError(f"{who}: {what} has {len(grads)} gradient(s) for {len(outputs)} output(s); "
                           f"give one per output (None for a one-element output)")
    return grads


def backward(tensors: Sequence[Any], grad_tensors: Optional[Sequence[Any]] = None,
             retain_graph: Optional[bool] = None, create_graph: bool = False) -> None:
    """Accumulate gradients of ``tensors`` into ``.grad`` of the leaves they depend on.

    ``retain_graph`` defaults to ``create_graph`` (a graph of the gradients refers to it)."""
    tensors = [tensors] if isinstance(tensors, Tensor) else list(tensors)
    if retain_graph is None:
        retain_graph = create_graph
    grad_tensors = _grads_for(tensors, grad_tensors, "backward()", "grad_tensors")
    for t, g in zip(tensors, grad_tensors):
        if not t.requires_grad:
            raise RuntimeError("backward() on a tensor that does not require grad and has no history; "
                               "mark an input with requires_grad_() before computing it")
        if g is None and t._data.size != 1:
            raise RuntimeError(f"backward() without a gradient needs a one-element output, got shape "
                               f"{list(t._data.shape)}; pass gradient=")
    gs = [_as_grad(g, t, "backward()", k) for k, (t, g) in enumerate(zip(tensors, grad_tensors))]
    run_backward(tensors, gs, None, retain_graph, create_graph)


def grad(outputs: Sequence[Any], inputs: Sequence[Any], grad_outputs: Optional[Sequence[Any]] = None,
         retain_graph: Optional[bool] = None, create_graph: bool = False,
         allow_unused: bool = False) -> List[Any]:
    """Gradients of ``outputs`` with respect to ``inputs``, as PyTorch's ``autograd.grad``: each may be
    one Tensor or a sequence of them; an output with more than one element needs its ``grad_outputs``.

    An input that no output depends on is an error, unless ``allow_unused=True``,
    which gives ``None`` for it. An input or output that does not require grad is an error either way.
    """
    outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    if not inputs:  # torch: "grad requires non-empty inputs"
        raise RuntimeError("autograd.grad: inputs is empty; give the tensors to differentiate with respect to")
    grad_outputs = _grads_for(outputs, grad_outputs, "autograd.grad", "grad_outputs")
    for k, (t, g) in enumerate(zip(outputs, grad_outputs)):
        if not isinstance(t, Tensor):
            raise TypeError(f"autograd.grad: output {k} is a {type(t).__name__}, not a Tensor")
        if not t.requires_grad:  # torch: "element k of tensors does not require grad and does not have a grad_fn"
            raise RuntimeError(f"autograd.grad: output {k} does not require grad and has no history; mark an "
                               f"input with requires_grad_() before computing it")
        if g is None and t._data.size != 1:
            raise RuntimeError(f"autograd.grad: output {k} has shape {list(t._data.shape)}; without grad_outputs "
                               f"each output must have one element")
    for k, x in enumerate(inputs):  # as torch, allow_unused or not: there is no gradient to give for these
        if not isinstance(x, Tensor):
            raise TypeError(f"autograd.grad: input {k} is a {type(x).__name__}, not a Tensor")
        if not x.requires_grad:
            raise RuntimeError(f"autograd.grad: input {k} does not require grad (one of the differentiated "
                               f"tensors does not require grad); call requires_grad_() on it first")
    gs = [_as_grad(g, t, "autograd.grad", k) for k, (t, g) in enumerate(zip(outputs, grad_outputs))]
    if retain_graph is None:
        retain_graph = create_graph
    res = run_backward(outputs, gs, list(inputs), retain_graph, create_graph)
    if not allow_unused:
        unused = [i for i, r in enumerate(res) if r is None]
        if unused:
            raise RuntimeError(f"autograd.grad: input {unused[0]} was not used to compute the outputs "
                               f"(pass allow_unused=True to get None for it)")
    return res

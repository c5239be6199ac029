"""What a jitted call's forward keeps for its backward: the autograd node of each opaque op.

An op whose backward is its own (a C++ ``Function``, an ``ops.Custom`` with
a bprop, a ``Cell`` with ``bprop``, a Python ``autograd.Function``) is one
opaque ``<op>.backward`` node of the backward graph. In the forward graph of
a call that records a gradient, such a node runs through ``keeping``: the op
runs with recording on, as it would eagerly, so it records its own node
(its ``ctx``, saved tensors and ``saved_data``, a bprop's ``out``), and that
node goes into the call's ``CallContexts``. The call's ``JitGradNode`` holds
them; while it runs the backward graph they are this thread's
``active.backward``, and the opaque node's target (backward.py) calls the
kept node's backward with the incoming gradients instead of running the op
again.

Per-call state never lives on the cached graphs: it travels through this
thread-local ``active`` only for the duration of one forward or one backward
run. A backend that runs the op some other way (a plugin running the node
itself, another thread) leaves no context, and the backward recomputes.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

import numpy as np

from ..autograd.engine import _node_backward
from ..autograd.grad_mode import _state
from ..autograd.node import Node as AutogradNode, edge_of
from ..graph.graph import Input, Node, Output
from ..tensor import Tensor

__all__ = ["CallContexts", "active", "keeping", "kept_backward", "no_history"]


class CallContexts:
    """The autograd nodes one call's opaque ops recorded, by forward node id."""

    __slots__ = ("owner", "nodes", "external")

    def __init__(self, owner: object, external: FrozenSet[int]) -> None:
        self.owner = owner  # the BackwardGraph's token: node ids are only unique within one graph
        # node id -> (the op's autograd node or None, per output: which output of that node it is, or -1)
        self.nodes: Dict[int, Tuple[Any, Tuple[int, ...]]] = {}
        self.external = external  # ids of the call's input tensors and the graph's tensor constants

    def release(self) -> None:
        """Free what the kept nodes saved (the call's backward ran without retain_graph)."""
        for node, _ in self.nodes.values():
            if node is not None:
                node.release()
        self.nodes = {}


class _Active(threading.local):
    forward: Optional[CallContexts] = None  # filled by the forward run in progress on this thread
    backward: Optional[CallContexts] = None  # read by the backward run in progress on this thread
    # the backward run in progress: (opaque node id, position) -> whether that gradient was None (backward.py)
    unused: Optional[dict] = None


active = _Active()


class _Intermediate(AutogradNode):
    """The history of an intermediate value of a jitted forward that an opaque op differentiates.

    Eagerly such a value came out of a recorded op; in the jitted forward it
    came out of one run with nothing recorded. Pointing at this node makes it
    a non-leaf again, so the op treats it as it would eagerly (an in-place
    ``MarkDirty`` of it is allowed). Nothing ever runs it: the kept node's
    backward is called directly, or the engine stops at it (``_Through``: its
    edge is a target, whose gradient the engine captures). One per value, so
    its edge names that value.
    """

    __slots__ = ()
    name = "jit intermediate"

    def __init__(self, value: Tensor) -> None:
        self.next_edges = ()
        self.input_meta = ()
        self.out_meta = ((value._data.shape, value._data.dtype),)  # (the engine sizes its gradient buffer by it)

    def apply(self, grads: Sequence[Any], create_graph: bool) -> Sequence[Any]:
        raise RuntimeError("internal: a jitted forward's intermediate value has no backward of its own")


def keeping(node: Node, diff: Sequence[int], owner: object) -> Callable[..., Any]:
    """A target for ``node`` in the forward graph of a call that records a gradient.

    With a call's contexts active it runs the op with recording on, its
    inputs ``diff`` requiring grad, and keeps the node the op recorded;
    otherwise it runs the op as the traced target does.
    """
    target, key, multi = node.target, node.id, node.multi

    def run(*args: Any, **attrs: Any) -> Any:
        calls = active.forward
        if calls is None or calls.owner is not owner:
            return target(*args, **attrs)
        ins = list(args)
        for i in diff:
            t = ins[i]
            if not t.requires_grad:  # an intermediate value (inputs and parameters on the path already do)
                if id(t) in calls.external:  # an op handed an input through: never mark the caller's tensor
                    t = ins[i] = Tensor._from_array(t._data)
                t.requires_grad = True
                if t._node is None:
                    t._node = _Intermediate(t)  # its own: its edge names this argument (``_Through``)
        before = [edge_of(ins[i]) for i in diff]  # (an op writing an argument in place moves its history)
        prev = _state.enabled
        _state.enabled = True
        try:
            out = target(*ins, **attrs)
        finally:
            _state.enabled = prev
        outs = out if multi else (out,)
        recorded = None
        handed = False  # an output that requires grad with no history: a leaf argument handed back as it is
        for o in outs:
            if o._node is not None:
                if recorded is None:
                    recorded = o._node
            elif o.requires_grad:
                handed = True
        if handed or (recorded is not None and not _direct(recorded, diff, before, outs)):
            # not one node over the op's arguments (a C++ module function running two Functions, taking its
            # arguments in another order or one argument twice, handing an argument back): the gradient of the
            # arguments through whatever the call recorded
            calls.nodes[key] = (_Through([edge_of(o) if o.requires_grad else None for o in outs],
                                         [_anchor(ins[i], e) for i, e in zip(diff, before)]), ())
            return out
        # per position, the output of the recorded node its tensor is (-1: none): a tensor returned at two
        # positions (a MarkDirty input returned twice) is one node output, which both gradients reach, as eagerly
        calls.nodes[key] = (recorded, tuple(o._out_index if recorded is not None and o._node is recorded else -1
                                            for o in outs))
        return out

    run.__qualname__ = f"{node.op}.keeping"
    return run


def no_history(graph: Any, inputs: Sequence[Any], calls: CallContexts) -> List[int]:
    """The positions of a jitted call's outputs that have no history in this call, as eagerly: those an
    opaque op of ``graph`` gave none (a C++ function's result that does not depend on the arguments requiring
    grad, such as a view of another argument; one it picked by a value; a Function's non-differentiable
    output), and any value computed from such results alone. The backward plan cannot know which of an opaque
    op's outputs depend on which inputs; the op's own run this call does. Nothing to do (the common case)
    when every opaque op gave each of its outputs a history."""
    quiet: Dict[int, Any] = {}  # node id -> its outputs without history (None: all of them)
    for key, (node, attached) in calls.nodes.items():
        if node is None:
            quiet[key] = None
        else:
            none = {k for k, h in enumerate(node.heads) if h is None} if type(node) is _Through else \
                {k for k, a in enumerate(attached) if a < 0}
            if none:
                quiet[key] = none
    if not quiet:
        return []
    history: Dict[Tuple[int, int], bool] = {}

    def has(r: Any) -> bool:
        if isinstance(r, Output):
            return history[(r.node, r.index)]
        v = inputs[r.index] if isinstance(r, Input) else getattr(r, "value", None)
        return isinstance(v, Tensor) and v.requires_grad

    for n in graph.nodes:
        reached = not getattr(n.target, "stops_gradient", False) and any(has(r) for r in n.inputs)
        if n.id in calls.nodes:  # an opaque op: what its run gave, of what reached it (``keeping`` marked
            none = quiet.get(n.id, ())  # each differentiated argument: one without history too)
            for k in range(len(n.out_dtypes)):
                history[(n.id, k)] = reached and none is not None and k not in none
            continue
        for k, dt in enumerate(n.out_dtypes):
            history[(n.id, k)] = reached and np.dtype(dt).kind in "fc"
    return [k for k, r in enumerate(graph.outputs) if isinstance(r, Output) and not history[(r.node, r.index)]]


def _direct(node: Any, diff: Sequence[int], before: Sequence[Any], outs: Sequence[Any]) -> bool:
    """Whether ``node``'s own backward gives the op's gradients: each output with a history is an output of
    ``node``, and each of ``node``'s edges is the op's differentiated argument at the same position (its edge as
    it was before the call). Not so for a call that applied two Functions, or one Function to an argument twice
    (``x * x``: two edges to one argument), or to its arguments in another order."""
    for o in outs:
        if o._node is not None and o._node is not node:
            return False
    want = dict(zip(diff, before))
    edges = node.next_edges
    if any(i >= len(edges) for i in want):
        return False
    for k, f in enumerate(edges):
        if f is None:
            if k in want:
                return False
            continue
        e = want.get(k)
        if e is None:  # a gradient the op's own backward gives that no differentiated argument would take
            return False
        if type(e) is tuple:
            if type(f) is not tuple or f[0] is not e[0] or f[1] != e[1]:
                return False
        elif f is not e:
            return False
    return True


def _edge_key(a: Tensor) -> Any:
    """What identifies ``a``'s edge (an anchor): its node and output index, or the leaf itself."""
    return (id(a._node), a._out_index) if a._node is not None else id(a)


def _anchor(t: Tensor, edge: Any) -> Tensor:
    """A tensor whose edge is ``edge`` (``t``'s before the call): a target the engine captures the gradient at."""
    if type(edge) is not tuple:
        return edge  # a leaf: itself
    a = Tensor._from_array(t._data)
    a._node, a._out_index = edge
    a.requires_grad = True
    return a


class _Through:
    """What an op call recorded when it is not one node over its arguments: the edge of each output as the
    call made it (an output handed out as it came takes the jitted call's node afterwards), and a tensor per
    differentiated argument standing for the argument's history before the call (``_anchor``)."""

    __slots__ = ("heads", "anchors")

    def __init__(self, heads: List[Any], anchors: List[Tensor]) -> None:
        self.heads = heads
        self.anchors = anchors

    def backward(self, gs: Sequence[Any]) -> List[Any]:
        """The arguments' gradients, by the engine from the outputs' edges to the anchors. One tensor at two
        positions (``op(x, y, x)``) is one edge: its whole gradient goes to its first position, None to the
        others (the jitted backward sums the positions of one value, as eagerly each use is counted once)."""
        from ..autograd.engine import run_backward
        outs, grads = [], []
        for e, g in zip(self.heads, gs):
            if e is None or g is None:
                continue
            outs.append(_anchor(g, e))
            grads.append(g)
        if not outs:
            return [None] * len(self.anchors)
        first: Dict[Any, int] = {}
        where = [first.setdefault(_edge_key(a), k) for k, a in enumerate(self.anchors)]
        uniq = [self.anchors[k] for k in sorted(first.values())]
        res = run_backward(outs, grads, uniq, True, False)
        if res is None:
            return [None] * len(self.anchors)
        by_first = dict(zip(sorted(first.values()), res))
        return [by_first[k] if k == w else None for k, w in enumerate(where)]

    def release(self) -> None:
        self.heads = []
        self.anchors = []


def kept_backward(owner: object, key: int, diff: Sequence[int], gs: Sequence[Any]) -> Optional[List[Any]]:
    """The gradients of inputs ``diff`` of forward node ``key`` from the node its op recorded in this
    call's forward, or None when there is none (no call contexts, or the op ran elsewhere)."""
    calls = active.backward
    if calls is None or calls.owner is not owner:
        return None
    kept = calls.nodes.get(key)
    if kept is None:
        return None
    node, attached = kept
    if node is None:  # no output was differentiable: nothing flows back, as eagerly
        return [None] * len(diff)
    if type(node) is _Through:
        return node.backward(gs)
    buf: List[Any] = [None] * len(node.out_meta)
    for g, k in zip(gs, attached):
        if k >= 0 and g is not None:
            if buf[k] is None:
                buf[k] = g
            else:
                from ..ops.math import add
                buf[k] = add(buf[k], g)
    _, res = _node_backward(node, buf, True, False)  # released with the call's node (retain_graph)
    return [res[i] for i in diff]

"""The backward graph of a traced forward graph, built symbolically.

For each forward node in reverse order, its derivative rules (``defvjp``)
run under a ``Tracer`` on stand-in tensors: one per forward input, per
forward node output (so a rule's ``ans`` is that node's value, not a
constant) and per output gradient. What the rules compute is recorded as
nodes of a new ``Graph``; gradients reaching one value are summed with a
traced ``add``, and fitted to their argument (``sum_to``, ``cast``) as the
engine would. A node whose backward is not made of runtime ops (a C++
``Function``, an ``ops.Custom``, a ``Cell`` with ``bprop``, a Python
``autograd.Function``) becomes one opaque ``<op>.backward`` node
(``opaque`` names them with the inputs they differentiate). Its target calls
the backward of the node the op recorded in the same call's forward
(kept.py); where the forward kept none (a plugin ran the op itself) it runs
the op again on fresh leaves and differentiates that with autograd.

The backward graph's inputs are the stand-ins it uses, named by ``keys``:
``("in", i)`` forward input ``i``, ``("val", node, k)`` a saved forward
value, ``("grad", j)`` the gradient of forward output ``j``. Its outputs are
the gradients of ``sources`` (float tensor inputs, then captured tensors that
require grad) that some gradient reaches.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..autograd.engine import grad as _autograd_grad
from ..autograd.grad_mode import enable_grad, no_grad
from ..device import array_module
from ..graph.graph import Const, Graph, Input, Node, Output, Ref
from ..tensor import Tensor
from .kept import active, kept_backward
from .capture import Tracer

__all__ = ["BackwardGraph", "build_backward", "forward_values", "grad_sources"]

Key = Tuple[Any, ...]


@dataclass
class BackwardGraph:
    graph: Graph
    keys: List[Key]  # what each input of ``graph`` stands for
    saved: List[Tuple[int, int]]  # forward values (node, index) the backward reads, in "val" key order
    sources: List[Key]  # ("in", i) or ("const", tensor): one per gradient the jitted call's node gives
    outputs: List[int]  # positions in ``sources`` that ``graph``'s outputs are the gradients of
    opaque: Dict[int, List[int]]  # forward node id -> inputs its <op>.backward node differentiates
    owner: object  # this graph's token in a call's kept contexts (kept.CallContexts)
    # forward values (node, index) a primitive on a gradient's path takes, with the first such primitive
    # the backward meets (argument index, op name): eagerly, its node checks the value's version
    readers: Dict[Tuple[int, int], Tuple[int, str]]
    prim_read: frozenset  # the saved forward values (node, index) the graph's non-opaque nodes read
    # inputs and captured tensors a primitive on a gradient's path reads, as eager's node saves them, directly
    # or through a view of their memory (Graph.view_reads): (("in", i) or ("const", tensor), argument index,
    # op name, writes the forward made to it before the read)
    arg_reads: Tuple[Tuple[Key, int, str, int], ...] = ()
    # position in ``arg_reads`` of each read through a view -> (the viewed tensor's strides when traced, the
    # position in ``saved`` of the value read or None, whether it was a view when traced): a call whose tensor
    # has other strides may have made a copy instead, or a view of a copy (a reshape), so it checks the
    # tensor's version only where the value it saved views it (Graph.view_reads)
    view_layouts: Dict[int, Tuple[Any, Optional[int], bool]] = field(default_factory=dict)
    # eager's error for a value a primitive on a gradient's path read that a later op of the forward wrote in
    # place (Graph.stale_reads): every backward through this graph fails with it, as eagerly
    stale: Optional[str] = None
    # per output of ``graph``: the opaque results (node id, position) it is None with when all of them are at
    # run time (eager's None gradient; JitGradNode hands it on as None), or None for one always computed
    unused_with: Tuple[Optional[frozenset], ...] = ()


def _is_float(t: Any) -> bool:
    return isinstance(t, Tensor) and t._data.dtype.kind in "fcV"  # dtypes.GRAD_KINDS


def grad_sources(graph: Graph, inputs: Sequence[Tensor], wanted: Sequence[bool]) -> List[Key]:
    """Float tensor inputs that are ``wanted``, then captured float tensors that require grad (each once)."""
    keys: List[Key] = [("in", i) for i, t in enumerate(inputs) if _is_float(t) and wanted[i]]
    seen = set()
    for n in graph.nodes:
        for r in n.inputs:
            v = r.value if isinstance(r, Const) else None
            if _is_float(v) and v.requires_grad and id(v) not in seen:
                seen.add(id(v))
                keys.append(("const", v))
    return keys


def forward_values(graph: Graph, inputs: Sequence[Tensor]) -> Dict[Tuple[int, int], Any]:
    """Stand-in values of every node output of ``graph`` on ``inputs``, nothing recorded: a primitive's
    computed (a pure function), an opaque op's (its own forward: it may write its inputs in place or
    count its calls) zeros of its traced shape and dtype, so building a backward graph never runs an
    op's forward, which must run once per call. The values only give the rules' stand-ins their
    shapes and dtypes (a rule reading a value stops nothing here: the graph holds ops, not values)."""
    env: Dict[Tuple[int, int], Any] = {}

    def get(r: Ref) -> Any:
        if isinstance(r, Input):
            return inputs[r.index]
        return r.value if isinstance(r, Const) else env[(r.node, r.index)]

    with no_grad(), np.errstate(all="ignore"):
        for n in graph.nodes:
            args = [get(r) for r in n.inputs]
            if n.kind == "primitive":
                outs = graph.run_node(n, args)
            else:
                like = next((a._data for a in args if isinstance(a, Tensor)), None)
                xp = np if like is None else array_module(like)
                outs = [Tensor._from_array(xp.zeros(shape, dtype)) for shape, dtype in zip(n.out_shapes,
                                                                                           n.out_dtypes)]
            for k, v in enumerate(outs):
                env[(n.id, k)] = v
    return env


def _opaque_backward(node: Node, diff: List[int], owner: object,
                     dout_unused: Sequence[Optional[frozenset]]) -> Callable[..., Tuple[Any, ...]]:
    """A target computing ``node``'s input gradients (args ``diff``) by its own backward: the node the
    op recorded in this call's forward, or (none kept) the op run again and differentiated.

    Eagerly, a gradient that is None is not computed and does not count. Here the graph carries zeros in
    its place; each run notes in ``active.unused`` which of its results were None, and runs no backward
    when every incoming gradient is (``dout_unused``: per output, the opaque results it is None with, or
    None for one always computed), as eagerly. JitGradNode hands a gradient on as None by the same notes."""
    nin = len(node.inputs)
    key = node.id

    def backward(*vals: Any) -> Tuple[Any, ...]:
        from ..ops.math import zeros_like
        state = active.unused
        if state is not None and all(p is not None and all(state.get(s, False) for s in p) for p in dout_unused):
            for j in range(len(diff)):
                state[(key, j)] = True
            return tuple(zeros_like(vals[i]) for i in diff)
        res = run_backward(vals)
        if state is not None:
            for j, r in enumerate(res):
                state[(key, j)] = r is None
        return tuple(zeros_like(vals[i]) if r is None else r for i, r in zip(diff, res))

    def run_backward(vals: Sequence[Any]) -> Sequence[Any]:
        ins, gs = list(vals[:nin]), vals[nin:]
        res = kept_backward(owner, key, diff, gs)
        if res is not None:
            return res
        with enable_grad():
            for i in diff:
                ins[i] = Tensor._from_array(ins[i]._data)
                ins[i].requires_grad = True
            out = node.target(*ins, **node.attrs)
            outs = list(out) if node.multi else [out]
            pairs = [(o, g) for o, g in zip(outs, gs) if g is not None and o.requires_grad]
            return _autograd_grad([o for o, _ in pairs], [ins[i] for i in diff],
                                  grad_outputs=[g for _, g in pairs], allow_unused=True) if pairs else \
                [None] * len(diff)

    backward.__qualname__ = f"{node.op}.backward"
    return backward


class _Builder:
    """Traces the backward of one forward graph on stand-ins holding the forward values."""

    def __init__(self, graph: Graph, inputs: Sequence[Tensor], env: Dict[Tuple[int, int], Any],
                 sources: List[Key]) -> None:
        self.fwd = graph
        self.req = {k for k in sources if k[0] == "in"}  # values a gradient must reach
        for n in graph.nodes:  # (a detach: no gradient through it, as eagerly)
            if not getattr(n.target, "stops_gradient", False) and any(self.key(r) is not None for r in n.inputs):
                self.req.update(("out", n.id, k) for k in range(len(n.out_shapes)))
        self.keys: List[Key] = []
        stand: List[Tensor] = []
        self.val: Dict[Key, Tensor] = {}
        for i, t in enumerate(inputs):
            self._stand(("in", i), t, stand)
        for (n, k), v in env.items():
            if isinstance(v, Tensor):
                self._stand(("val", n, k), v, stand)
        for j, r in enumerate(graph.outputs):
            v = self.value(r)
            if _is_float(v):
                self._stand(("grad", j), Tensor._from_array(v._data.copy()), stand)
        self.stand_arrays = {id(t._data) for t in stand}
        self.tracer = Tracer(stand, f"{graph.name}.backward")
        self.grads: Dict[Key, Tensor] = {}
        self.opaque: Dict[int, List[int]] = {}
        # id of a gradient stand-in -> the opaque results (node id, position) it is None with when they all
        # are at run time; a stand-in not here is always computed
        self.unused_with: Dict[int, frozenset] = {}
        self.readers: Dict[Tuple[int, int], Tuple[int, str]] = {}
        self.arg_reads: List[Tuple[Key, int, str, int]] = []
        self.view_layouts: Dict[int, Tuple[Any, Tuple[int, int], bool]] = {}
        self.stale: Optional[str] = None
        self.owner = object()

    def _stand(self, key: Key, like: Tensor, stand: List[Tensor]) -> None:
        t = Tensor._from_array(like._data)
        self.keys.append(key)
        self.val[key] = t
        stand.append(t)

    def value(self, r: Ref) -> Any:
        if isinstance(r, Input):
            return self.val[("in", r.index)]
        if isinstance(r, Output):
            return self.val[("val", r.node, r.index)]
        return r.value

    def key(self, r: Ref) -> Optional[Key]:
        """The gradient slot of ``r``; None when no wanted gradient flows through it."""
        if isinstance(r, Input):
            k: Key = ("in", r.index)
            return k if k in self.req else None
        if isinstance(r, Output):
            k = ("out", r.node, r.index)
            return k if k in self.req else None
        return ("const", id(r.value)) if _is_float(r.value) and r.value.requires_grad else None

    def add_grad(self, key: Key, g: Tensor, like: Any) -> None:
        from ..dtypes import from_numpy_dtype
        from ..ops import math
        unused = self.unused_with.get(id(g))
        if g._data.shape != like._data.shape:
            g = self._same_unused(math.sum_to(g, like._data.shape), unused)
        if g._data.dtype != like._data.dtype:
            g = self._same_unused(math.cast(g, from_numpy_dtype(like._data.dtype)), unused)
        prev = self.grads.get(key)
        if prev is None:
            self.grads[key] = g
            return
        before = self.unused_with.get(id(prev))
        # eager's accumulation: None adds nothing, and two are None
        self.grads[key] = self._same_unused(math.add(prev, g), None if unused is None or before is None
                                            else unused | before)

    def _same_unused(self, g: Tensor, unused: Optional[frozenset]) -> Tensor:
        if unused is not None:
            self.unused_with[id(g)] = unused
        return g

    def node(self, n: Node) -> None:
        douts = [self.grads.get(("out", n.id, k)) for k in range(len(n.out_shapes))]
        if all(g is None for g in douts):
            return
        args = [self.value(r) for r in n.inputs]
        diff = [i for i, r in enumerate(n.inputs) if self.key(r) is not None and _is_float(args[i])]
        if not diff:
            return
        vjps = getattr(n.target, "vjps", None) if n.kind == "primitive" else None
        if n.kind == "primitive":
            if vjps is None:
                return  # not differentiable (comparisons, argmax...)
            # as eagerly: only an input whose values a rule that runs reads (those of the inputs needing a gradient)
            live = [i in diff and i < len(vjps) and vjps[i] is not None for i in range(len(n.inputs))]
            reads, reads_ans = n.target.live_reads(live)
            for j, r in enumerate(n.inputs):
                if isinstance(r, (Output, Input)) and (j >= len(reads) or reads[j]):
                    key = (r.node, r.index) if isinstance(r, Output) else ("in", r.index)
                    self.readers.setdefault(key, (j, getattr(n.target, "name", n.op)))
                if (j >= len(reads) or reads[j]) and (isinstance(r, Input) or (
                        isinstance(r, Const) and isinstance(r.value, Tensor))):
                    src: Key = ("in", r.index) if isinstance(r, Input) else ("const", r.value)
                    self.arg_reads.append((src, j, getattr(n.target, "name", n.op),
                                           self.fwd.arg_writes.get((n.id, j), 0)))
                view = self.fwd.view_reads.get((n.id, j)) if isinstance(r, Output) else None
                if view is not None and (j >= len(reads) or reads[j]):
                    # a value viewing an input's or a captured tensor's memory: eagerly the node saves the view,
                    # whose version is that tensor's (one counter)
                    vr = view[0]
                    self.view_layouts[len(self.arg_reads)] = (view[2], (r.node, r.index), view[3])
                    self.arg_reads.append((("in", vr.index) if isinstance(vr, Input) else ("const", vr.value), j,
                                           getattr(n.target, "name", n.op), view[1]))
                st = self.fwd.stale_reads.get((n.id, j)) if (j >= len(reads) or reads[j]) else None
                if st is not None and self.stale is None:
                    self.stale = (f"argument {j} of {getattr(n.target, 'name', n.op)} is at version {st[1]}; "
                                  f"expected version {st[0]}")
            st = self.fwd.stale_outs.get((n.id, 0))
            if st is not None and reads_ans and self.stale is None:  # rules that run read it
                self.stale = (f"output 0 of {getattr(n.target, 'name', n.op)} is at version {st[1]}; expected "
                              f"version {st[0]}")
            ans = self.val[("val", n.id, 0)]
            for i in diff:
                rule = vjps[i] if i < len(vjps) else None
                if rule is not None:
                    before = len(self.tracer.graph.nodes)
                    g = rule(douts[0], ans, *args, **n.attrs)
                    self._check_consts(n, before)
                    self._same_unused(g, self.unused_with.get(id(douts[0])))  # None with its incoming one
                    self.add_grad(self.key(n.inputs[i]), g, args[i])
            return
        from ..ops import math
        gs = [math.zeros_like(self.val[("val", n.id, k)]) if g is None else g for k, g in enumerate(douts)]
        # recorded, not run: the op's forward and backward need not run to build the graph (an op writing its
        # input in place would write the stand-in); its gradients have the shapes and dtypes of its inputs
        res = tuple(math.zeros_like(args[i]) for i in diff)
        dout_unused = [frozenset() if g is None else self.unused_with.get(id(g)) for g in douts]
        self.tracer.record("backward", f"{n.op}.backward", _opaque_backward(n, diff, self.owner, dout_unused),
                           [*args, *gs], {}, res)
        self.opaque[n.id] = diff
        for j, g in enumerate(res):
            self.unused_with[id(g)] = frozenset({(n.id, j)})
        for i, g in zip(diff, res):
            self.add_grad(self.key(n.inputs[i]), g, args[i])

    def _check_consts(self, n: Node, start: int) -> None:
        for b in self.tracer.graph.nodes[start:]:
            for r in b.inputs:
                if isinstance(r, Const) and isinstance(r.value, Tensor) and id(r.value._data) in self.stand_arrays:
                    raise RuntimeError(f"jit: the derivative rule of {n.op} used a tensor wrapping a forward "
                                       f"value outside the runtime's ops; the backward graph would freeze it "
                                       f"as a constant")


def build_backward(graph: Graph, inputs: Sequence[Tensor], sources: List[Key]) -> BackwardGraph:
    """The backward graph of ``graph`` (traced, not rewritten by a backend) for these inputs' values."""
    env = forward_values(graph, inputs)
    b = _Builder(graph, inputs, env, sources)
    with no_grad(), np.errstate(all="ignore"), b.tracer:  # rules on stand-in zeros may divide by them
        for j, r in enumerate(graph.outputs):
            g = b.val.get(("grad", j))
            k = b.key(r)
            if g is not None and k is not None:
                prev = b.grads.get(k)
                from ..ops import math
                b.grads[k] = g if prev is None else math.add(prev, g)
        for n in reversed(graph.nodes):
            b.node(n)
            if b.tracer.stopped is not None:  # a rule read a value, wrote in place...: no graph can hold it
                raise RuntimeError(f"jit: the derivative rule of {n.op} cannot be built into a backward graph: "
                                   f"{b.tracer.stopped}; compute this gradient without jit")
    outs, which, unused = [], [], []
    for s, key in enumerate(sources):
        g = b.grads.get(key if key[0] == "in" else ("const", id(key[1])))
        if g is not None:
            outs.append(g)
            which.append(s)
            unused.append(b.unused_with.get(id(g)))
    bgraph = b.tracer.finish(outs)
    keys, bgraph = _prune_inputs(bgraph, b.keys)
    saved = [(k[1], k[2]) for k in keys if k[0] == "val"]
    read = {r.index for n in bgraph.nodes if n.kind != "backward" for r in n.inputs if isinstance(r, Input)}
    read.update(r.index for r in bgraph.outputs if isinstance(r, Input))
    prim_read = frozenset((keys[i][1], keys[i][2]) for i in read if keys[i][0] == "val")
    pos = {nk: j for j, nk in enumerate(saved)}
    layouts = {i: (strides, pos.get(nk), seen) for i, (strides, nk, seen) in b.view_layouts.items()}
    return BackwardGraph(bgraph, keys, saved, sources, which, b.opaque, b.owner, b.readers, prim_read,
                         tuple(b.arg_reads), view_layouts=layouts, stale=b.stale, unused_with=tuple(unused))


def _prune_inputs(graph: Graph, keys: List[Key]) -> Tuple[List[Key], Graph]:
    """Drop the inputs no node or output reads; renumber the rest."""
    refs = [r for n in graph.nodes for r in n.inputs] + list(graph.outputs)
    used = sorted({r.index for r in refs if isinstance(r, Input)})
    new = {old: i for i, old in enumerate(used)}

    def remap(r: Ref) -> Ref:
        return Input(new[r.index]) if isinstance(r, Input) else r

    for n in graph.nodes:
        n.inputs = [remap(r) for r in n.inputs]
    graph.outputs = [remap(r) for r in graph.outputs]
    graph.input_shapes = [graph.input_shapes[i] for i in used]
    graph.input_dtypes = [graph.input_dtypes[i] for i in used]
    return [keys[i] for i in used], graph

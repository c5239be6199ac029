"""``JitFunction``: a function (or Cell method) run through a captured graph.

A call computes its signature (signature.py); the first call with a
signature traces the function (capture.py), which runs it eagerly (each op
once, as without jit), and has the backend build the graph; that call then
runs the built graph only when the graph is made of primitives alone (pure:
running them again changes nothing), else it returns the traced run's result,
so an op that writes in place (MarkDirty, mark_dirty, an aot inplace input)
writes once. Every later call runs the built graph, tracing and building
nothing, except a call recording a gradient through an op that wrote into
memory another tensor shares (a view), or wrote an input or a captured tensor:
it runs eagerly (``_eager_grad``). Called while another trace is recording, a
jitted function is inlined into that trace.
"""
from __future__ import annotations

import functools
import threading
import warnings
import weakref
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

import numpy as np

from ..autograd.grad_mode import _state, hooks_open, no_grad
from ..autograd.node import attach_outputs, edge_of
from ..graph.graph import Const, Graph, Input, Output
from ..graph.registry import Backend, Runner, get_backend
from ..call_rules import share_alias
from ..tensor import Tensor
from ..versions import UNWRITTEN, counter, memory_owner, share_version
from .signature import flatten_result, signature, unflatten_result
from .backward import BackwardGraph, build_backward, grad_sources
from .grad_node import JitGradNode
from .kept import CallContexts, active, keeping, no_history
from .capture import OutputShapeChanged, Tracer
from .guards import Guards, collect, too_many, with_grad_mode, with_grad_reads
from .tracing import hook

__all__ = ["JitFunction"]



@dataclass
class _Grad:
    """What a call that records a gradient runs: the forward also returning saved values, the backward."""
    forward: Runner
    backward: Runner
    plan: BackwardGraph
    # with opaque ops to keep (kept.py): the graph's tensor constants (never marked or handed out as a
    # call's own), the outputs handed out as they came (an opaque op's, so its saved-output version checks
    # see the caller's in-place writes), and the saved values given as new tensors (those same outputs:
    # the node holding them would otherwise make a cycle through its own output)
    consts: FrozenSet[int] = frozenset()
    reuse: FrozenSet[int] = frozenset()
    alias: FrozenSet[int] = frozenset()
    # outputs whose memory the backward reads: (position, what eager's version error names or None, whether
    # the op's own tensor, which a kept node may check, is to see a write to the output handed out)
    watch: Tuple[Tuple[int, Optional[str], bool], ...] = ()


@dataclass
class _Entry:
    graph: Graph
    run: Runner
    out_spec: Any
    grad_consts: bool  # a captured tensor (a Parameter, say) requires grad
    traced: Graph  # as traced, before the backend's rewrites
    grad: Dict[Tuple[bool, ...], _Grad] = field(default_factory=dict)  # per inputs requiring grad
    calls: int = field(default=0)
    consts: Tuple[Tuple[Tensor, Any, Any], ...] = ()  # captured tensors with their traced shape and dtype
    effects: bool = False  # an op other than a primitive (it may write its inputs, or count its runs)
    guards: Optional[Guards] = None  # the globals, closures and attributes the trace read (guards.py)
    next: Any = None  # another trace of this signature, for other values of what they read
    warned: bool = False  # a call recording a gradient ran eagerly (``eager_grad``) and said so
    # why a call recording a gradient runs eagerly (_eager_grad), or None: an op of the trace wrote memory
    # another tensor shares (traced.view_writes), or wrote an input or a captured tensor (traced.writes)
    eager_grad: Optional[str] = None

    def stale(self) -> bool:
        """A captured tensor (a Parameter, say) has another shape or dtype than when traced: the graph,
        and a fused kernel's loops, no longer fit it."""
        for t, shape, dtype in self.consts:
            d = t._data
            if d.shape != shape or d.dtype != dtype:
                return True
        return False


@dataclass
class _Eager:
    """A signature whose trace stopped (tracing.no_trace): the function runs eagerly for it."""
    reason: str
    calls: int = field(default=0)
    guards: Any = None  # it reads the current values: nothing to check (or, a variant: what must hold)
    next: Any = None  # (a variant: the signature's other traces)


def _keep_plan(graph: Graph, plan: BackwardGraph) -> Dict[str, FrozenSet[int]]:
    """``_Grad``'s ``consts``, ``reuse`` and ``alias`` for a plan with opaque ops to keep."""
    consts = frozenset(id(r.value) for n in graph.nodes for r in n.inputs
                       if isinstance(r, Const) and isinstance(r.value, Tensor))
    read = {r for i in plan.opaque for r in graph.nodes[i].inputs if isinstance(r, Output)}
    reuse, seen = set(), set()
    for k, r in enumerate(graph.outputs):
        # an opaque op's output, once, that no opaque op holds as an input (its node would then hold the
        # output, whose node holds the call's node: a cycle through the kept nodes)
        if isinstance(r, Output) and r.node in plan.opaque and r not in seen and r not in read:
            reuse.add(k)
        seen.add(r)
    handed = {graph.outputs[k] for k in reuse}
    alias = frozenset(j for j, (n, k) in enumerate(plan.saved) if Output(n, k) in handed)
    return {"consts": consts, "reuse": frozenset(reuse), "alias": alias}


def _watch_plan(graph: Graph, plan: BackwardGraph) -> Tuple[Tuple[int, Optional[str], bool], ...]:
    """``_Grad``'s ``watch``: the outputs that are forward values the backward reads.

    A primitive on a gradient's path that takes the value would, eagerly, fail its version check: the
    error names it. A value only a primitive's own derivative reads (``exp``'s output, say) is named as
    that op's output. A value an opaque op made or takes is checked by the node the op kept, on the op's
    own tensor, which the output handed out (a new tensor over the same memory) passes its writes to.
    """
    nodes = {n.id: n for n in graph.nodes}
    opaque_in = {(r.node, r.index) for i in plan.opaque for r in nodes[i].inputs if isinstance(r, Output)}
    watch = []
    for k, r in enumerate(graph.outputs):
        if isinstance(r, Input):  # an input handed back: as eagerly, a write to it is a write to the input
            reader = plan.readers.get(("in", r.index))
            watch.append((k, None if reader is None else f"argument {reader[0]} of {reader[1]}", True))
            continue
        if not isinstance(r, Output):
            continue
        key = (r.node, r.index)
        msg = None
        if key in plan.readers:
            j, name = plan.readers[key]
            msg = f"argument {j} of {name}"
        elif key in plan.prim_read:
            n = nodes[r.node]
            msg = f"output {r.index} of {getattr(n.target, 'name', n.op)}"
        kept = r.node in plan.opaque or key in opaque_in
        if msg is not None or kept:
            watch.append((k, msg, kept))
    return tuple(watch)


def _link_aliases(graph: Graph, tensors: Sequence[Tensor], outs: List[Any]) -> List[Any]:
    """``outs`` with each output over an input's or a captured tensor's memory (``Graph.out_alias``: the
    input returned, a slice, reshape or transpose of either, its detach()) sharing that tensor's version
    counter, as eager's would, so a write through either is seen by the version checks of nodes that saved
    the other; and, unless eager's was no view (detach()), made a view of it: its ``_base`` is that
    tensor's, so a write into it follows eager's view rules. An output the backend gave as a new tensor
    is re-wrapped (it may be a tensor the backend keeps); the input itself handed back stays as it is."""
    for k, r, view in graph.out_alias:
        o, t = outs[k], (tensors[r.index] if isinstance(r, Input) else r.value)
        if o is t or not isinstance(o, Tensor) or memory_owner(o._data) is not memory_owner(t._data):
            continue
        if o._node is None and o._base_ref is None:
            o = outs[k] = Tensor._from_array(o._data)
        if not view:
            if o._vc is not t._vc or o._vc is UNWRITTEN:  # (both may read the shared UNWRITTEN: one of their own)
                share_version(o, t)
        elif o._vc is not t._vc or o._vc is UNWRITTEN or o._base_ref is None:
            share_alias(o, t)
    return outs


def _view_reads(reads: List[Any], recheck: List[Tuple[int, Optional[int]]], saved: List[Any]) -> List[Any]:
    """``reads`` without the reads through a view (at ``recheck``: position, saved value) whose value this call
    made as a copy (a reshape, for some strides): eagerly that node saved the copy, which no write reaches."""
    drop = {i for i, k in recheck
            if k is None or memory_owner(saved[k]._data) is not memory_owner(reads[i][0]._data)}
    return [r for i, r in enumerate(reads) if i not in drop]


def _eager_grad_reason(graph: Graph) -> Optional[str]:
    """``_Entry.eager_grad`` of a traced graph."""
    if graph.view_writes:
        return graph.view_writes[0]
    if graph.writes:
        return graph.writes[0]
    return None


_VARIANTS = 8  # traces of one signature for other read values, after which it runs eagerly


class JitFunction:
    """What ``jit(fn)`` returns: callable like ``fn``, with one built graph per signature."""

    def __init__(self, fn: Callable[..., Any], backend: str, config: Dict[str, Any]) -> None:
        self.fn = fn
        self.backend: Backend = get_backend(backend)
        self.config = config
        self._cache: Dict[Tuple[Any, ...], _Entry] = {}
        self._lock = threading.RLock()  # re-entered by a call made after its trace stopped (eagerly)
        self.traces = 0  # how many times the function was traced (one per new signature or read value)
        self._missed: Optional[str] = None  # the last read (guards.py) that no longer held
        self.backward_traces = 0  # how many backward graphs were built (one per signature differentiated)
        # the state it rebinds is in its key (GRAPH_MODE's cell, its attributes as an argument): a trace
        # that rebinds what it read then needs no eager fallback here (nn/cell.py has its own rule)
        self.state_in_key = False
        self._rebinds: Dict[Tuple[Any, ...], str] = {}  # signatures whose last trace rebound what it read
        functools.update_wrapper(self, fn)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return functools.partial(self, obj)  # a Cell method: the instance is part of the signature

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if hook.tracer is not None:  # inside another trace: inline
            return self.fn(*args, **kwargs)
        if hooks_open[0] and _state.saved_hooks is not None and _state.enabled:
            # saved_tensors_hooks in force while a gradient is recorded: what each op saves goes through
            # them (pack as it is saved, unpack in backward), which a graph's saved values cannot do; the
            # call runs eagerly, op by op, and traces nothing (a later call without them replays)
            return self.fn(*args, **kwargs)
        key, tensors = signature(args, kwargs)
        entry = self._cache.get(key)
        if entry is not None and entry.guards is not None and not entry.guards.hold():
            entry = self._lookup(key)  # what the trace read changed: another trace, or a new one
        if entry is not None and type(entry) is not _Eager and entry.consts and entry.stale():
            with self._lock:
                self._cache.pop(key, None)
            entry = None
        if entry is None:
            entry, ran, out = self._build(key, tensors, args, kwargs, call=True)
            # this call traced, which ran it eagerly, each op once: with an op that may write or count its
            # runs (anything but a primitive) or a stopped trace, that run's result is the call's; a graph
            # of primitives only (pure functions) runs on the backend as every later call will
            if ran and (type(entry) is _Eager or entry.effects):
                entry.calls += 1
                return out
        entry.calls += 1
        if type(entry) is _Eager:  # its trace stopped: op by op, as without jit
            return self.fn(*args, **kwargs)
        try:
            if _state.enabled and (entry.grad_consts or any(t.requires_grad for t in tensors)):
                if entry.eager_grad is not None:  # eager's gradient through a write (see _eager_grad)
                    return self._eager_grad(entry, args, kwargs)
                outs = self._run_with_grad(entry, tensors)
            else:
                outs = entry.run(tensors)
                if entry.traced.out_alias:
                    outs = _link_aliases(entry.traced, tensors, outs)
        except OutputShapeChanged as e:
            return self._shape_changed(key, entry, e, args, kwargs)
        for k, first in entry.traced.out_repeats:  # one value at two positions: eagerly one tensor, one counter
            share_version(outs[k], outs[first])  # (both may still read the shared UNWRITTEN: one of their own)
        spec = entry.out_spec
        if type(spec) is int:
            return outs[spec]
        return unflatten_result(spec, outs)

    def _eager_grad(self, entry: _Entry, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """A call recording a gradient whose trace has an op writing memory another tensor shares (a view, or
        a base with views: ``Graph.view_writes``), or writing an input or a captured tensor in place
        (``Graph.writes``), runs eagerly, op by op, its ops recording as without jit.

        Eagerly a write into shared memory rebases the histories of the tensors over that memory (the view's
        base takes the op's gradient where the view sits: ``runtime.call_rules.rebase_view``, torch's
        CopySlices). A graph holds values, not memory: its backward would send the base's gradient past the
        write. And a gradient with a graph of its own (``create_graph``: ``rt.grad`` of an input that requires
        grad, grad of grad) needs the forward recorded op by op: the graph's saved values have no history, and
        running the forward again would write again (the values it read are gone). One implementation of the
        rules (eager's) gives every route the same gradients, and each call writes once; calls recording no
        gradient still run the graph, which writes the same memory as eagerly."""
        if not entry.warned:
            entry.warned = True
            warnings.warn(f"jit({getattr(self.fn, '__qualname__', 'graph')}): {entry.eager_grad}; a "
                          f"call of this signature that records a gradient runs eagerly, op by op, with the same "
                          f"results and gradients as without jit", RuntimeWarning, stacklevel=3)
        return self.fn(*args, **kwargs)

    def _shape_changed(self, key: Tuple[Any, ...], entry: _Entry, err: OutputShapeChanged,
                       args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """A replay whose opaque op returned other shapes than traced (``OutputShapeChanged``), raised before
        any later op of the graph ran: the signature runs eagerly from now on. A trace that writes no input or
        captured tensor in place runs this call again eagerly (its ops are functions of their inputs, so the
        second run of those that already ran gives the same values; the warning says they ran twice); one
        that writes (an input, a captured tensor, memory a view shares) is refused for this call, whose ops up
        to that op have run once."""
        name = getattr(self.fn, "__qualname__", "graph")
        with self._lock:
            self._cache[key] = _Eager(str(err))
        graph = entry.traced
        if graph.writes or graph.view_writes:
            wrote = (graph.writes or graph.view_writes)[0]
            raise RuntimeError(f"jit({name}): {err}; its trace writes in place ({wrote}), so this call, whose ops "
                               f"up to {err.op} ran once, is not run again: this signature runs eagerly from its "
                               f"next call") from None
        warnings.warn(f"jit({name}): {err}; this signature runs eagerly from now on, op by op, with the same "
                      f"results and gradients as without jit; this call runs again eagerly, so its ops up to "
                      f"{err.op} run twice (one that draws random numbers or keeps state sees both runs)",
                      RuntimeWarning, stacklevel=3)
        return self.fn(*args, **kwargs)

    def _lookup(self, key: Tuple[Any, ...]) -> Any:
        """The trace cached for ``key`` whose reads (globals, closures, attributes) still hold, or None."""
        entry = self._cache.get(key)
        while entry is not None and entry.guards is not None and not entry.guards.hold():
            self._missed = entry.guards.where
            entry = entry.next
        return entry

    def graph(self, *args: Any, **kwargs: Any) -> Graph:
        """The graph for this signature as its backend runs it (traced and built now if it was not)."""
        key, tensors = signature(args, kwargs)
        return self._captured(self._entry_for(key, tensors, args, kwargs)).graph

    def _entry_for(self, key: Tuple[Any, ...], tensors: List[Tensor], args: Tuple[Any, ...],
                   kwargs: Dict[str, Any]) -> Any:
        """The entry for ``key``, traced now if there is none (twice when the first trace did a first call's
        set-up, which is not kept)."""
        entry = self._lookup(key)
        for _ in range(2):
            if entry is not None and (type(entry) is not _Eager or key not in self._rebinds):
                break
            entry = self._build(key, tensors, args, kwargs)[0]
        return entry

    def backward_graph(self, *args: Any, **kwargs: Any) -> Graph:
        """The backward graph for this signature as its backend runs it (built now if it was not).

        Its inputs are the forward values it reads, the call's inputs and the
        output gradients; its outputs the gradients of the float tensor inputs
        (then of captured tensors that require grad) that some gradient reaches.
        """
        key, tensors = signature(args, kwargs)
        entry = self._entry_for(key, tensors, args, kwargs)
        wanted = tuple(t.requires_grad for t in tensors)
        if not any(wanted):  # plain tensors: the graph that differentiates every float input
            wanted = (True,) * len(tensors)
        if type(entry) is not _Eager and entry.traced.view_writes:
            raise RuntimeError(f"jit({getattr(self.fn, '__qualname__', 'graph')}): this signature has no backward "
                               f"graph: {entry.traced.view_writes[0]}, and a gradient through such a write is "
                               f"taken eagerly (the tensors over that memory are rebased as torch's CopySlices "
                               f"does, which a graph does not model); differentiate the call itself")
        if type(entry) is not _Eager and entry.traced.writes:
            raise RuntimeError(f"jit({getattr(self.fn, '__qualname__', 'graph')}): this signature has no backward "
                               f"graph: {entry.traced.writes[0]}, and a gradient through such a write is taken "
                               f"eagerly (each call writes once, and a gradient of the gradient needs the forward "
                               f"recorded op by op); differentiate the call itself")
        return self._grad(self._captured(entry), tensors, wanted).backward.graph  # type: ignore[attr-defined]

    def _captured(self, entry: Any) -> _Entry:
        if type(entry) is _Eager:
            raise RuntimeError(f"jit({getattr(self.fn, '__qualname__', 'graph')}): this signature has no graph; "
                               f"it runs eagerly because its trace stopped: {entry.reason}")
        return entry

    def _run_with_grad(self, entry: _Entry, tensors: List[Tensor]) -> List[Any]:
        """Run the forward with nothing recorded, then record one node whose backward is the backward graph."""
        wanted = tuple(t.requires_grad for t in tensors)
        g = entry.grad.get(wanted) or self._grad(entry, tensors, wanted)
        n = len(entry.traced.outputs)
        calls = None
        quiet: List[int] = []  # outputs this call's opaque ops gave no history (kept.no_history)
        edges = None
        # the versions the forward's readers will see: as eagerly, a later write to what they read fails
        reads = [(tensors[src[1]] if src[0] == "in" else src[1], off, f"argument {j} of {name}")
                 for src, j, name, off in g.plan.arg_reads]
        reads = [(t, t._vc.value + off, what) for t, off, what in reads]
        # reads through a view of a tensor whose strides differ from the trace's (its value may be a copy), or
        # through a copy that other strides may make a view: the value this call saves tells
        recheck = [(i, k) for i, (strides, k, seen) in g.plan.view_layouts.items()
                   if not seen or getattr(reads[i][0]._data, "strides", None) != strides] \
            if g.plan.view_layouts else None
        if not g.plan.opaque:
            with no_grad():
                res = g.forward(tensors)
            outs = [Tensor._from_array(o._data) for o in res[:n]]  # fresh: an output may be an input, or twice
            saved = list(res[n:])
        else:  # opaque ops keep the node they record (kept.py) for this call's backward
            external = g.consts.union(map(id, tensors))
            calls = CallContexts(g.plan.owner, external)
            # an op that writes an input requiring grad (MarkDirty, mark_dirty) moves the input's history
            # onto the node it kept: the call's node takes the histories the inputs had before the call
            edges = tuple(edge_of(t) if t.requires_grad else None for t in
                          (tensors[k[1]] if k[0] == "in" else k[1] for k in g.plan.sources))
            before = [(t._node, t._out_index) for t in tensors]
            prev = active.forward
            active.forward = calls
            try:
                with no_grad():
                    res = g.forward(tensors)
            finally:
                active.forward = prev
            # an input the call wrote and returns (its history moved) is handed out itself, as eagerly: its
            # history becomes the call's node's output, as a dirty input's becomes its op's
            moved = {id(t) for t, (nd, ix) in zip(tensors, before) if t._node is not nd or t._out_index != ix}
            outs = []
            for k, o in enumerate(res[:n]):
                if id(o) in moved:
                    moved.discard(id(o))  # once: a second position gets a new tensor over its memory
                elif not (k in g.reuse and o._node is not None and id(o) not in external):
                    o = Tensor._from_array(o._data)
                outs.append(o)
            saved = [Tensor._from_array(v._data) if j in g.alias else v for j, v in enumerate(res[n:])]
            # outputs this call's opaque ops gave no history, as eagerly (one handed out as the op's own tensor
            # carries the node it recorded over a stand-in history: a new tensor over its memory instead)
            quiet = no_history(entry.traced, tensors, calls)
            for k in quiet:
                if k < len(outs) and outs[k]._node is not None:
                    outs[k] = Tensor._from_array(outs[k]._data)
        if recheck:
            reads = _view_reads(reads, recheck, saved)
        if entry.traced.out_alias:
            _link_aliases(entry.traced, tensors, outs)
        # the version each output whose memory the backward reads had when handed out, with the op's own
        # tensor (when the output handed out is another over its memory) for a kept node to see a write in
        # (its counter too, held apart from it: a write after the output itself is gone still shows)
        watched = [(weakref.ref(outs[k]), counter(outs[k]), outs[k]._version, msg,
                    res[k] if kept and res[k] is not outs[k] else None)
                   for k, msg, kept in g.watch]
        node = JitGradNode(getattr(self.fn, "__qualname__", "graph"), entry.traced, g.plan, g.backward, tensors,
                           saved, outs, calls, watched, edges, reads)
        # as eagerly, only outputs a gradient flows from to an input (or captured tensor) requiring grad
        # require grad: those whose gradient the backward graph takes
        flows = {k[1] for k in g.plan.keys if k[0] == "grad"}
        flows.difference_update(quiet)  # (and not those this call's opaque ops gave no history)
        attach_outputs(node, [o if k in flows else None for k, o in enumerate(outs)])
        return outs

    def _grad(self, entry: _Entry, tensors: List[Tensor], wanted: Tuple[bool, ...]) -> _Grad:
        with self._lock:
            if wanted in entry.grad:
                return entry.grad[wanted]
            graph = entry.traced
            plan = build_backward(graph, tensors, grad_sources(graph, tensors, wanted))
            self.backward_traces += 1
            nodes = [replace(n, target=keeping(n, plan.opaque[n.id], plan.owner)) if n.id in plan.opaque else n
                     for n in graph.nodes]
            fwd = Graph(graph.input_shapes, graph.input_dtypes, nodes,
                        list(graph.outputs) + [Output(n, k) for n, k in plan.saved], name=graph.name)
            extra = _keep_plan(graph, plan) if plan.opaque else {}
            extra["watch"] = _watch_plan(graph, plan)
            backend = self.backend
            if not backend.differentiable:  # it runs calls that record nothing; gradients go to ms_backend
                backend = get_backend("ms_backend")
            config = self._config(list(tensors) + [t for t, _, _ in entry.consts])
            g = _Grad(backend.factory(fwd, dict(config)), backend.factory(plan.graph, dict(config)), plan, **extra)
            if not hasattr(g.backward, "graph"):
                g.backward.graph = plan.graph  # type: ignore[attr-defined]
            entry.grad[wanted] = g
            return g

    def _config(self, tensors: Sequence[Tensor]) -> Dict[str, Any]:
        """The backend's config for a signature: O1's fused kernels are host code, so a signature with
        a GPU tensor (an input or a captured one) runs at O0 (op by op, each op on the device)."""
        config = dict(self.config)
        if config.get("jit_level") == "O1" and any(type(t._data) is not np.ndarray for t in tensors):
            config["jit_level"] = "O0"
        return config

    def _uncached(self, key: Tuple[Any, ...], name: str, why: str) -> "_Eager":
        eager = _Eager(why)
        self._cache[key] = eager
        warnings.warn(f"jit({name}): not cached: {why}; this signature runs eagerly, op by op, with the same "
                      f"results and gradients as without jit", RuntimeWarning, stacklevel=5)
        return eager

    def _build(self, key: Tuple[Any, ...], tensors: List[Tensor], args: Tuple[Any, ...],
               kwargs: Dict[str, Any], call: bool = False) -> Tuple[Any, bool, Any]:
        """Trace the function for ``key`` and cache what the backend built (or ``_Eager`` when the trace
        stopped): (entry, whether the function ran here, its result).

        The trace is a real run of the function: each op runs once, for real, while it is recorded (an
        in-place op writes once). For a call (``call``) it runs with the caller's grad mode, so its
        result, gradients included, is the eager call's, which the caller returns instead of running the
        built graph again where that would run an op a second time. For ``graph()`` and
        ``backward_graph()`` it runs with nothing recorded."""
        with self._lock:
            entry = self._lookup(key)
            if entry is not None:
                return entry, False, None
            name = getattr(self.fn, "__qualname__", "graph")
            head = self._cache.get(key)
            variants = 0
            while head is not None and variants <= _VARIANTS:
                variants += 1
                head = head.next
            if variants >= _VARIANTS:  # not cached: eagerly, reading the values of the moment, as without jit
                eager = self._uncached(key, name, f"what it reads ({self._missed}) changed after each of "
                                                  f"{variants} traces of this signature")
                if not call:
                    return eager, False, None
                return eager, True, self.fn(*args, **kwargs)
            try:  # what it reads before it runs: a function that rebinds one (self.running = ...) is seen
                before = None if self.state_in_key else collect(self.fn, args, kwargs, missing=True)
            except Exception:  # noqa: BLE001  (said after the trace, where it is read again)
                before = None
            tracer = Tracer(tensors, name)
            with (nullcontext() if call else no_grad()), tracer:
                out = self.fn(*args, **kwargs)
            if tracer.stopped is not None:  # the rest of the call ran eagerly: so do later calls
                eager = _Eager(tracer.stopped)
                self._cache[key] = eager
                warnings.warn(f"jit({name}): not captured: {eager.reason}; this signature runs eagerly, op by "
                              f"op, with the same results and gradients as without jit", RuntimeWarning,
                              stacklevel=4)
                return eager, True, out
            rebound = before.rebound() if before is not None and not self.state_in_key else None
            if rebound is None:  # a .grad it read and then set (p.grad = p.grad * 0.5): the graph holds the first
                rebound = next((f"the .grad of a {type(t).__name__} of shape {t.shape}"
                                for t, g in tracer.grad_reads if t._grad is not g), None)
            if rebound is not None:
                # it rebinds what it reads (running statistics, a counter, a global): a replay would read
                # the value from before the trace and never rebind it. Once may be a first call's set-up
                # (self.cache = ... when None): not cached, the next call traces again; twice in a row, the
                # signature runs eagerly (as GRAPH_MODE's cells do)
                if self._rebinds.pop(key, None) is None:
                    self._rebinds[key] = rebound
                    return _Eager(f"it rebound {rebound}"), True, out
                chain = self._cache.get(key)
                eager = self._uncached(key, name, f"it changes what it reads ({rebound}) on each call, which "
                                                  f"a replay of its graph would not")
                # a variant while the reads it did not rebind hold (a BatchNorm's training flag): another
                # value of those (eval) traces again
                try:
                    after = collect(self.fn, args, kwargs)
                except Exception:  # noqa: BLE001
                    after = None
                moved = set(before.rebound(every=True)) if before is not None else set()
                moved.add(rebound)
                kept = [c for c in (after.checks if after is not None else ()) if c[6] not in moved]
                if kept and not too_many(after):
                    eager.guards, eager.next = Guards(kept), chain
                    self._cache[key] = eager
                return eager, True, out
            self._rebinds.pop(key, None)
            # what the trace read besides its arguments, as the trace left it (a statement of the function
            # runs at trace time only: a list it appends to is not read as changed by the next call)
            try:
                guards = collect(self.fn, args, kwargs)
            except Exception as e:  # noqa: BLE001  (an object that cannot be read plainly, too deep...)
                return self._uncached(key, name, f"what it reads could not be listed ({type(e).__name__}: "
                                                 f"{e})"), True, out
            if tracer.read_grad_mode:  # it asked for the grad mode: its graph holds for this mode only
                guards = with_grad_mode(guards, tracer._grad)
            if tracer.grad_reads:  # a .grad read is a constant of the graph: which tensor it is is guarded
                args_ids = {id(t) for t in tensors}
                if any(id(t) in args_ids for t, _ in tracer.grad_reads):  # (an argument's: another each call)
                    return self._uncached(key, name, "it reads the .grad of an argument, which a graph would "
                                                     "hold as the first call's"), True, out
                guards = with_grad_reads(guards, tracer.grad_reads)
            if too_many(guards):
                return self._uncached(key, name, f"it reads more than {len(guards) - 1} globals, closure "
                                                 f"variables and attributes"), True, out
            leaves: List[Any] = []
            spec = flatten_result(out, leaves)
            graph = tracer.finish(leaves)
            self.traces += 1
            grad_consts = any(isinstance(r, Const) and isinstance(r.value, Tensor) and r.value.requires_grad
                              for n in graph.nodes for r in n.inputs)
            captured = {id(r.value): r.value for n in graph.nodes for r in n.inputs
                        if isinstance(r, Const) and isinstance(r.value, Tensor)}
            run = self.backend.factory(graph, self._config(tensors + list(captured.values())))
            entry = _Entry(getattr(run, "graph", graph), run, spec, grad_consts, graph,
                           consts=tuple((t, t._data.shape, t._data.dtype) for t in captured.values()),
                           effects=any(n.kind != "primitive" for n in graph.nodes), guards=guards,
                           next=self._cache.get(key), eager_grad=_eager_grad_reason(graph))
            self._cache[key] = entry
            return entry, True, out

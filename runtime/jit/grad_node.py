"""The one autograd node a jitted call records: its backward runs the cached backward graph.

The forward ran on the backend with nothing recorded, also returning the
forward values the backward graph reads (``saved``); the opaque ops on a
gradient's path recorded their own nodes (``kept``, kept.py). ``apply`` feeds
the backward graph's runner those values, the call's inputs and the incoming
gradients, with ``kept`` as this thread's ``active.backward`` meanwhile. A
higher-order gradient (``create_graph``) cannot come from the saved values,
which have no history: it re-runs the forward graph with the runtime's ops,
recorded, and differentiates that, so grad of grad works.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from ..autograd.engine import grad as _autograd_grad
from ..autograd.grad_mode import enable_grad
from ..autograd.node import Node, edge_of
from ..graph.graph import Graph
from ..graph.registry import Runner
from ..tensor import Tensor
from .backward import BackwardGraph
from .kept import CallContexts, active

__all__ = ["JitGradNode"]


class JitGradNode(Node):
    __slots__ = ("_name", "inputs", "saved", "plan", "run", "forward", "nout", "kept", "watched", "reads")

    def __init__(self, name: str, forward: Graph, plan: BackwardGraph, run: Runner, inputs: Sequence[Tensor],
                 saved: List[Any], outs: Sequence[Any], kept: Optional[CallContexts] = None,
                 watched: Sequence[Tuple[Any, Any, int, Optional[str], Optional[Tensor]]] = (),
                 edges: Optional[Tuple[Any, ...]] = None,
                 reads: Sequence[Tuple[Tensor, int, str]] = ()) -> None:
        self._name = name
        # inputs and captured tensors the backward graph's primitives read, with the version each had when
        # its reader ran in the forward (eagerly that node saved it and checks it)
        self.reads = reads
        self.watched = watched
        self.kept = kept
        self.forward = forward
        self.plan = plan
        self.run = run
        self.inputs = list(inputs)
        self.saved = saved
        self.nout = len(outs)
        tensors = self._source_tensors()
        # ``edges``: the sources' histories as they were before the forward ran (it may have moved them)
        self.next_edges = edges if edges is not None else tuple(edge_of(t) if t.requires_grad else None
                                                                for t in tensors)
        self.input_meta = tuple((t._data.shape, t._data.dtype) for t in tensors)
        self.out_meta = tuple((o._data.shape, o._data.dtype) for o in outs)

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"jit({self._name})"

    def _source_tensors(self) -> List[Tensor]:
        return [self.inputs[k[1]] if k[0] == "in" else k[1] for k in self.plan.sources]

    def apply(self, grads: Sequence[Any], create_graph: bool) -> List[Any]:
        if self.saved is None:
            raise RuntimeError(f"backward through {self.name} a second time: its saved values were freed after "
                               f"the first backward; pass retain_graph=True the first time")
        if self.plan.stale is not None:
            raise RuntimeError(f"one of the tensors needed for gradient computation has been modified by an "
                               f"in-place operation: {self.plan.stale}")
        for t, version, what in self.reads:
            if t._vc.value != version:
                raise RuntimeError(f"one of the tensors needed for gradient computation has been modified by an "
                                   f"in-place operation: {what} is at version {t._version}; expected version "
                                   f"{version}")
        if self.watched:
            self._check_versions()
        if create_graph:
            return self._differentiable(grads)
        vals = {("val",) + nk: v for nk, v in zip(self.plan.saved, self.saved)}
        args = []
        for k in self.plan.keys:
            if k[0] == "in":
                args.append(self.inputs[k[1]])
            elif k[0] == "grad":
                args.append(grads[k[1]])
            else:
                args.append(vals[k])
        prev, prev_unused = active.backward, active.unused
        active.backward = self.kept if self.kept is not None else prev
        active.unused = unused = {}  # which opaque results were None (backward.py _opaque_backward)
        try:
            outs = self.run(args)
        finally:
            active.backward, active.unused = prev, prev_unused
        res: List[Any] = [None] * len(self.plan.sources)
        for s, g, none_with in zip(self.plan.outputs, outs, self.plan.unused_with or [None] * len(outs)):
            # eager's None: every opaque result this gradient comes from was None in this run
            res[s] = None if none_with is not None and all(unused.get(k, False) for k in none_with) else g
        return res

    def _check_versions(self) -> None:
        """Fail, as eagerly, when an output handed out whose memory the backward reads was written in place
        since: the op's own tensor over that memory takes the write (its kept node checks it, with the
        error eager gives), and a value a primitive reads fails here, naming it as eager's check does."""
        stale = None
        for ref, vc, version, msg, own in self.watched:
            out = ref()
            if out is not None:  # (its counter now: another may have taken over since)
                vc = out._vc
            now = vc.value
            if now == version:
                continue
            if own is not None and own._vc is not vc:  # (one counter: the write is already on it)
                own._version += now - version
            if msg is not None and stale is None:
                stale = (msg, now, version)
        if stale is not None:
            raise RuntimeError(f"one of the tensors needed for gradient computation has been modified by an "
                               f"in-place operation: {stale[0]} is at version {stale[1]}; expected version "
                               f"{stale[2]}")

    def _differentiable(self, grads: Sequence[Any]) -> List[Any]:
        """The gradients with a graph: the forward re-run op by op, recorded, then differentiated."""
        if self.forward.writes:
            raise RuntimeError(f"{self.name}: a gradient with create_graph=True re-runs the call's forward, but "
                               f"{self.forward.writes[0]} during the forward, so the values it read are gone "
                               f"and running it again would write it again; take this gradient without jit "
                               f"(or without create_graph)")
        sources = self._source_tensors()
        with enable_grad():
            outs = self.forward.run(self.inputs)
            pairs = [(o, g) for o, g in zip(outs, grads) if isinstance(o, Tensor) and o.requires_grad]
            want = [i for i, t in enumerate(sources) if t.requires_grad]
            gs = _autograd_grad([o for o, _ in pairs], [sources[i] for i in want],
                                grad_outputs=[g for _, g in pairs], create_graph=True, allow_unused=True)
        res: List[Any] = [None] * len(sources)
        for i, g in zip(want, gs):
            res[i] = g
        return res

    def release(self) -> None:
        self.saved = None
        self.inputs = []
        self.watched = ()
        self.reads = ()
        if self.kept is not None:
            self.kept.release()
            self.kept = None

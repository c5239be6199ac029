"""Nodes whose backward is a Python callable: ``Cell.bprop``, ``ops.Custom(bprop=)``.

``record_callback`` turns outputs computed with recording off into results of
one node. Outputs that are inputs, leaves that require grad, or results of
other nodes are aliased first (a new tensor over the same data), so recording
never rewrites another tensor's history.
"""
from __future__ import annotations

from typing import Any, Callable, List, Sequence

from .grad_mode import _state, set_grad_enabled
from .node import Node, attach_outputs, edge_of, meta_of
from .saved_hooks import hooks_in_force, unpacked
from .ownership import own_results
from ..tensor import Tensor, detached
from ..versions import counter

__all__ = ["CallbackNode", "record_callback", "needs_grad", "BpropBackward"]


def needs_grad(inputs: Sequence[Any]) -> bool:
    """Would an op on ``inputs`` be recorded now?"""
    if not _state.enabled:
        return False
    return any(isinstance(a, Tensor) and a.requires_grad for a in inputs)


class CallbackNode(Node):
    """``backward(grads, create_graph) -> grads per input``, written by a user."""

    __slots__ = ("_name", "_backward")
    strict = True

    def __init__(self, name: str, inputs: Sequence[Any], outputs: Sequence[Any],
                 backward: Callable[[List[Any], bool], Sequence[Any]]) -> None:
        self._name = name
        self._backward = backward
        self.next_edges = tuple(edge_of(a) if isinstance(a, Tensor) and a.requires_grad else None
                                for a in inputs)
        self.input_meta = tuple(meta_of(a) if isinstance(a, Tensor) else None for a in inputs)
        self.out_meta = tuple(meta_of(o) for o in outputs)

    @property
    def name(self) -> str:  # type: ignore[override]
        return self._name

    def apply(self, grads, create_graph):
        if self._backward is None:
            raise RuntimeError(f"backward through {self._name} a second time: what it saved was freed "
                               f"after the first backward; pass retain_graph=True the first time")
        res = self._backward(list(grads), create_graph)
        res = list(res) if type(res) is not list else res
        own_results(res, grads, create_graph)  # an input or `out` returned as a gradient: copied
        return res

    def release(self) -> None:
        self._backward = None


def record_callback(name: str, inputs: Sequence[Any], outputs: Sequence[Any],
                    backward: Callable[[List[Any], bool], Sequence[Any]]) -> List[Any]:
    """Record one node producing ``outputs``; returns the outputs to hand to the user."""
    input_ids = {id(a) for a in inputs if isinstance(a, Tensor)}
    outs = []
    for o in outputs:
        if not isinstance(o, Tensor):
            raise TypeError(f"{name} returned {type(o).__name__}; outputs of a differentiable op must be Tensors")
        # an input, another op's output, or one returned at an earlier position too (each position is its
        # own output, with its own gradient): a new tensor over the same memory, counting writes on its counter
        if id(o) in input_ids or o._node is not None or o.requires_grad or any(o is p for p in outs):
            o = detached(o)
        outs.append(o)
    node = CallbackNode(name, inputs, outs, backward)
    attach_outputs(node, outs)
    if isinstance(backward, BpropBackward):
        backward.watch(outs)
    return outs


class BpropBackward:
    """The backward of a node whose gradients come from a user's ``bprop(*inputs, out, dout)``.

    ``out`` and ``dout`` are one Tensor for a single-output forward, tuples otherwise; ``bprop`` returns
    a tuple with one gradient per input. It may leave out trailing gradients of inputs that need none
    (MindSpore code such as ``return (y,)`` for ``(x, y)`` with only x differentiated). ``None`` for an
    input means no gradient flows to it (a zero gradient), as a ``None`` from a ``Function``'s backward
    does (PyTorch's rule).

    What a bprop reads, its inputs and the forward's outputs, is what it saved for backward: checked
    for in-place writes since the forward (torch's rule for saved tensors: a named error, never the new
    values), or, inside ``saved_tensors_hooks``, given to the pack hook at the forward and read back
    through unpack (no version check: what pack kept is the hook's). ``watch(outs)`` takes the outputs
    as ``record_callback`` hands them out."""

    __slots__ = ("name", "inputs", "out_arrays", "single", "bprop", "needed", "versions", "out_versions",
                 "pack", "unpack", "packed", "packed_outs", "edges", "metas")

    def __init__(self, name: str, inputs: Sequence[Any], out_arrays: Sequence[Any], single: bool,
                 bprop: Callable[..., Any]) -> None:
        self.name, self.out_arrays, self.single, self.bprop = name, out_arrays, single, bprop
        self.needed = [isinstance(a, Tensor) and a.requires_grad for a in inputs]  # as when the forward ran
        self.out_versions: List[Any] = []
        hooks = hooks_in_force()
        self.pack = self.unpack = None
        if hooks is None:
            self.inputs = inputs
            self.versions = [a._vc.value if isinstance(a, Tensor) else None for a in inputs]
            return
        pack, unpack = hooks
        self.pack, self.unpack = pack, unpack
        self.packed = [pack(detached(a)) if isinstance(a, Tensor) else None for a in inputs]
        self.edges = [edge_of(a) if isinstance(a, Tensor) and a.requires_grad else None for a in inputs]
        self.metas = [meta_of(a) if isinstance(a, Tensor) else None for a in inputs]
        self.inputs = tuple(None if isinstance(a, Tensor) else a for a in inputs)  # the hook's copies only
        self.versions = []

    def watch(self, outs: Sequence[Any]) -> None:
        """The outputs bprop receives as ``out``: their versions now, or their packs inside the hooks."""
        if self.unpack is None:
            # the counter of the memory bprop's ``out`` reads (not the tensor: it may be rebound, and is not kept)
            self.out_versions = [(counter(o), o._vc.value) for o in outs]
        else:
            self.packed_outs = [self.pack(detached(o)) for o in outs]
            self.out_arrays = ()

    def _inputs(self, create_graph: bool) -> Sequence[Any]:
        if self.unpack is None:
            for i, (a, v) in enumerate(zip(self.inputs, self.versions)):  # read through the tensor: a write
                if v is not None and a._vc.value != v:                      # that rebinds it counts too
                    raise RuntimeError(_modified(f"input {i} of {self.name}", a._vc.value, v))
            for j, (vc, version) in enumerate(self.out_versions):
                if vc.value != version:
                    raise RuntimeError(_modified(f"output {j} of {self.name}", vc.value, version))
            return self.inputs
        return [a if p is None else unpacked(self.unpack, p, self.name, f"input {i}",
                                             self.edges[i] if create_graph else None, self.metas[i])
                for i, (a, p) in enumerate(zip(self.inputs, self.packed))]

    def __call__(self, grads: List[Any], create_graph: bool) -> Sequence[Any]:
        inputs = self._inputs(create_graph)
        if self.unpack is None:
            o = [Tensor._from_array(a) for a in self.out_arrays]
        else:
            o = [unpacked(self.unpack, p, self.name, f"output {j}") for j, p in enumerate(self.packed_outs)]
        out_v = o[0] if self.single else tuple(o)
        dout = grads[0] if self.single else tuple(grads)
        with set_grad_enabled(create_graph):
            res = self.bprop(*inputs, out_v, dout)
        if isinstance(res, Tensor) or not isinstance(res, (tuple, list)):
            raise TypeError(f"{self.name} must return a tuple with one gradient per input, "
                            f"got {type(res).__name__}")
        if len(res) > len(inputs) or any(self.needed[len(res):]):
            raise ValueError(f"{self.name} returned {len(res)} gradients for {len(inputs)} inputs")
        return res


def _modified(what: str, now: int, version: int) -> str:
    return (f"one of the tensors needed for gradient computation has been modified by an in-place operation: "
            f"{what} is at version {now}; expected version {version} (its bprop reads it)")

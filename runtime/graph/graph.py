"""``Graph``: what a trace recorded, in topological order.

A value in a graph is an ``Input`` (the i-th tensor argument of the traced
call), a ``Const`` (a Python value or a tensor captured by the function, kept
by reference so later in-place updates of a Parameter are seen) or an
``Output`` of an earlier node. A ``Node`` names its op, keeps the callable
that runs it (``target``), its inputs, its attributes (keyword arguments) and
the shapes and dtypes of its outputs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

__all__ = ["Graph", "Node", "Input", "Const", "Output", "Ref"]


@dataclass(frozen=True)
class Input:
    """The ``index``-th tensor argument of the call."""
    index: int

    def __str__(self) -> str:
        return f"%in{self.index}"


@dataclass(frozen=True, eq=False)
class Const:
    """A value fixed at trace time (a Python value, or a captured tensor held by reference)."""
    value: Any

    def __str__(self) -> str:
        v = self.value
        if hasattr(v, "_data"):
            return f"const[{_meta(v._data.shape, v._data.dtype)}]"
        return repr(v)


@dataclass(frozen=True)
class Output:
    """Output ``index`` of node ``node``."""
    node: int
    index: int = 0

    def __str__(self) -> str:
        return f"%{self.node}" if self.index == 0 else f"%{self.node}.{self.index}"


Ref = Union[Input, Const, Output]


def _meta(shape: Tuple[int, ...], dtype: Any) -> str:
    return f"{np.dtype(dtype).name}{list(shape)}"


@dataclass
class Node:
    """One op: ``target(*inputs, **attrs)`` gives ``len(out_shapes)`` tensors (``multi``: as a tuple)."""
    id: int
    op: str
    kind: str  # "primitive", "function", "cpp", "custom", "fused", or a backend's own
    target: Callable[..., Any]
    inputs: List[Ref]
    attrs: Dict[str, Any]
    out_shapes: List[Tuple[int, ...]]
    out_dtypes: List[np.dtype]
    multi: bool = False
    sub: Optional["Graph"] = None  # a fused node: the nodes it replaces

    def __str__(self) -> str:
        outs = ", ".join(_meta(s, d) for s, d in zip(self.out_shapes, self.out_dtypes))
        args = ", ".join(str(r) for r in self.inputs)
        attrs = "".join(f", {k}={v!r}" for k, v in self.attrs.items())
        return f"%{self.id} = {self.op}({args}{attrs}) -> {outs}"


@dataclass
class Graph:
    """Inputs (shape and dtype per tensor argument), nodes in topological order, outputs."""
    input_shapes: List[Tuple[int, ...]]
    input_dtypes: List[np.dtype]
    nodes: List[Node] = field(default_factory=list)
    outputs: List[Ref] = field(default_factory=list)
    name: str = "graph"
    # what an op of the trace wrote in place that the call does not own (an input, a captured tensor):
    # running the graph again writes it again (a higher-order gradient cannot re-run it)
    writes: List[str] = field(default_factory=list)
    # what an op of the trace wrote in place that shares its memory with another tensor of the call (a
    # view written, or a base one of whose views the trace made or took): eagerly the write rebases the
    # histories of the tensors over that memory (runtime.call_rules.rebase_view, torch's CopySlices), which
    # no graph models, so a call that records a gradient runs such a trace eagerly (jit/function.py)
    view_writes: List[str] = field(default_factory=list)
    # (node id, argument position) -> how many times an op of the trace wrote that argument (an input or a
    # captured tensor) in place before this node ran: eagerly a node saving the argument records the version
    # it read, which a replay's backward checks as pre-call version + this count (jit/grad_node.py)
    arg_writes: Dict[Tuple[int, int], int] = field(default_factory=dict)
    # (node id, argument position) -> (version read, version at the end of the trace) of an op's value that
    # a later op of the trace wrote in place: eagerly a backward through a node saving it always fails
    stale_reads: Dict[Tuple[int, int], Tuple[int, int]] = field(default_factory=dict)
    # (node id, output index) -> (version made, version at the end of the trace) of a primitive's output
    # that a later op of the trace wrote in place (a rule reading its output then fails eagerly)
    stale_outs: Dict[Tuple[int, int], Tuple[int, int]] = field(default_factory=dict)
    # (output position, Input or Const, view) of each output that was, when traced, over the memory of an
    # input (the input itself, or a view of it) or of a captured tensor (a view of it): eagerly it shares that
    # tensor's version counter, and is a view of it unless `view` is False (what detach() returns)
    out_alias: List[Tuple[int, "Ref", bool]] = field(default_factory=list)
    # (output position, the earlier position of the same value) of a value returned at two positions
    # (`return y, y`): eagerly one tensor, so the replay's two share one version counter
    out_repeats: List[Tuple[int, int]] = field(default_factory=list)
    # (node id, argument position) -> (Input or Const, writes to it before the read, its strides, whether a
    # view) of an op's value that was, when the node read it, a view of an input's or a captured tensor's
    # memory (one version counter): eagerly a node saving the view sees a later write to that tensor; a
    # replay's backward checks the tensor's version as pre-call version + the writes (jit/backward.py
    # ``arg_reads``). Whether a reshape views or copies depends on the strides: a call with other strides
    # checks the value it made, as does one of a primitive's copy of a non-contiguous tensor ("whether a
    # view" False), which other strides may make a view.
    view_reads: Dict[Tuple[int, int], Tuple["Ref", int, Any, bool]] = field(default_factory=dict)

    def __str__(self) -> str:
        ins = ", ".join(f"%in{i}: {_meta(s, d)}" for i, (s, d) in enumerate(zip(self.input_shapes,
                                                                              self.input_dtypes)))
        lines = [f"graph {self.name}({ins}) {{"]
        for n in self.nodes:
            lines.append("  " + str(n).replace("\n", "\n  "))
            if n.sub is not None:
                lines.extend("    | " + str(s) for s in n.sub.nodes)
        lines.append("  return " + ", ".join(str(r) for r in self.outputs))
        lines.append("}")
        return "\n".join(lines)

    def run_node(self, node: Node, args: Sequence[Any]) -> List[Any]:
        """Run one node on its input values with the runtime's own kernel; its outputs as a list."""
        out = node.target(*args, **node.attrs)
        return list(out) if node.multi else [out]

    def run(self, inputs: Sequence[Any]) -> List[Any]:
        """Interpret the graph node by node (the reference every backend must agree with)."""
        env: Dict[Tuple[int, int], Any] = {}

        def get(r: Ref) -> Any:
            if isinstance(r, Input):
                return inputs[r.index]
            if isinstance(r, Const):
                return r.value
            return env[(r.node, r.index)]

        for n in self.nodes:
            for k, v in enumerate(self.run_node(n, [get(r) for r in n.inputs])):
                env[(n.id, k)] = v
        return [get(r) for r in self.outputs]

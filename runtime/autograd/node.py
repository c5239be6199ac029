"""The graph's nodes: what the engine needs to know about one recorded op.

A node is created when an op runs with recording on and some input requires
grad. Output tensors point at it (``t._node``, ``t._out_index``); it points at
its inputs through ``next_edges``, one entry per op argument:

* ``None``: that argument needs no gradient (or is not a tensor);
* a ``Tensor``: a leaf that requires grad (its gradient is accumulated);
* ``(node, index)``: output ``index`` of an earlier node.

Edges are captured when the op runs, so later in-place ops that rebase a
tensor's history do not rewire older nodes.

Any object with the attributes below is a node; the C++ ``Function`` node
(include/opbuilder/autograd.h) implements the same protocol.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import numpy as np

__all__ = ["Node", "edge_of", "meta_of", "attach_outputs"]

Meta = Optional[Tuple[Tuple[int, ...], np.dtype]]


class Node:
    """Base class of Python-side nodes.

    ``input_meta[i]`` is ``(shape, numpy dtype)`` of argument ``i`` (``None``
    for non-tensors) so the engine can check and reduce returned gradients;
    ``out_meta`` likewise for outputs, to materialize missing output grads.
    """

    __slots__ = ("next_edges", "input_meta", "out_meta", "__weakref__")

    name = "Node"
    # None output grads arrive as zeros (False: as None)
    materialize_grads = True
    # user-written backward: a gradient of the wrong dtype is an error, not a cast
    strict = False
    # False: asking for a higher-order gradient through this node is an error
    differentiable = True

    def apply(self, grads: Sequence[Any], create_graph: bool) -> Sequence[Any]:
        """Input gradients (one per edge, ``None`` for none) from output gradients."""
        raise NotImplementedError

    def release(self) -> None:
        """Drop what was saved for backward (called after a backward pass)."""


def edge_of(t: Any):
    """The edge to a tensor that requires grad: itself if a leaf, else (node, index)."""
    node = t._node
    return t if node is None else (node, t._out_index)


def meta_of(t: Any) -> Meta:
    d = t._data
    return (d.shape, d.dtype)


def attach_outputs(node: Node, outputs: Sequence[Any]) -> None:
    """Make ``outputs`` the results of ``node`` (requires_grad, history); integer
    and bool outputs are not differentiable and stay out of the graph."""
    for i, t in enumerate(outputs):
        if t is not None and t._data.dtype.kind in "fcV":  # dtypes.GRAD_KINDS
            t._node = node
            t._out_index = i
            t.requires_grad = True


def double_backward_message(op: str) -> str:
    """The one error for a gradient of a gradient through ``op``, whose Backward records no graph: every
    route raises it (runtime/call_rules.py names it; torch_bridge.cpp spells the same words)."""
    return (f"{op}: double backward through an opbuilder operator is not supported: its Backward is "
            f"once-differentiable (create_graph=True, then a gradient of the gradient)")

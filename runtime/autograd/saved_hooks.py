"""saved_tensors_hooks: what a Function keeps for backward goes through two hooks (torch's rule).

Within ``with saved_tensors_hooks(pack, unpack):`` every tensor a Function saves for backward (a C++
``Function<T>``'s ``SaveForBackward``, a Python ``Function``'s ``save_for_backward``) is given to
``pack`` as the node is recorded, as a new tensor over its memory outside the graph, and backward
reads ``unpack(packed)`` instead of it, with no version check: what ``pack`` kept is the hook's, as in
``torch.autograd.graph.saved_tensors_hooks``. to_torch's Python path puts torch's hooks in force
here, so that what an operator saves goes through them on every route.

The pair in force lives in the per-thread grad state (``grad_mode._state.saved_hooks``), which the
C++ side reads (include/opbuilder/autograd.h, SavedTensorHooks).
"""
from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional, Tuple

from ..ops.op_entry import breaks_trace
from .grad_mode import _state, hooks_flag, hooks_open
from .node import Node

__all__ = ["saved_tensors_hooks", "current_saved_hooks", "hooks_in_force", "unpacked"]

Hooks = Tuple[Callable[[Any], Any], Callable[[Any], Any]]
_count_lock = threading.Lock()  # the open count is read-modify-write from any thread


def _count(step: int) -> None:
    with _count_lock:
        hooks_open[0] += step
        hooks_flag.value = hooks_open[0]


class saved_tensors_hooks:
    """Context manager: tensors saved for backward inside it go through ``pack`` (when saved) and
    ``unpack`` (when backward reads them). ``unpack`` must return a runtime.Tensor."""

    def __init__(self, pack_hook: Callable[[Any], Any], unpack_hook: Callable[[Any], Any]) -> None:
        if not callable(pack_hook) or not callable(unpack_hook):
            raise TypeError(f"saved_tensors_hooks takes two callables (pack, unpack), got "
                            f"{type(pack_hook).__name__} and {type(unpack_hook).__name__}")
        self.hooks: Hooks = (pack_hook, unpack_hook)
        self._local = threading.local()  # what each entry restores, per thread: one object, several threads

    # inside a function runtime.jit traces: a graph's saved values cannot go through the hooks, so the call
    # (and its signature) runs eagerly
    @breaks_trace("saved_tensors_hooks opened: what each op saves goes through the hooks")
    def __enter__(self) -> "saved_tensors_hooks":
        self._local.__dict__.setdefault("prev", []).append(_state.saved_hooks)
        _count(1)  # before the pair is in force: a reader that sees the pair sees the count
        _state.saved_hooks = self.hooks
        return self

    def __exit__(self, *exc: Any) -> None:
        _state.saved_hooks = self._local.prev.pop()
        _count(-1)


def current_saved_hooks() -> Optional[Hooks]:
    """The (pack, unpack) pair in force on this thread, or None."""
    return _state.saved_hooks


def hooks_in_force() -> Optional[Hooks]:
    """``current_saved_hooks()`` for the record paths: no per-thread read while no block is open anywhere."""
    return _state.saved_hooks if hooks_open[0] else None


class Reattach(Node):
    """The history of an unpacked saved tensor in a higher-order pass: its gradient goes unchanged to the
    edge of the tensor that was saved (torch's SavedVariable gives an unpacked tensor the saved one's
    ``grad_fn``), so a gradient of the gradient still reaches it."""

    __slots__ = ()
    name = "saved tensor unpacked by saved_tensors_hooks"

    def __init__(self, edge: Any, meta: Any) -> None:
        self.next_edges = (edge,)
        self.input_meta = (meta,)
        self.out_meta = (meta,)

    def apply(self, grads, create_graph):
        return [grads[0]]


def unpacked(unpack: Callable[[Any], Any], packed: Any, who: str, what: str, edge: Any = None,
             meta: Any = None) -> Any:
    """The unpack hook's tensor for ``packed`` (what the pack hook returned for ``what`` of ``who``): a
    runtime Tensor over its data, given the saved tensor's history through ``edge`` when not None."""
    from ..tensor import Tensor
    t = unpack(packed)
    if not isinstance(t, Tensor):
        raise TypeError(f"{who}: the saved_tensors_hooks unpack hook returned a {type(t).__name__} for "
                        f"{what}; it must return a runtime.Tensor")
    u = Tensor._from_array(t._data)
    if edge is not None:
        u._node, u.requires_grad = Reattach(edge, meta), True
    return u

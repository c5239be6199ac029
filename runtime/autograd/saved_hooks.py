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

from .grad_mode import _state, hooks_flag, hooks_open

__all__ = ["saved_tensors_hooks", "current_saved_hooks"]

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
        self._prev: List[Optional[Hooks]] = []

    def __enter__(self) -> "saved_tensors_hooks":
        self._prev.append(_state.saved_hooks)
        _count(1)  # before the pair is in force: a reader that sees the pair sees the count
        _state.saved_hooks = self.hooks
        return self

    def __exit__(self, *exc: Any) -> None:
        _state.saved_hooks = self._prev.pop()
        _count(-1)


def current_saved_hooks() -> Optional[Hooks]:
    """The (pack, unpack) pair in force on this thread, or None."""
    return _state.saved_hooks

"""Whether ops record the graph: a per-thread switch, as in PyTorch.

The C++ side reads ``_state.enabled`` directly (see include/opbuilder/detail/
runtime_bridge.h), through runtime/_native.py, which lists the names it uses.
"""
from __future__ import annotations

import contextlib
import ctypes
import threading
from typing import Callable, TypeVar

__all__ = ["is_grad_enabled", "set_grad_enabled", "no_grad", "enable_grad"]

F = TypeVar("F", bound=Callable)


class _GradState(threading.local):
    enabled = True
    saved_hooks = None  # (pack, unpack) of saved_hooks.saved_tensors_hooks in force, read by C++ too


_state = _GradState()

# How many saved_tensors_hooks contexts are open, in all threads (saved_hooks.py keeps it). While it is
# 0, which is almost always, the record paths skip the per-thread read of ``_state.saved_hooks`` (a
# thread-local lookup costs ~400 instructions, 2-3% of a recorded 1-element op): Python reads
# ``hooks_open[0]``, C++ the int at ``hooks_flag_address()``.
hooks_open = [0]
hooks_flag = ctypes.c_int(0)


def hooks_flag_address() -> int:
    """The address of ``hooks_flag`` (read by C++ before it looks up ``_state.saved_hooks``)."""
    return ctypes.addressof(hooks_flag)


def is_grad_enabled() -> bool:
    return _state.enabled


class set_grad_enabled(contextlib.ContextDecorator):
    """Context manager (and decorator) that turns recording on or off."""

    def __init__(self, mode: bool) -> None:
        self._mode = bool(mode)
        self._prev: list = []

    def __enter__(self) -> None:
        self._prev.append(_state.enabled)
        _state.enabled = self._mode

    def __exit__(self, *exc) -> None:
        _state.enabled = self._prev.pop()


def no_grad() -> set_grad_enabled:
    """``with runtime.no_grad():`` runs ops without recording them."""
    return set_grad_enabled(False)


def enable_grad() -> set_grad_enabled:
    return set_grad_enabled(True)

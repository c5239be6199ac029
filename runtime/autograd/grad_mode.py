"""Whether ops record the graph: a per-thread switch, as in PyTorch.

The C++ side reads ``_state.enabled`` directly (see include/opbuilder/detail/
runtime_bridge.h), through runtime/_native.py, which lists the names it uses.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import inspect
import threading
from typing import Any, Callable, Optional, Tuple, TypeVar

__all__ = ["is_grad_enabled", "set_grad_enabled", "no_grad", "enable_grad"]

F = TypeVar("F", bound=Callable)


class _GradState(threading.local):
    enabled = True
    watch = None  # a jit trace recording in this thread: is_grad_enabled() tells it the mode was read
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
    s = _state
    if s.watch is not None:  # a function jit traces branches on the mode: its graph holds for this mode only
        s.watch.note_grad_mode()
    return s.enabled


class _GradMode(contextlib.ContextDecorator):
    """Context manager (and decorator) that turns recording on or off in this thread. What each entry
    restores is kept per thread, so one object (a decorator's) used by several threads at once restores
    each thread's own mode, never another's."""

    def __init__(self, mode: bool) -> None:
        self._mode = bool(mode)
        self._local = threading.local()

    def __enter__(self) -> None:
        self._push(_state.enabled)

    def _push(self, prev: bool) -> None:
        self._local.__dict__.setdefault("prev", []).append(prev)
        _state.enabled = self._mode

    def __exit__(self, *exc) -> None:
        _state.enabled = self._local.prev.pop()

    def __call__(self, fn: F) -> F:
        """A decorator; a generator function's body runs in the mode at each step, as torch's."""
        if not inspect.isgeneratorfunction(fn):
            return super().__call__(fn)

        @functools.wraps(fn)
        def steps(*args: Any, **kwargs: Any) -> Any:
            try:
                with self:
                    gen = fn(*args, **kwargs)
                    item = next(gen)
                while True:
                    try:
                        sent = yield item
                    except GeneratorExit:
                        with self:
                            gen.close()
                        raise
                    except BaseException as e:  # thrown in: into the body, in the mode
                        with self:
                            item = gen.throw(e)
                    else:
                        with self:
                            item = gen.send(sent)
            except StopIteration as done:  # the body returned: this generator returns the same
                return done.value
        return steps  # type: ignore[return-value]


class set_grad_enabled(_GradMode):
    """``set_grad_enabled(mode)`` sets recording on or off in this thread at once, as torch's function
    form does; ``with set_grad_enabled(mode):`` restores the mode before it on exit; as a decorator it
    changes nothing until the function runs."""

    def __init__(self, mode: bool) -> None:
        super().__init__(mode)
        self._before: Optional[Tuple[int, bool]] = (threading.get_ident(), _state.enabled)  # for a `with` next
        _state.enabled = self._mode

    def __enter__(self) -> None:
        before, self._before = self._before, None
        self._push(before[1] if before is not None and before[0] == threading.get_ident() else _state.enabled)

    def __call__(self, fn: F) -> F:  # a decorator: the mode was not meant to change when it was made
        before, self._before = self._before, None
        if before is not None and before[0] == threading.get_ident():
            _state.enabled = before[1]
        return super().__call__(fn)


def no_grad(fn: Optional[F] = None) -> Any:
    """``with runtime.no_grad():`` runs ops without recording them; ``@no_grad()`` (or ``@no_grad``) a
    function."""
    return _GradMode(False) if fn is None else _GradMode(False)(fn)


def enable_grad() -> _GradMode:
    return _GradMode(True)

"""The limits a thread puts on the builds it runs: a deadline, no progress lines, and a stop.

``load_many`` runs each item inside ``time_limit``; ``run_ninja`` (ninja_run.py) reads them. A module
of its own, importing nothing slow: a warm ``load_many`` never imports ninja_run (subprocess...).
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Optional, Tuple

__all__ = ["time_limit", "deadline", "quiet", "stopping", "stop_event", "check_stop", "BuildStopped"]

_state = threading.local()  # deadline (time.monotonic()), seconds, quiet: this thread's, while time_limit runs
# and stop: the Event an interrupted load_many sets (stopping), seen by the threads its builds start too


class BuildStopped(KeyboardInterrupt):
    """A build not started (or abandoned) because the load_many that runs it was interrupted: no
    compiler may outlive the call. A KeyboardInterrupt, as the interrupt it carries on."""


@contextmanager
def time_limit(seconds: Optional[float], quiet: bool = False) -> Iterator[None]:
    """Within the block, each ``run_ninja`` in this thread must end within ``seconds`` of the block's
    start (None: no limit), else it and every process it started are killed and it raises
    ``BuildTimeout``; with ``quiet``, it writes no progress lines (load_many runs many at once)."""
    before = (getattr(_state, "deadline", None), getattr(_state, "seconds", None), getattr(_state, "quiet", False))
    _state.deadline = None if seconds is None else time.monotonic() + seconds
    _state.seconds = seconds
    _state.quiet = quiet
    try:
        yield
    finally:
        _state.deadline, _state.seconds, _state.quiet = before


def deadline() -> Tuple[Optional[float], Optional[float]]:
    """(the deadline on time.monotonic()'s clock, the seconds it was given) of this thread; (None, None)."""
    return getattr(_state, "deadline", None), getattr(_state, "seconds", None)


def quiet() -> bool:
    """True when this thread's builds write no progress lines."""
    return getattr(_state, "quiet", False)


@contextmanager
def stopping(event: Optional[threading.Event]) -> Iterator[None]:
    """Within the block, this thread's builds stop once ``event`` is set (None: never): ``check_stop``
    raises ``BuildStopped``. A thread a build starts (a dependency's build) passes its ``stop_event``
    on, so an interrupted load_many starts no compiler anywhere."""
    with thread_setting(_state, "stop", event):
        yield


@contextmanager
def thread_setting(local: threading.local, name: str, value: Any) -> Iterator[None]:
    """``local.<name>`` is ``value`` within the block (this thread only), then what it was."""
    before = getattr(local, name, None)
    setattr(local, name, value)
    try:
        yield
    finally:
        setattr(local, name, before)


def stop_event() -> Optional[threading.Event]:
    """This thread's stop (``stopping``), to pass on to a thread it starts; None if none."""
    return getattr(_state, "stop", None)


def check_stop(what: str) -> None:
    """``BuildStopped`` if this thread's builds were told to stop (``what``: the build, for its words)."""
    event = getattr(_state, "stop", None)
    if event is not None and event.is_set():
        raise BuildStopped(f"{what}: stopped, since the load_many running it was interrupted")

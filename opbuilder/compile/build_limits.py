"""The limits a thread puts on the builds it runs: a deadline, and no progress lines.

``load_many`` runs each item inside ``time_limit``; ``run_ninja`` (ninja_run.py) reads them. A module
of its own, importing nothing slow: a warm ``load_many`` never imports ninja_run (subprocess...).
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator, Optional, Tuple

__all__ = ["time_limit", "deadline", "quiet"]

_state = threading.local()  # deadline (time.monotonic()), seconds, quiet: this thread's, while time_limit runs


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

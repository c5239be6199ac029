"""What a full warm lookup depended on, noted as it runs (warm.py writes it down after).

Its own module, importing nothing of opbuilder at all: the toolchain's fact cache
(tools/probe_cache.py) and the builder note into it, and warm_write.py's ``remember`` writes the
record that warm.py reads (a warm load() imports that module only).
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

__all__ = ["SETTLE_NS", "Seen", "collecting", "note_stamps", "note_lookup", "seen_now"]

SETTLE_NS = 100_000_000  # well over a file clock's tick (probe_cache.SETTLE_NS)
_local = threading.local()

Stamp = Optional[List[int]]


class Seen:
    """What one full lookup depended on, noted as it ran (per thread)."""

    def __init__(self) -> None:
        self.start_ns = time.time_ns()
        self.stamps: List[Tuple[str, Stamp]] = []
        self.unstamped = False  # a fact used that no stamp vouches for
        self.lookups: dict = {}  # full key -> [(header path, missing)]


class collecting:
    """``with collecting():`` around a full lookup: what it depends on is noted (``note_*``) for
    ``remember``. Nested uses share the outer one."""

    def __enter__(self) -> Optional[Seen]:
        self.outer = getattr(_local, "seen", None)
        if self.outer is None:
            _local.seen = Seen()
        return _local.seen

    def __exit__(self, *exc) -> None:
        if self.outer is None:
            _local.seen = None


def note_stamps(stamps: Optional[Sequence[Sequence]]) -> None:
    """A toolchain fact was used: the (path, stamp) pairs it holds while valid; None: it holds none
    (it was probed and not stored), so nothing about this lookup is remembered."""
    seen = getattr(_local, "seen", None)
    if seen is None:
        return
    if stamps is None:
        seen.unstamped = True
    else:
        seen.stamps += [(str(p), s) for p, s in stamps]


def note_lookup(key: str, headers: Sequence[Tuple[str, bool]]) -> None:
    """The lookup found build ``key`` for the headers of its manifest ((path, missing) each)."""
    seen = getattr(_local, "seen", None)
    if seen is not None:
        seen.lookups[key] = list(headers)


def seen_now() -> Optional[Seen]:
    """What the lookup running in this thread (under ``collecting``) has noted; None outside one."""
    return getattr(_local, "seen", None)

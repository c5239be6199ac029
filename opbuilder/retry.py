"""The builder's one retry loop: why a pass over lookup, build and use is run again, and how often.

A pass (builder.py) looks the library up, builds it under the lock if it
must, and uses it (checks it is there, or imports it). Three things outside
our control can spoil a pass; each raises ``Retry`` with its ``Reason`` and
``retrying`` runs the pass again, at most ``MAX_PASSES`` times in all, logging
why at debug level. When the last pass is spoiled too, the error it carried
is raised (the loader's, a missing file's), else a ``BuildError`` that says
what kept happening.
"""
from __future__ import annotations

import enum
from typing import Callable, Optional, TypeVar

from .errors import BuildError

__all__ = ["Reason", "Retry", "MAX_PASSES", "retrying"]

T = TypeVar("T")

# One pass, and two more: a source saved twice while it compiles, or a library the loader rejects
# twice (each time forgotten and built again), still ends in a result.
MAX_PASSES = 3


class Reason(enum.Enum):
    """Why a pass is run again; the value says it in a log line."""

    INPUT_CHANGED = "an input changed while it was being compiled (or the precompiled header was removed)"
    PRUNED = "the library was removed (cache clean, pruning by another process) between its lookup and its use"
    REJECTED = "the loader rejected a library that passed its checks; it was forgotten, to be built again"


# What is said when every pass ended with the same trouble and it carried no error of its own.
_GIVE_UP = {
    Reason.INPUT_CHANGED: "its sources kept changing (or the cache was being cleaned) while they were being "
                          "compiled; save them and load again",
    Reason.PRUNED: "its library kept being removed (cache clean, or another process pruning old builds) "
                   "between its lookup and its use; load again once that is done",
    Reason.REJECTED: "the loader kept rejecting its library",
}


class Retry(Exception):
    """Raised inside a pass that should be run again, with why and the error that spoiled it (if any)."""

    def __init__(self, reason: Reason, error: Optional[BaseException] = None) -> None:
        super().__init__(reason.value)
        self.reason = reason
        self.error = error


def retrying(name: str, attempt: Callable[[], T]) -> T:
    """``attempt()``'s result, running it again (``MAX_PASSES`` times in all) while it raises ``Retry``.

    ``name`` is the operator's, for the log and the final error."""
    for n in range(1, MAX_PASSES + 1):
        try:
            return attempt()
        except Retry as r:
            spoiled = r
        import logging

        logging.getLogger("opbuilder").debug("%s: pass %d of %d spoiled: %s%s", name, n, MAX_PASSES,
                                             spoiled.reason.value, "; trying again" if n < MAX_PASSES else "")
    # every pass was spoiled: the last one's error, or what kept happening
    if spoiled.error is not None:
        raise spoiled.error
    raise BuildError(f"building operator '{name}' failed: {_GIVE_UP[spoiled.reason]}", name=name)

"""Version counters: one per piece of memory, shared by every Tensor over it (as PyTorch's).

A tensor's ``_version`` is ``tensor._vc.value``. Views (reshape, slicing,
transpose, broadcast, a cast to its own dtype), ``detach()`` and
``from_numpy`` of one array count writes on the counter of the memory they
view, so a write through any of them is seen by the version check of a
gradient node that saved another.

A new tensor reads the shared ``UNWRITTEN`` counter (0) and gets a counter of
its own only when it is first written or viewed: making a tensor costs
nothing more.
"""
from __future__ import annotations

import weakref
from operator import attrgetter
from typing import Any, Dict, Tuple

__all__ = ["Version", "UNWRITTEN", "version_of", "counter", "set_version", "share_version", "rebind",
           "memory_owner", "owner_counter"]


class Version:
    """The write count of one piece of memory."""

    __slots__ = ("value",)

    def __init__(self, value: int = 0) -> None:
        self.value = value


UNWRITTEN = Version()  # every tensor's default: read as 0, never written (a write gives the tensor its own)
version_of = attrgetter("_vc.value")  # a tensor's version without a Python-level call (the recording hot path)


def counter(t: Any) -> Version:
    """``t``'s own counter (given one now if it still reads ``UNWRITTEN``): held apart from ``t``, it
    still sees every later write of ``t``'s memory."""
    vc = t._vc
    if vc is UNWRITTEN:
        t._vc = vc = Version()
    return vc


def set_version(t: Any, value: int) -> None:
    """``t._version = value`` (an in-place write, here or from C++): on ``t``'s counter."""
    vc = t._vc
    if vc is UNWRITTEN:
        t._vc = vc = Version()
    vc.value = value


def share_version(view: Any, base: Any) -> None:
    """``view`` is over ``base``'s memory: from now on both count writes on one counter."""
    vc = base._vc
    if vc is UNWRITTEN:
        base._vc = vc = Version()
    view._vc = vc


def rebind(t: Any, arr: Any) -> None:
    """``t`` now holds ``arr``, memory of its own: it leaves the counter of the memory it viewed
    (whose other views are unchanged), keeping its version; the caller bumps it for the write."""
    t._data = arr
    t._vc = Version(t._vc.value)


def memory_owner(arr: Any) -> Any:
    """The array that owns ``arr``'s memory (or the foreign object under it): the end of ``.base``."""
    while True:
        b = getattr(arr, "base", None)
        if b is None:
            return arr
        arr = b


_owners: Dict[int, Tuple[Any, Version]] = {}  # id(memory owner) -> (weak reference to it, its counter)


def owner_counter(arr: Any, default: Version) -> Version:
    """The counter kept for the memory owner of ``arr`` (``from_numpy``: every tensor made over one
    array shares it); ``default`` where the owner takes no weak reference (bytes)."""
    owner = memory_owner(arr)
    key = id(owner)
    entry = _owners.get(key)
    if entry is not None and entry[0]() is owner:
        return entry[1]
    try:
        ref = weakref.ref(owner, lambda _, key=key: _owners.pop(key, None))
    except TypeError:
        return default
    vc = Version()
    _owners[key] = (ref, vc)
    return vc

"""Every gradient handed to the user owns memory that nothing else references.

Two ways a gradient can come back over memory something else holds:

* inside one pass: a rule hands one tensor to two inputs (``add``), or a view
  of another gradient (``transpose``'s), or a caller's ``gradient=`` reaches a
  leaf unchanged. ``claim`` finds these when the engine hands gradients out, by
  comparing memory (the object owning it, then the exact overlap);
* from outside the pass: a user's backward (a Python ``Function``, a ``bprop``)
  returns a saved tensor, an input, or a tensor it also keeps. ``own_results``
  copies such a result where the node returns it, unless it is fresh (no other
  reference to it or to the arrays its memory comes through, as PyTorch's
  AccumulateGrad decides by reference counts) or over an incoming gradient's
  memory (then ``claim`` sees to it). The C++ node does the same in C++
  (include/opbuilder/detail/function_node.h).

A fresh gradient, the common case, is never copied.
"""
from __future__ import annotations

import sys
from typing import Any, Dict, List, Sequence

import numpy as np

from ..ops import math as _math
from ..tensor import Tensor

__all__ = ["memory_root", "claim", "fresh", "own_results", "private_copy"]

try:
    _TooHard = np.exceptions.TooHardError
except AttributeError:  # numpy < 1.25
    _TooHard = np.TooHardError  # type: ignore[attr-defined]

# Exact overlap of two views of one buffer is a small integer program; past this much
# work the views are taken to overlap (a copy too many, never one too few).
_MAX_WORK = 10_000


def memory_root(arr: Any) -> Any:
    """The object that owns ``arr``'s memory: the end of its ``base`` chain."""
    base = arr.base
    while base is not None:
        arr = base
        base = getattr(arr, "base", None)  # a capsule, bytes or mmap ends the chain
    return arr


def _overlap(a: Any, b: Any) -> bool:
    if type(a) is np.ndarray and type(b) is np.ndarray:
        if not np.may_share_memory(a, b):
            return False
        try:
            return bool(np.shares_memory(a, b, max_work=_MAX_WORK))
        except _TooHard:
            return True
    return True  # device arrays over one allocation: assume they overlap


def claim(claimed: Dict[int, List[Any]], arr: Any) -> bool:
    """Record ``arr``'s memory in ``claimed``; False if it overlaps memory recorded before."""
    key = id(memory_root(arr))
    others = claimed.get(key)
    if others is None:
        claimed[key] = [arr]  # arr keeps its root alive, so the id stays its own
        return True
    for o in others:
        if _overlap(arr, o):
            return False
    others.append(arr)
    return True


# ---- fresh results: reference counts ------------------------------------------------
def _refs_item(holder: Sequence[Any], i: int) -> int:
    return sys.getrefcount(holder[i])


def _refs_data(t: Any) -> int:
    return sys.getrefcount(t._data)


def _refs_base(arr: Any) -> int:
    return sys.getrefcount(arr.base)


_NOT_AN_ARRAY = object()


class _Probe:
    _data: Any = None


def _baselines():
    """The counts of objects referenced once, measured the way ``fresh`` measures them (the
    interpreter's own references differ between Python versions)."""
    probe = _Probe()
    probe._data = np.empty(2)
    return _refs_item([object()], 0), _refs_data(probe), _refs_base(np.empty(2)[:1])


_ITEM, _DATA, _BASE = _baselines()


def fresh(holder: Sequence[Any], i: int) -> bool:
    """``holder[i]`` (a Tensor or array) is referenced by ``holder`` alone, and so is each array
    its memory comes through, down to an array that owns its memory."""
    if _refs_item(holder, i) > _ITEM:
        return False
    x = holder[i]
    if isinstance(x, Tensor):
        if _refs_data(x) > _DATA:
            return False
        x = x._data
    kind = type(x)
    base = getattr(x, "base", _NOT_AN_ARRAY)
    if base is _NOT_AN_ARRAY:
        return True  # not a gradient: the engine's checks name it
    while base is not None:
        if type(base) is not kind:
            return False  # memory owned by another kind of object (bytes, mmap, a C++ capsule)
        del base
        if _refs_base(x) > _BASE:
            return False
        x = x.base
        base = x.base
    return True


def private_copy(g: Any, create_graph: bool) -> Any:
    """``g`` (a Tensor or array) with its values in memory of its own; a Tensor keeps its graph
    when one is built."""
    if not isinstance(g, Tensor):
        return g.copy()
    if create_graph and g.requires_grad:
        return _math.mul(g, 1)
    return Tensor._from_array(g._data.copy())


def own_results(res: List[Any], incoming: Sequence[Any], create_graph: bool) -> None:
    """Copy, in place, each gradient in ``res`` (what a user's backward returned: Tensors,
    arrays or None) that is neither fresh nor over an incoming gradient's memory."""
    internal = None
    for i in range(len(res)):
        if res[i] is None or fresh(res, i):
            continue
        r = res[i]
        if internal is None:
            internal = {id(memory_root(g._data)) for g in incoming if g is not None}
        arr = r if type(r) is np.ndarray else getattr(r, "_data", None)
        if arr is None:
            continue  # not a gradient: the engine's checks name it
        if id(memory_root(arr)) not in internal:
            res[i] = private_copy(r, create_graph)

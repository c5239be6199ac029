"""The cache key of a jitted call, and flattening of arguments and results.

The key holds, per argument leaf, a tensor's shape, dtype and device (and which
earlier argument it is, when the same tensor is passed twice) or a plain
value itself (hashable values by value, floats by their bits, numpy arrays by
their contents, other values by identity, held so that no other object takes
their id). A new key means
a new trace; the same key reuses the built graph.
"""
from __future__ import annotations

import hashlib
from typing import Any, Dict, List, Tuple

import numpy as np

from ..device import device_of
from ..tensor import Tensor

__all__ = ["signature", "flatten_result", "unflatten_result"]

_DEVICE = "CPU"  # a numpy array's (a graph traced with GPU inputs holds constants on that GPU)


class _Same:
    """An unhashable argument keyed by identity; holding it keeps its id from being reused by another
    object (a freed array's id often is), which would otherwise find this object's graph."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: Any) -> bool:
        return type(other) is _Same and other.obj is self.obj


def _leaf_key(x: Any) -> Any:
    if isinstance(x, float):  # by its bits: 0.0 and -0.0 differ, and NaN is equal to itself
        return ("f", type(x), float(x).hex())
    if isinstance(x, np.ndarray):  # by value: a graph keeps an array's contents as they were
        return ("nd", x.shape, x.dtype.str, hashlib.blake2b(np.ascontiguousarray(x).tobytes()).digest())
    try:
        hash(x)
    except TypeError:
        return ("id", _Same(x))
    return ("v", type(x), x)


def _walk(x: Any, tensors: List[Tensor], seen: Dict[int, int], key: List[Any]) -> None:
    if isinstance(x, Tensor):
        first = seen.get(id(x))
        if first is None:
            seen[id(x)] = len(tensors)
            tensors.append(x)
            a = x._data
            key.append((a.shape, a.dtype.str, _DEVICE if type(a) is np.ndarray else device_of(a)))
        else:
            key.append(("same", first))
    elif type(x) in (tuple, list):
        key.append((type(x), len(x)))
        for y in x:
            _walk(y, tensors, seen, key)
    elif type(x) is dict:
        key.append((dict, tuple(x)))
        for y in x.values():
            _walk(y, tensors, seen, key)
    else:
        key.append(_leaf_key(x))


def signature(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Tuple[Any, ...], List[Tensor]]:
    """(cache key, the distinct tensors in argument order)."""
    tensors: List[Tensor] = []
    key: List[Any] = []
    seen: Dict[int, int] = {}
    for a in args:
        if type(a) is Tensor and id(a) not in seen:  # the common case, inline
            seen[id(a)] = len(tensors)
            tensors.append(a)
            d = a._data
            key.append((d.shape, d.dtype.str, _DEVICE if type(d) is np.ndarray else device_of(d)))
        else:
            _walk(a, tensors, seen, key)
    if kwargs:
        key.append(tuple(kwargs))
        for v in kwargs.values():
            _walk(v, tensors, seen, key)
    return tuple(key), tensors


def flatten_result(out: Any, leaves: List[Any]) -> Any:
    """A spec of ``out``'s structure; its tensors appended to ``leaves``."""
    if isinstance(out, Tensor):
        leaves.append(out)
        return len(leaves) - 1
    if type(out) in (tuple, list):
        return (type(out), [flatten_result(o, leaves) for o in out])
    return ("const", out)


def unflatten_result(spec: Any, values: List[Any]) -> Any:
    """Rebuild a result from its spec and its tensors."""
    if type(spec) is int:
        return values[spec]
    if spec[0] == "const":
        return spec[1]
    return spec[0](unflatten_result(s, values) for s in spec[1])

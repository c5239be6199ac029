"""The cache key of a jitted call, and flattening of arguments and results.

The key holds, per argument leaf, a tensor's shape, dtype and device (and which
earlier argument it is, when the same tensor is passed twice) or a plain
value's type with its exact value: floats of every type (Python, numpy, and
complex parts) by their bits, so 0.0 and -0.0 differ and a NaN equals only
itself; numpy scalars by their bytes; numpy arrays by their contents; ints and
strings by value; tuples (namedtuples too), lists and dicts walked leaf by leaf,
sets and frozensets as sets of such keys. Two values of different types never
share a key, as ``Cfg(2) == Cfg(2.0)`` would. Other hashable values are keyed
by type and ``==``; unhashable ones by identity (held so that no other object
takes their id). A new key means a new trace; the same key reuses the built
graph.
"""
from __future__ import annotations

import hashlib
import struct
from typing import Any, Dict, List, Tuple

import numpy as np

from ..device import device_of
from ..tensor import Tensor

__all__ = ["signature", "exact_key", "flatten_result", "unflatten_result"]

_DEVICE = "CPU"  # a numpy array's (a graph traced with GPU inputs holds constants on that GPU)
_F64 = struct.Struct("<d").pack
_C128 = struct.Struct("<dd").pack
_PLAIN = frozenset({int, str, bool, bytes, type(None)})  # == within one of these types is exact
_NP_FLOATS = frozenset({np.float16, np.float32, np.float64})
_NP_INTS = frozenset({np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64})


class _Same:
    """An argument keyed by identity; holding it keeps its id from being reused by another object (a
    freed array's id often is), which would otherwise find this object's graph."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: Any) -> bool:
        return type(other) is _Same and other.obj is self.obj


def exact_key(x: Any) -> Any:
    """A hashable key of ``x`` that equals another's only for the same type and the same exact value
    (see the module's docstring); a tensor (not an argument position here) is keyed by identity."""
    t = type(x)
    if t in _PLAIN:
        return (t, x)
    if t is float:
        return (t, _F64(x))
    if t in _NP_FLOATS:  # exact as a double (f16/f32 widen exactly), but a NaN's bits are its own
        f = float(x)
        return (t, _F64(f)) if f == f else (t, x.tobytes())
    if t in _NP_INTS:
        return (t, int(x))
    if isinstance(x, np.generic):  # other numpy scalars (complex, longdouble, datetime...) by their bytes
        return (t, x.dtype.str, x.tobytes())
    if isinstance(x, float):
        return (t, _F64(x))
    if isinstance(x, complex):
        return (t, _C128(x.real, x.imag))
    if isinstance(x, (tuple, list)):
        return (t, tuple(map(exact_key, x)))
    if isinstance(x, (frozenset, set)):
        return (t, frozenset(map(exact_key, x)))
    if isinstance(x, dict):
        return (t, tuple((exact_key(k), exact_key(v)) for k, v in x.items()))
    if isinstance(x, np.ndarray):  # by value: a graph keeps an array's contents as they were
        return ("nd", x.shape, x.dtype.str, hashlib.blake2b(np.ascontiguousarray(x).tobytes()).digest())
    if isinstance(x, Tensor):  # its == is elementwise
        return ("id", _Same(x))
    try:
        hash(x)
    except TypeError:
        return ("id", _Same(x))
    return (t, x)


def _walk(x: Any, tensors: List[Tensor], seen: Dict[int, int], key: List[Any]) -> None:
    t = type(x)
    if t in _PLAIN:  # the common leaves, inline
        key.append((t, x))
    elif t is float:
        key.append((t, _F64(x)))
    elif isinstance(x, Tensor):
        first = seen.get(id(x))
        if first is None:
            seen[id(x)] = len(tensors)
            tensors.append(x)
            a = x._data
            key.append((a.shape, a.dtype.str, _DEVICE if type(a) is np.ndarray else device_of(a)))
        else:
            key.append(("same", first))
    elif isinstance(x, (tuple, list)):  # namedtuples too: their tensors are inputs, their leaves exact
        key.append((t, len(x)))
        for y in x:
            _walk(y, tensors, seen, key)
    elif isinstance(x, dict):
        key.append((t, tuple(map(exact_key, x))))
        for y in x.values():
            _walk(y, tensors, seen, key)
    else:
        key.append(exact_key(x))


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
    """A spec of ``out``'s structure; its tensors appended to ``leaves``. Tuples, lists, namedtuples
    and dicts are walked (their tensors are graph outputs); anything else is returned as traced."""
    if isinstance(out, Tensor):
        leaves.append(out)
        return len(leaves) - 1
    t = type(out)
    if isinstance(out, (tuple, list)):
        kind = "fields" if isinstance(out, tuple) and hasattr(t, "_fields") else "items"
        return (kind, t, [flatten_result(o, leaves) for o in out])
    if isinstance(out, dict):
        return ("dict", t, list(out), [flatten_result(o, leaves) for o in out.values()])
    return ("const", out)


def unflatten_result(spec: Any, values: List[Any]) -> Any:
    """Rebuild a result from its spec and its tensors."""
    if type(spec) is int:
        return values[spec]
    kind = spec[0]
    if kind == "const":
        return spec[1]
    if kind == "items":
        return spec[1](unflatten_result(s, values) for s in spec[2])
    if kind == "fields":  # a namedtuple takes its fields as arguments
        return spec[1](*(unflatten_result(s, values) for s in spec[2]))
    return spec[1](zip(spec[2], (unflatten_result(s, values) for s in spec[3])))

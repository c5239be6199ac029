"""What a GRAPH_MODE trace of a cell reads besides its arguments: the cell tree's attributes.

``CellState(cell)`` is a snapshot, taken on every GRAPH_MODE call, of each
cell's instance attributes reached from ``cell``: plain values by type and
exact value (``jit.signature.exact_key``: floats by bits, containers walked),
tensors (Parameters too) and sub-cells by identity. It is one leaf of the jit
signature, so ``net.temperature = 100.0``, a swapped tensor attribute, a
flipped flag or a replaced sub-cell is a new key: a new trace, as eagerly the
next call would read the new value. A tensor attribute is keyed by identity
only: the graph holds it by reference and sees its in-place updates. So are
the module globals and class attributes that a cell's ``construct`` names
(its code's names, nested code included) and that held a value, not a
function, class or module, when the class was first snapshotted. What this
snapshot keys by identity only (a cell inside a plain list or dict attribute,
a plain object's fields, globals read by helper functions) the jit trace's
guards check (runtime/jit/guards.py).
"""
from __future__ import annotations

import struct
import types
from typing import Any, Dict, List, Tuple

from ..jit.signature import exact_key
from ..tensor import Tensor

__all__ = ["CellState"]

_F64 = struct.Struct("<d").pack
_PLAIN = frozenset({int, str, bool, type(None)})
_MISSING = object()
_SKIP = frozenset({"_params", "_cells", "_graph_jit"})  # bookkeeping (Parameters and cells are attributes too)


class CellState:
    """A hashable snapshot of a cell tree's attributes; equal only when every attribute is exactly equal.

    Tensors and cells are keyed by id and held (``held``): while a snapshot is a cache key, no other
    object can take the id of one it holds, so equal ids are the same object."""

    __slots__ = ("key", "held", "_hash")

    def __init__(self, cell: Any) -> None:
        key: List[Any] = []
        self.held: List[Any] = [cell]
        _snap(cell, key, self.held, {id(cell): 0})
        self.key = tuple(key)
        self._hash = hash(self.key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: Any) -> bool:
        return type(other) is CellState and other._hash == self._hash and other.key == self.key


def _snap(cell: Any, key: List[Any], held: List[Any], seen: Dict[int, int]) -> None:
    d = cell.__dict__
    cells = d["_cells"]
    key.append(tuple(d))  # the attribute names, in order (_graph_jit is one from Cell.__init__ on)
    for name, v in d.items():
        if name in _SKIP:
            continue
        t = type(v)
        if t in _PLAIN:
            key.append((t, v))
        elif t is float:
            key.append((t, _F64(v)))
        elif isinstance(v, Tensor):
            key.append(id(v))
            held.append(v)
        elif name in cells:
            first = seen.get(id(v))
            if first is None:  # by identity, then its own attributes
                seen[id(v)] = len(seen)
                key.append(("cell", id(v)))
                held.append(v)
                _snap(v, key, held, seen)
            else:
                key.append(("seen", first))
        else:
            key.append(exact_key(v))
    g, names, cls_names = _reads(type(cell))
    if names:
        key.append(tuple(exact_key(g.get(n, _MISSING)) for n in names))
    if cls_names:
        cls = type(cell)
        key.append(tuple(exact_key(getattr(cls, n, _MISSING)) for n in cls_names))


def _reads(cls: type) -> Tuple[Dict[str, Any], Tuple[str, ...], Tuple[str, ...]]:
    """(construct's globals, the global names it reads holding values, the class attributes it reads
    holding values), found once per class from construct's code and kept on the class itself (so it
    goes with the class)."""
    found = cls.__dict__.get("_graph_reads")
    if found is not None:
        return found
    fn = getattr(cls, "construct", None)
    code = getattr(fn, "__code__", None)
    g: Dict[str, Any] = getattr(fn, "__globals__", {})
    names: set = set()
    stack = [code] if code is not None else []
    while stack:
        c = stack.pop()
        names.update(c.co_names)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    found = (g, tuple(sorted(n for n in names if n in g and _is_value(g[n]))),
             tuple(sorted(n for n in names if _is_value(_class_attr(cls, n)))))
    type.__setattr__(cls, "_graph_reads", found)
    return found


def _class_attr(cls: type, name: str) -> Any:
    for k in cls.__mro__:
        if name in k.__dict__:
            return k.__dict__[name]
    return _MISSING


def _is_value(v: Any) -> bool:
    """A value a trace would fix (a number, a flag, a tensor...), not code or a namespace."""
    return v is not _MISSING and not callable(v) and not isinstance(v, (types.ModuleType, property,
                                                                         staticmethod, classmethod))

"""Writes into an existing tensor: ``x[i] = v``, ``x -= v`` (and ``+=``, ``*=``, ``/=``), ``ops.assign``.

The tensor keeps its identity (a Parameter stays the Parameter its Cell
registered), its dtype and its shape; its buffer is written and its version
goes up, so a recorded node that saved it reports the change at backward.

These writes are not recorded in the graph. While gradients are recorded a
write is refused when it would lose one: into a tensor that came out of a
recorded op (it has a node), or of a value that requires grad. A leaf such as
a Parameter may be updated in place at any time (an optimizer's step).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .. import device as _device
from ..autograd.grad_mode import _state
from ..tensor import Tensor
from ..call_rules import (NO_GRAD_VIEW_WRITE, OVERLAP_MESSAGE, PARTIAL_OVERLAP_MESSAGE, has_internal_overlap,
                          has_partial_overlap, no_grad_view_refused)
from .op_entry import breaks_trace
from ..versions import rebind

__all__ = ["setitem", "inplace_binary", "assign"]


def _value(value: Any, target: Tensor, what: str) -> Any:
    """The value to write into ``target``: a number as it is, anything else an array on target's device."""
    v = value._data if isinstance(value, Tensor) else value
    if isinstance(v, (bool, int, float)):
        return v
    return _device.like(v, target._data, f"{what}: the value")


@breaks_trace(lambda target, value, what, region=None, expand=False: f"{what} writes a tensor in place outside an "
                                                                    f"op, which a graph does not hold")
def _check_writable(target: Tensor, value: Any, what: str, region: Any = None, expand: bool = False) -> None:
    """Refuse a write torch refuses, or one that would lose a gradient: into elements that share memory
    (``region``: the elements written, all of ``target`` by default), from a value that shares part of
    their memory, into a view made under no_grad of a tensor that requires grad. Read-only memory
    (bytes, a memory map, an array its owner marked read-only) gets a private copy."""
    written = target._data if region is None else region
    if has_internal_overlap(written):  # torch's rule, before anything
        raise RuntimeError(f"{what}: {OVERLAP_MESSAGE}")
    v = value._data if isinstance(value, Tensor) else value
    if expand and isinstance(v, np.ndarray) and isinstance(written, np.ndarray):  # setitem: torch expands it first
        try:
            v = np.broadcast_to(v, written.shape)
        except ValueError:
            pass  # the write itself says why
    if isinstance(v, np.ndarray) and isinstance(written, np.ndarray) and has_partial_overlap(written, v, expand):
        raise RuntimeError(f"{what}: {PARTIAL_OVERLAP_MESSAGE}")
    if _state.enabled:
        if target._view_no_grad and no_grad_view_refused(target):  # torch's rule, as for a C++ op's write
            raise RuntimeError(f"{what}: {NO_GRAD_VIEW_WRITE}")
        if target._node is not None:
            raise RuntimeError(f"{what}: the tensor written is the output of a recorded op, and an in-place "
                               f"write would not be differentiated; build a new tensor (ops.where, "
                               f"ops.concat) or write under runtime.no_grad()")
        if isinstance(value, Tensor) and value.requires_grad:
            raise RuntimeError(f"{what}: the value written requires grad, and an in-place write does not "
                               f"record a gradient for it; write value.detach(), or build a new tensor "
                               f"(ops.where, ops.concat)")
    if not _device.writeable(target._data):  # read-only memory (bytes, a memory map, a user's flag): a copy
        if has_internal_overlap(target._data):  # a copy would leave the memory its elements share behind
            raise RuntimeError(f"{what}: the tensor written is read-only memory whose elements share memory; "
                               f"write a new tensor (t * 1)")
        rebind(target, target._data.copy())


def _written(target: Tensor) -> None:
    target._version += 1


def _region(arr: Any, index: Any) -> Any:
    """The elements ``arr[index] = v`` writes, as a view, for a basic index (ints, 0-d integer arrays,
    slices, None, Ellipsis: torch's copy_ into the view); None for an advanced one (all of ``arr`` is
    checked then, as torch's index_put_ deprecates writing an expanded tensor)."""
    items = index if isinstance(index, tuple) else (index,)
    basic = []
    for i in items:
        if isinstance(i, np.ndarray) and i.ndim == 0 and i.dtype.kind in "iu":
            i = int(i)
        if not (i is None or i is Ellipsis or isinstance(i, (int, np.integer, slice)) and not isinstance(i, bool)):
            return None
        basic.append(i)
    return arr[tuple(basic)] if isinstance(index, tuple) else arr[basic[0]]


def setitem(target: Tensor, index: Any, value: Any) -> None:
    """``target[index] = value`` in place (numpy's indexing and broadcasting rules)."""
    if isinstance(index, Tensor):
        index = index._data
    elif isinstance(index, tuple):
        index = tuple(i._data if isinstance(i, Tensor) else i for i in index)
    # the elements a basic index selects must not share memory (torch's copy_ into the view); with an
    # advanced index, no element of the tensor may (torch's index_put_ deprecates it)
    _check_writable(target, value, "Tensor.__setitem__", _region(target._data, index), expand=True)
    v = _value(value, target, "Tensor.__setitem__")
    arr = np.asarray(v) if isinstance(v, (bool, int, float)) else v
    if arr.dtype.kind == "f" and target._data.dtype.kind in "biu":
        raise TypeError(f"Tensor.__setitem__: cannot write {arr.dtype} values into a {target.dtype} tensor "
                        f"without losing the fraction; cast the value first")
    try:
        target._data[index] = v
    except ValueError as e:
        raise ValueError(f"Tensor.__setitem__: cannot write a value of shape {list(arr.shape)} into "
                         f"tensor[{index!r}] of a tensor of shape {list(target.shape)}: {e}") from None
    _written(target)


def inplace_binary(target: Tensor, other: Any, ufunc: Callable[..., Any], symbol: str) -> Tensor:
    """``target <symbol>= other`` in place: same object, dtype and shape; version bumped."""
    what = f"'{symbol}='"
    _check_writable(target, other, what)
    o = _value(other, target, what)
    if symbol == "/" and target._data.dtype.kind not in "fcV":
        raise TypeError(f"{what} on a {target.dtype} tensor would need a floating-point result; "
                        f"use x = x / y, or cast the tensor first")
    try:
        ufunc(target._data, o, out=target._data, casting="same_kind")
    except TypeError:  # numpy's UFuncTypeError: e.g. a float into an int tensor
        kind = "floating-point" if isinstance(other, float) or np.asarray(o).dtype.kind in "fV" else \
            "complex" if isinstance(other, complex) or np.asarray(o).dtype.kind == "c" else "other-typed"
        raise TypeError(f"{what}: a {kind} result cannot be written into a {target.dtype} tensor in place (as "
                        f"torch refuses it); use x = x {symbol} y to get a new tensor") from None
    except ValueError as e:
        oshape = list(np.shape(o))
        raise ValueError(f"{what}: a tensor of shape {list(target.shape)} cannot be updated in place with a "
                         f"value of shape {oshape}: the result would not keep its shape ({e})") from None
    _written(target)
    return target


def assign(variable: Tensor, value: Any) -> Tensor:
    """Write ``value`` (broadcast to ``variable``'s shape, cast to its dtype) into ``variable``; return it."""
    if not isinstance(variable, Tensor):
        raise TypeError(f"assign: variable must be a Parameter or Tensor, got {type(variable).__name__}")
    _check_writable(variable, value, "assign")
    v = _device.like(value._data if isinstance(value, Tensor) else value, variable._data, "assign: the value")
    try:
        np.copyto(variable._data, np.broadcast_to(v, variable.shape), casting="same_kind")
    except ValueError as e:
        raise ValueError(f"assign: a value of shape {list(v.shape)} does not fit a variable of shape "
                         f"{list(variable.shape)} ({e})") from None
    except TypeError as e:
        raise TypeError(f"assign: cannot write {v.dtype} values into a {variable.dtype} variable ({e})") from None
    _written(variable)
    return variable

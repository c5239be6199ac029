"""``ops.max`` / ``ops.min`` with MindSpore 2.x's signature: ``(values, indices)`` along ``axis``.

Thin wrappers over reduce_extra's ``amax``/``max_dim`` (whose rules give the
gradient); with ``axis=None`` the index is into the flattened tensor.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

from ..tensor import Tensor
from . import reduce_extra as _r
from .math import _one, reshape

__all__ = ["max", "min"]


def _whole(x: Tensor, value, index, keepdims: bool) -> Tuple[Tensor, Tensor]:
    v, i = value(x), index(x, None, keepdims)
    return (reshape(v, (1,) * x.ndim) if keepdims else v), i


def max(input: Any, axis: Optional[int] = None, keepdims: bool = False) -> Tuple[Tensor, Tensor]:  # noqa: A001,A002
    """(largest values, their int64 indices) along ``axis`` (of the whole tensor when None)."""
    x = _one(input)
    if axis is None:
        return _whole(x, _r.amax, _r.argmax, bool(keepdims))
    return _r.max_dim(x, axis, keepdims)


def min(input: Any, axis: Optional[int] = None, keepdims: bool = False) -> Tuple[Tensor, Tensor]:  # noqa: A001,A002
    """(smallest values, their int64 indices) along ``axis`` (of the whole tensor when None)."""
    x = _one(input)
    if axis is None:
        return _whole(x, _r.amin, _r.argmin, bool(keepdims))
    return _r.min_dim(x, axis, keepdims)

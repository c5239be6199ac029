"""Max and min: of a whole tensor, along a dim with indices (``max_dim``, ``argmax``, MindSpore's
``ops.max``/``ops.min``), and elementwise (``maximum``/``minimum``). Each forward beside its derivative
rules, as in math.py.

Gradient conventions (PyTorch's and MindSpore's): the max of a whole tensor
shares its gradient evenly among the elements equal to it; the max along a
dim sends it to the element whose index it returns; ``maximum(x, y)`` splits
it evenly where ``x == y``.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import numpy as np

from .. import device as _device
from ..tensor import Tensor
from .math import _norm_axis, _one, _pair, _real_only, cast, div, equal, greater, less, mul, not_equal, reshape
from .math import sum as _sum, where
from .primitive import Primitive, defvjp

__all__ = ["amax", "amin", "max_dim", "min_dim", "argmax", "argmin", "maximum", "minimum", "max", "min"]


def _const(arr: np.ndarray) -> Tensor:
    return Tensor._from_array(arr)


def _not_empty(x: Tensor, what: str) -> None:
    if x._data.dtype.kind == "c":
        _real_only(what, x)
    if x.size == 0:
        raise ValueError(f"{what} of an empty tensor (shape {list(x.shape)}) has no value")


# ---- the extreme of a whole tensor ------------------------------------------
# The rules below compute their masks with runtime ops, not numpy: under jit a rule is traced once and
# replayed, and a mask made of this call's values outside the ops would be replayed as a constant.
def _tie_share(x: Tensor, ans: Tensor) -> Tensor:
    """1/k at the k elements equal to the result, 0 elsewhere; a NaN result (never equal to itself) is
    shared by the NaN elements, as in torch."""
    hit = cast(where(not_equal(ans, ans), not_equal(x, x), equal(x, ans)), x.dtype)
    return div(hit, _sum(hit))


_amax = Primitive("amax", np.max)
defvjp(_amax, lambda g, ans, x: mul(g, _tie_share(x, ans)), reads_output=True, reads_inputs=(0,))
_amin = Primitive("amin", np.min)
defvjp(_amin, lambda g, ans, x: mul(g, _tie_share(x, ans)), reads_output=True, reads_inputs=(0,))


def amax(x: Any) -> Tensor:
    """The largest element (0-d)."""
    x = _one(x)
    _not_empty(x, "max")
    return _amax(x)


def amin(x: Any) -> Tensor:
    """The smallest element (0-d)."""
    x = _one(x)
    _not_empty(x, "min")
    return _amin(x)


# ---- the extreme along one dim, with its index -------------------------------
def _along(pick: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    def fn(x: np.ndarray, axis: int, keepdims: bool) -> np.ndarray:
        vals = np.take_along_axis(x, pick(x, axis=axis, keepdims=True), axis)
        return vals if keepdims else np.squeeze(vals, axis)
    return fn


def _pick_np(pick: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """The int64 index ``pick`` (argmax, argmin) gives along ``axis``, or into the flattened tensor (None)."""
    def fn(x: np.ndarray, axis: Optional[int], keepdims: bool) -> np.ndarray:
        xp = _device.array_module(x)
        if axis is None:
            idx = xp.asarray(pick(x.reshape(-1)), np.int64)  # CuPy's is a 0-d array
            return idx.reshape((1,) * x.ndim if keepdims else ())
        return xp.asarray(pick(x, axis=axis, keepdims=keepdims), np.int64)
    return fn


# the indices are ops too (recorded, traced by jit), with no gradient
_argmax_p = Primitive("argmax", _pick_np(np.argmax))
_argmin_p = Primitive("argmin", _pick_np(np.argmin))


def _picked_vjp(index: Primitive) -> Callable[..., Tensor]:
    def rule(g: Tensor, ans: Tensor, x: Tensor, axis: int, keepdims: bool) -> Tensor:
        at = index(x, axis=axis, keepdims=True)
        n = x.shape[axis]  # each position along the axis (a shape-only constant), compared with the index
        positions = _const(_device.array_module(x._data).arange(n).reshape(
            tuple(n if i == axis else 1 for i in range(x.ndim))))
        if not keepdims:
            g = reshape(g, tuple(1 if i == axis else s for i, s in enumerate(x.shape)))
        return where(equal(positions, at), g, 0)
    return rule


_max_dim = Primitive("max_dim", _along(np.argmax))
defvjp(_max_dim, _picked_vjp(_argmax_p), reads_output=False, reads_inputs=(0,))
_min_dim = Primitive("min_dim", _along(np.argmin))
defvjp(_min_dim, _picked_vjp(_argmin_p), reads_output=False, reads_inputs=(0,))


def _dim_op(x: Any, dim: Any, keepdim: Any, what: str) -> Tuple[Tensor, int, bool]:
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
        raise TypeError(f"{what}: dim must be an int, got {type(dim).__name__}")
    if not isinstance(keepdim, (bool, np.bool_)):
        raise TypeError(f"{what}: keepdim must be a bool, got {type(keepdim).__name__}")
    x = _one(x)
    if x._data.dtype.kind == "c":
        _real_only(what, x)
    axis = _norm_axis(dim, x.ndim)
    assert axis is not None
    if x.ndim and x.shape[axis[0]] == 0:
        raise ValueError(f"{what} along dim {int(dim)} of a tensor of shape {list(x.shape)}: that dim is empty")
    return x, axis[0], bool(keepdim)


def _with_index(prim: Primitive, index: Primitive, x: Any, dim: int, keepdim: bool,
                what: str) -> Tuple[Tensor, Tensor]:
    x, axis, keep = _dim_op(x, dim, keepdim, what)
    if x.ndim == 0:  # a scalar is its own extreme, at index 0
        return reshape(x, ()), _const(_device.array_module(x._data).zeros((), np.int64))
    return prim(x, axis=axis, keepdims=keep), index(x, axis=axis, keepdims=keep)


def max_dim(x: Any, dim: int, keepdim: bool = False) -> Tuple[Tensor, Tensor]:
    """(values, indices) of the largest elements along ``dim``; indices are int64."""
    return _with_index(_max_dim, _argmax_p, x, dim, keepdim, "max")


def min_dim(x: Any, dim: int, keepdim: bool = False) -> Tuple[Tensor, Tensor]:
    """(values, indices) of the smallest elements along ``dim``; indices are int64."""
    return _with_index(_min_dim, _argmin_p, x, dim, keepdim, "min")


def _arg(index: Primitive, x: Any, dim: Any, keepdim: bool, what: str) -> Tensor:
    if dim is None:
        x = _one(x)
        _not_empty(x, what)
        return index(x, axis=None, keepdims=bool(keepdim))
    x, axis, keep = _dim_op(x, dim, keepdim, what)
    if x.ndim == 0:
        return _const(_device.array_module(x._data).zeros((), np.int64))
    return index(x, axis=axis, keepdims=keep)


def argmax(input: Any, dim: Any = None, keepdim: bool = False) -> Tensor:  # noqa: A002 (MindSpore's name)
    """Index of the largest element (of the flattened tensor when ``dim`` is None); int64, not differentiable."""
    return _arg(_argmax_p, input, dim, keepdim, "argmax")


def argmin(input: Any, dim: Any = None, keepdim: bool = False) -> Tensor:  # noqa: A002 (MindSpore's name)
    """Index of the smallest element (of the flattened tensor when ``dim`` is None); int64, not differentiable."""
    return _arg(_argmin_p, input, dim, keepdim, "argmin")


# ---- elementwise maximum / minimum --------------------------------------------
def _share(loses: Callable[[Any, Any], Tensor], a: Tensor, b: Tensor, g: Tensor) -> Tensor:
    """The part of the gradient ``g`` that goes to ``a``: half on a tie, none where it loses, else all
    (torch's rule: where either is NaN, neither loses, and both get it)."""
    return where(equal(a, b), mul(g, 0.5), where(loses(a, b), 0, g))


_maximum = Primitive("maximum", np.maximum)
defvjp(_maximum,
       lambda g, ans, x, y: _share(less, x, y, g),
       lambda g, ans, x, y: _share(less, y, x, g), reads_output=False, reads_inputs=(0, 1))
_minimum = Primitive("minimum", np.minimum)
defvjp(_minimum,
       lambda g, ans, x, y: _share(greater, x, y, g),
       lambda g, ans, x, y: _share(greater, y, x, g), reads_output=False, reads_inputs=(0, 1))


def maximum(x: Any, y: Any) -> Tensor:
    """Elementwise larger of ``x`` and ``y`` (broadcast)."""
    x, y = _pair(x, y)
    _real_only("maximum", x, y)
    return _maximum(x, y)


def minimum(x: Any, y: Any) -> Tensor:
    """Elementwise smaller of ``x`` and ``y`` (broadcast)."""
    x, y = _pair(x, y)
    _real_only("minimum", x, y)
    return _minimum(x, y)


# ---- ops.max / ops.min: MindSpore 2.x's (values, indices) along ``axis`` -------
# with ``axis=None`` the index is into the flattened tensor. Defined last: they shadow the builtins.
def _whole(x: Tensor, value, index, keepdims: bool) -> Tuple[Tensor, Tensor]:
    v, i = value(x), index(x, None, keepdims)
    return (reshape(v, (1,) * x.ndim) if keepdims else v), i


def max(input: Any, axis: Optional[int] = None, keepdims: bool = False) -> Tuple[Tensor, Tensor]:  # noqa: A001,A002
    """(largest values, their int64 indices) along ``axis`` (of the whole tensor when None)."""
    x = _one(input)
    if axis is None:
        return _whole(x, amax, argmax, bool(keepdims))
    return max_dim(x, axis, keepdims)


def min(input: Any, axis: Optional[int] = None, keepdims: bool = False) -> Tuple[Tensor, Tensor]:  # noqa: A001,A002
    """(smallest values, their int64 indices) along ``axis`` (of the whole tensor when None)."""
    x = _one(input)
    if axis is None:
        return _whole(x, amin, argmin, bool(keepdims))
    return min_dim(x, axis, keepdims)

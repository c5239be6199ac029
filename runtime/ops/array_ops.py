"""Joining, splitting and indexing ops: ``concat``, ``stack``, ``split``, ``squeeze``,
``expand_dims``, ``gather``, ``one_hot`` (MindSpore's names and arguments).

Each forward sits beside its derivative rule, as in math.py. ``concat`` and
``stack`` take any number of tensors, so their primitive is made once per
input count (one rule per input). Slicing along one axis and its inverse
(padding with zeros) are primitives of their own, each the other's rule, so
``split`` and the gradients of ``concat``/``stack`` cost one node per piece.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import device as _device
from .. import dtypes as _dt
from ..tensor import Tensor
from .math import _norm_axis, _one, reshape
from .primitive import Primitive, defvjp

__all__ = ["concat", "cat", "stack", "split", "squeeze", "expand_dims", "gather", "one_hot"]


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {type(v).__name__}")
    return int(v)


def _axis(axis: Any, ndim: int, what: str) -> int:
    a = _norm_axis(_int(axis, f"{what}: axis"), ndim)
    assert a is not None
    return a[0]


def _index(ndim: int, axis: int, sl: Any) -> Tuple[Any, ...]:
    return (slice(None),) * axis + (sl,)


# ---- a slice along one axis, and its inverse ------------------------------------------
def _slice_np(x: np.ndarray, axis: int, start: int, stop: int) -> np.ndarray:
    return x[_index(x.ndim, axis, slice(start, stop))]


def _pad_np(g: np.ndarray, axis: int, start: int, shape: Tuple[int, ...]) -> np.ndarray:
    out = _device.array_module(g).zeros(shape, dtype=g.dtype)
    out[_index(g.ndim, axis, slice(start, start + g.shape[axis]))] = g
    return out


_slice_axis = Primitive("slice_axis", _slice_np)
_pad_axis = Primitive("pad_axis", _pad_np)
defvjp(_slice_axis, lambda g, ans, x, axis, start, stop: _pad_axis(g, axis=axis, start=start, shape=x.shape),
       reads_output=False, reads_inputs=())
defvjp(_pad_axis, lambda g, ans, x, axis, start, shape: _slice_axis(g, axis=axis, start=start,
                                                                     stop=start + x.shape[axis]),
       reads_output=False, reads_inputs=())


# ---- concat / stack ------------------------------------------------------------------------
def _tensors(tensors: Any, what: str) -> List[Tensor]:
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{what} takes a list or tuple of tensors, got {type(tensors).__name__}")
    if not tensors:
        raise ValueError(f"{what} needs at least one tensor, got an empty {type(tensors).__name__}")
    ts = [_one(t) for t in tensors]
    dtypes = {t._data.dtype for t in ts}
    if len(dtypes) > 1:
        raise TypeError(f"{what}: all tensors must have the same dtype, got "
                        f"{', '.join(str(t.dtype) for t in ts)}; cast them first")
    return ts


def _piece_rule(i: int):
    def rule(g: Tensor, ans: Tensor, *xs: Tensor, axis: int, offsets: Tuple[int, ...]) -> Tensor:
        return _slice_axis(g, axis=axis, start=offsets[i], stop=offsets[i + 1])
    return rule


def _stacked_rule(i: int):
    def rule(g: Tensor, ans: Tensor, *xs: Tensor, axis: int) -> Tensor:
        return reshape(_slice_axis(g, axis=axis, start=i, stop=i + 1), xs[i].shape)
    return rule


_CONCAT: Dict[int, Primitive] = {}
_STACK: Dict[int, Primitive] = {}


def _concat_prim(n: int) -> Primitive:
    prim = _CONCAT.get(n)
    if prim is None:
        prim = Primitive("concat", lambda *xs, axis, offsets: np.concatenate(xs, axis=axis))
        defvjp(prim, *[_piece_rule(i) for i in range(n)], reads_output=False, reads_inputs=())
        _CONCAT[n] = prim
    return prim


def _stack_prim(n: int) -> Primitive:
    prim = _STACK.get(n)
    if prim is None:
        prim = Primitive("stack", lambda *xs, axis: np.stack(xs, axis=axis))
        defvjp(prim, *[_stacked_rule(i) for i in range(n)], reads_output=False, reads_inputs=())
        _STACK[n] = prim
    return prim


def concat(tensors: Sequence[Any], axis: int = 0) -> Tensor:
    """The tensors joined along an existing ``axis``; all other dims must agree."""
    ts = _tensors(tensors, "concat")
    ndim = ts[0].ndim
    if ndim == 0:
        raise ValueError("concat: 0-d tensors cannot be joined along an axis; use stack")
    ax = _axis(axis, ndim, "concat")
    for k, t in enumerate(ts):
        if t.ndim != ndim or t.shape[:ax] + t.shape[ax + 1:] != ts[0].shape[:ax] + ts[0].shape[ax + 1:]:
            raise ValueError(f"concat along axis {ax}: tensor {k} has shape {list(t.shape)}, which does not "
                             f"match tensor 0's shape {list(ts[0].shape)} outside that axis")
    offsets = tuple(np.cumsum([0] + [t.shape[ax] for t in ts]).tolist())
    return _concat_prim(len(ts))(*ts, axis=ax, offsets=offsets)


cat = concat


def stack(tensors: Sequence[Any], axis: int = 0) -> Tensor:
    """The tensors (all of one shape) joined along a new ``axis``."""
    ts = _tensors(tensors, "stack")
    for k, t in enumerate(ts):
        if t.shape != ts[0].shape:
            raise ValueError(f"stack: tensor {k} has shape {list(t.shape)}, tensor 0 has {list(ts[0].shape)}; "
                             f"all must have the same shape")
    ax = _axis(axis, ts[0].ndim + 1, "stack")
    return _stack_prim(len(ts))(*ts, axis=ax)


# ---- split / squeeze / expand_dims ----------------------------------------------------------
def split(tensor: Any, split_size_or_sections: Union[int, Sequence[int]], axis: int = 0) -> Tuple[Tensor, ...]:
    """Pieces of ``tensor`` along ``axis``: of ``split_size_or_sections`` elements each (an int; the
    last may be smaller), or of the sizes listed (which must add up to the axis' length)."""
    x = _one(tensor)
    if x.ndim == 0:
        raise ValueError("split: a 0-d tensor has no axis to split")
    ax = _axis(axis, x.ndim, "split")
    n = x.shape[ax]
    if isinstance(split_size_or_sections, (list, tuple)):
        sizes = [_int(s, "split: each section size") for s in split_size_or_sections]
        if any(s < 0 for s in sizes) or sum(sizes) != n:
            raise ValueError(f"split: section sizes {sizes} must be non-negative and add up to {n}, the length "
                             f"of axis {ax}")
    else:
        size = _int(split_size_or_sections, "split: split_size_or_sections")
        if size <= 0:
            raise ValueError(f"split: split_size_or_sections must be positive, got {size}")
        sizes = [size] * (n // size) + ([n % size] if n % size else [])
    out, start = [], 0
    for s in sizes:
        out.append(_slice_axis(x, axis=ax, start=start, stop=start + s))
        start += s
    return tuple(out)


def squeeze(input: Any, axis: Optional[Union[int, Sequence[int]]] = None) -> Tensor:  # noqa: A002
    """``input`` without its size-1 dims (only those in ``axis`` when given; each must be size 1)."""
    x = _one(input)
    if axis is None:
        axes = {i for i, s in enumerate(x.shape) if s == 1}
    else:
        raw = [axis] if not isinstance(axis, (list, tuple)) else list(axis)
        axes = {_axis(a, x.ndim, "squeeze") for a in raw} if x.ndim else set()
        for a in sorted(axes):
            if x.shape[a] != 1:
                raise ValueError(f"squeeze: axis {a} of a tensor of shape {list(x.shape)} has size "
                                 f"{x.shape[a]}, not 1")
    return reshape(x, tuple(s for i, s in enumerate(x.shape) if i not in axes))


def expand_dims(input_x: Any, axis: int) -> Tensor:
    """``input_x`` with a dim of size 1 inserted at ``axis`` (-ndim-1 <= axis <= ndim)."""
    x = _one(input_x)
    a = _axis(axis, x.ndim + 1, "expand_dims")
    return reshape(x, x.shape[:a] + (1,) + x.shape[a:])


# ---- gather / one_hot ------------------------------------------------------------------------
def _take_back_np(g: np.ndarray, indices: np.ndarray, axis: int, shape: Tuple[int, ...]) -> np.ndarray:
    out = _device.array_module(g).zeros(shape, dtype=g.dtype)
    moved = np.moveaxis(out, axis, 0)  # a view: writes land in out
    gm = g.reshape(shape[:axis] + indices.shape + shape[axis + 1:])
    gm = np.moveaxis(gm.reshape(shape[:axis] + (indices.size,) + shape[axis + 1:]), axis, 0)
    _device.add_at(moved, indices.reshape(-1), gm)
    return out


_take = Primitive("gather", lambda x, indices, axis: np.take(x, indices, axis=axis))
_take_back = Primitive("gather_grad", _take_back_np)
defvjp(_take, lambda g, ans, x, indices, axis: _take_back(g, indices=indices, axis=axis, shape=x.shape),
       reads_output=False, reads_inputs=())
defvjp(_take_back, lambda g, ans, u, indices, axis, shape: _take(g, indices=indices, axis=axis),
       reads_output=False, reads_inputs=())


def _int_array(v: Any, what: str) -> np.ndarray:
    arr = v._data if isinstance(v, Tensor) else np.asarray(v)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{what} must be integers, got dtype {arr.dtype}")
    return arr


def gather(input_params: Any, input_indices: Any, axis: int, batch_dims: int = 0) -> Tensor:
    """Slices of ``input_params`` at ``input_indices`` along ``axis`` (numpy's ``take``); the gradient
    adds back into the positions taken (repeated indices accumulate). Only ``batch_dims=0``."""
    x = _one(input_params)
    if x.ndim == 0:
        raise ValueError("gather: input_params must have at least one dimension")
    ax = _axis(axis, x.ndim, "gather")
    if _int(batch_dims, "gather: batch_dims") != 0:
        raise NotImplementedError("gather: only batch_dims=0 is supported")
    idx = _device.like(_int_array(input_indices, "gather: input_indices"), x._data, "gather: input_indices")
    n = x.shape[ax]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"gather: input_indices must lie in [{-n}, {n}) for axis {ax} of length {n}, got "
                         f"values from {int(idx.min())} to {int(idx.max())}")
    return _take(x, indices=idx, axis=ax)


def one_hot(indices: Any, depth: int, on_value: Any = 1.0, off_value: Any = 0.0, axis: int = -1) -> Tensor:
    """A new axis of length ``depth`` at ``axis``: ``on_value`` at each index, ``off_value`` elsewhere.

    An index outside [0, depth) gives a row of ``off_value`` (as MindSpore's CPU kernel). The dtype is
    ``on_value``'s (float32 for a Python float). Not differentiable (the indices are integers).
    """
    idx = _int_array(indices, "one_hot: indices")
    d = _int(depth, "one_hot: depth")
    if d < 0:
        raise ValueError(f"one_hot: depth must be non-negative, got {d}")
    on = _device.like(on_value._data if isinstance(on_value, Tensor) else np.asarray(
        on_value, np.float32 if isinstance(on_value, float) else None), idx, "one_hot: on_value")
    off = _device.like(off_value._data if isinstance(off_value, Tensor) else off_value, idx,
                       "one_hot: off_value").astype(on.dtype, copy=False)
    _dt.from_numpy_dtype(on.dtype)
    hot = idx[..., None] == _device.array_module(idx).arange(d)  # on the indices' device
    out = np.where(hot, on, off).astype(on.dtype, copy=False)
    a = _axis(axis, idx.ndim + 1, "one_hot")
    # (np.ascontiguousarray converts its argument to numpy: it is not handed to CuPy)
    return Tensor._from_array(_device.array_module(out).ascontiguousarray(np.moveaxis(out, -1, a)))

"""``runtime.mint``: the functional namespace of MindSpore 2.x (``mint.sum(x, dim, keepdim)`` ...).

Every function is one of the runtime's differentiable ops under MindSpore
mint's name and signature (PyTorch-style: ``input``, ``dim``, ``keepdim``),
so scripts written against ``mindspore.mint`` run with only the import
changed. Gradients come from the same rules as ``runtime.ops``.
"""
from __future__ import annotations

import builtins
import numbers
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from .. import device as _device
from .. import dtypes as _dt
from ..ops import math as _m
from ..ops import minmax as _r
from ..ops.primitive import Primitive, defvjp
from ..tensor import Tensor
from . import nn  # noqa: F401  (mint.nn.functional)
from .nn.functional import relu, sigmoid, softmax, tanh

__all__ = [
    "sin", "cos", "exp", "log", "sqrt", "abs", "neg", "negative", "square", "add", "sub", "mul", "div", "divide",
    "pow", "matmul", "sum", "mean", "max", "min", "maximum", "minimum", "argmax", "argmin", "relu", "sigmoid",
    "tanh", "softmax", "reshape", "transpose", "permute", "flatten", "unsqueeze", "squeeze", "zeros", "ones",
    "zeros_like", "ones_like", "nn",
]

Dim = Optional[Union[int, Sequence[int]]]

# ---- elementwise -----------------------------------------------------------------
sin = _m.sin
cos = _m.cos
exp = _m.exp
log = _m.log
sqrt = _m.sqrt
abs = _m.abs  # noqa: A001
neg = _m.neg
negative = _m.neg
mul = _m.mul
pow = _m.pow  # noqa: A001  (mint.pow(input, exponent))
matmul = _m.matmul
maximum = _r.maximum
minimum = _r.minimum


def square(input: Any) -> Tensor:  # noqa: A002  (MindSpore's parameter names)
    """input * input."""
    return _m.mul(input, input)


def _scaled(other: Any, alpha: Any) -> Any:
    if not isinstance(alpha, Tensor) and alpha == 1:
        return other
    if isinstance(other, numbers.Number) and isinstance(alpha, numbers.Number):
        return other * alpha  # still a number: it takes input's dtype (a multiply of two would make float64)
    return _m.mul(other, alpha)


def add(input: Any, other: Any, *, alpha: Any = 1) -> Tensor:  # noqa: A002
    """input + alpha * other."""
    return _m.add(input, _scaled(other, alpha))


def sub(input: Any, other: Any, *, alpha: Any = 1) -> Tensor:  # noqa: A002
    """input - alpha * other."""
    return _m.sub(input, _scaled(other, alpha))


_ROUNDING = {"floor": np.floor, "trunc": np.trunc}


def _int_div(x: Any, y: Any, rounding: str) -> Any:
    """Integer quotient rounded down or toward zero, exact (the float route loses values past 2**53)."""
    if not y.all():
        raise ZeroDivisionError(f"div(rounding_mode={rounding!r}): integer division by zero")
    q = np.floor_divide(x, y)
    if rounding == "trunc":  # floor is one below trunc where the division is inexact and the signs differ
        q = q + ((np.remainder(x, y) != 0) & ((x < 0) != (y < 0))).astype(q.dtype)
    return q


def _rounded_div(rounding: str):
    def fn(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        if x.dtype.kind in "biu" and y.dtype.kind in "biu" and not (x.dtype.kind == y.dtype.kind == "b"):
            return _int_div(x, y, rounding)
        out = _ROUNDING[rounding](np.true_divide(x, y))
        return out.astype(np.result_type(x, y), copy=False)
    prim = Primitive(f"div_{rounding}", fn)
    defvjp(prim, lambda g, ans, x, y: _m.zeros_like(g), lambda g, ans, x, y: _m.zeros_like(g), reads_output=False,
           reads_inputs=())
    return prim


_DIV_ROUNDED = {mode: _rounded_div(mode) for mode in _ROUNDING}


def div(input: Any, other: Any, *, rounding_mode: Optional[str] = None) -> Tensor:  # noqa: A002
    """input / other; ``rounding_mode`` "floor" or "trunc" rounds the quotient (its gradient is zero)."""
    if rounding_mode is None:
        return _m.div(input, other)
    if rounding_mode not in _DIV_ROUNDED:
        raise ValueError(f"div: rounding_mode must be None, 'floor' or 'trunc', got {rounding_mode!r}")
    x, y = _m._pair(input, other)
    _m._real_only(f"div(rounding_mode={rounding_mode!r})", x, y)
    return _DIV_ROUNDED[rounding_mode](x, y)


divide = div


# ---- reductions ----------------------------------------------------------------------
def _cast(x: Any, dtype: Any) -> Tensor:
    x = _m._one(x)
    return x if dtype is None else _m.cast(x, dtype)


def _dims(dim: Dim) -> Dim:
    if isinstance(dim, Tensor):
        dim = dim.tolist()
    if dim is None or isinstance(dim, (int, np.integer)) and not isinstance(dim, bool):
        return dim
    if isinstance(dim, (tuple, list)) and builtins.all(isinstance(d, (int, np.integer)) and not isinstance(d, bool)
                                                        for d in dim):
        return tuple(dim)
    raise TypeError(f"dim must be None, an int, or a tuple or list of ints, got {dim!r}")


def _keep(keepdim: Any) -> bool:
    if not isinstance(keepdim, (bool, np.bool_)):
        raise TypeError(f"keepdim must be a bool, got {type(keepdim).__name__}")
    return bool(keepdim)


def sum(input: Any, dim: Dim = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:  # noqa: A001,A002
    """Sum over ``dim`` (an int, a tuple of ints, or None for all elements). Bools and integers of
    fewer than 64 bits sum as int64, as torch's and MindSpore's mint.sum (numpy: uint64 for uint8)."""
    x = _cast(input, dtype)
    if dtype is None and x._data.dtype.kind in "biu" and x._data.dtype.itemsize < 8:
        x = _m.cast(x, _dt.int64)
    out = _m.sum(x, _dims(dim), _keep(keepdim))
    return out if dtype is None or out._data.dtype == x._data.dtype else _m.cast(out, x.dtype)  # (numpy: int64)


def mean(input: Any, dim: Dim = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:  # noqa: A002
    """Mean over ``dim`` (an int, a tuple of ints, or None for all elements)."""
    return _m.mean(_cast(input, dtype), _dims(dim), _keep(keepdim))


def _extreme(input: Any, dim: Any, keepdim: Any, whole, along, elementwise, what: str):
    if isinstance(dim, Tensor):  # mint.max(input, other): the elementwise form
        return elementwise(input, dim)
    if dim is None:
        if keepdim is not False:
            raise ValueError(f"{what}(input) reduces every dim; keepdim applies only with a dim")
        return whole(input)
    return along(input, dim, keepdim)


def max(input: Any, dim: Any = None, keepdim: bool = False) -> Union[Tensor, Tuple[Tensor, Tensor]]:  # noqa: A001,A002
    """``max(input)``: the largest element; ``max(input, dim, keepdim=False)``: (values, indices) along
    ``dim``; ``max(input, other)``: ``maximum``."""
    return _extreme(input, dim, keepdim, _r.amax, _r.max_dim, _r.maximum, "max")


def min(input: Any, dim: Any = None, keepdim: bool = False) -> Union[Tensor, Tuple[Tensor, Tensor]]:  # noqa: A001,A002
    """``min(input)``: the smallest element; ``min(input, dim, keepdim=False)``: (values, indices) along
    ``dim``; ``min(input, other)``: ``minimum``."""
    return _extreme(input, dim, keepdim, _r.amin, _r.min_dim, _r.minimum, "min")


def argmax(input: Any, dim: Optional[int] = None, keepdim: bool = False) -> Tensor:  # noqa: A002
    """Index (int64) of the largest element, of the flattened input when ``dim`` is None."""
    return _r.argmax(input, dim, keepdim)


def argmin(input: Any, dim: Optional[int] = None, keepdim: bool = False) -> Tensor:  # noqa: A002
    """Index (int64) of the smallest element, of the flattened input when ``dim`` is None."""
    return _r.argmin(input, dim, keepdim)


# ---- shapes ----------------------------------------------------------------------------
def reshape(input: Any, shape: Sequence[int]) -> Tensor:  # noqa: A002
    """The same elements in ``shape`` (one entry may be -1)."""
    return _m.reshape(input, shape)


def _dim(d: Any, ndim: int, what: str) -> int:
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
        raise TypeError(f"{what}: dims must be ints, got {type(d).__name__}")
    axis = _m._norm_axis(d, ndim)
    assert axis is not None
    return axis[0]


def transpose(input: Any, dim0: int, dim1: int) -> Tensor:  # noqa: A002
    """``input`` with dims ``dim0`` and ``dim1`` swapped."""
    x = _m._one(input)
    a, b = _dim(dim0, x.ndim, "transpose"), _dim(dim1, x.ndim, "transpose")
    if x.ndim == 0:
        return _m.reshape(x, ())
    axes = list(range(x.ndim))
    axes[a], axes[b] = axes[b], axes[a]
    return _m.transpose(x, axes)


def permute(input: Any, dims: Sequence[int]) -> Tensor:  # noqa: A002
    """``input`` with its dims reordered as ``dims``."""
    return _m.transpose(input, dims)


def flatten(input: Any, start_dim: int = 0, end_dim: int = -1) -> Tensor:  # noqa: A002
    """Dims ``start_dim`` .. ``end_dim`` merged into one."""
    x = _m._one(input)
    if x.ndim == 0:
        return _m.reshape(x, (1,))
    s, e = _dim(start_dim, x.ndim, "flatten"), _dim(end_dim, x.ndim, "flatten")
    if s > e:
        raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    return _m.reshape(x, x.shape[:s] + (-1,) + x.shape[e + 1:])


def unsqueeze(input: Any, dim: int) -> Tensor:  # noqa: A002
    """``input`` with a dim of size 1 inserted at ``dim``."""
    x = _m._one(input)
    d = _dim(dim, x.ndim + 1, "unsqueeze")
    return _m.reshape(x, x.shape[:d] + (1,) + x.shape[d:])


def squeeze(input: Any, dim: Dim = None) -> Tensor:  # noqa: A002
    """``input`` without its dims of size 1 (only those in ``dim``, when given)."""
    x = _m._one(input)
    dims = _dims(dim)
    axes = _m._norm_axis(dims, x.ndim) if dims is not None else tuple(i for i, s in enumerate(x.shape) if s == 1)
    return _m.reshape(x, tuple(s for i, s in enumerate(x.shape) if not (i in axes and s == 1)))


# ---- constructors (record nothing) ---------------------------------------------------
def _size(size: Any) -> Tuple[int, ...]:
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        return (int(size),)
    if isinstance(size, (tuple, list)) and builtins.all(isinstance(s, (int, np.integer)) and not isinstance(s, bool)
                                                         for s in size):
        return tuple(int(s) for s in size)
    raise TypeError(f"size must be an int or a tuple or list of ints, got {size!r}")


def zeros(size: Any, *, dtype: Any = None) -> Tensor:
    """A tensor of zeros (float32 unless ``dtype`` says otherwise) on the context's device."""
    return Tensor._from_array(_device.on_default_device(np.zeros(_size(size), _dt.to_dtype(dtype or _dt.float32).np)))


def ones(size: Any, *, dtype: Any = None) -> Tensor:
    """A tensor of ones (float32 unless ``dtype`` says otherwise) on the context's device."""
    return Tensor._from_array(_device.on_default_device(np.ones(_size(size), _dt.to_dtype(dtype or _dt.float32).np)))


def zeros_like(input: Any, *, dtype: Any = None) -> Tensor:  # noqa: A002
    """Zeros in ``input``'s shape (and dtype, unless ``dtype`` says otherwise)."""
    return _cast(_m.zeros_like(input), dtype)


def ones_like(input: Any, *, dtype: Any = None) -> Tensor:  # noqa: A002
    """Ones in ``input``'s shape (and dtype, unless ``dtype`` says otherwise)."""
    return _cast(_m.ones_like(input), dtype)
